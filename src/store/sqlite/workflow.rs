//! Workflows in SQLite, inside the writer's transaction: creating them,
//! cancelling them, reading them back, and releasing steps. Triggers end an
//! archived job's step and count it down in its dependents
//! (migrations/sqlite/0017_workflows.sql); [`settle`] runs just before
//! every write transaction that may have ended a job commits, so the
//! transaction that ends a step's last dependency (by any path) releases
//! it, once (guarantee 14).

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::types::Json;
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use super::time_of;
use crate::store::audit::Change;
use crate::store::driver::WorkflowDriver;
use crate::store::enqueue::{Configs, PreparedJob, job_names, prepare_registered};
use crate::store::finish::Growth;
use crate::store::wait::PreparedWait;
use crate::store::workflow::{
    CreatedWorkflow, EndedDependency, IfFailed, PreparedWorkflow, Release, StepDependency, StepState, StoredWorkflow,
    Workflow, WorkflowCounts, WorkflowStep, release, step_error,
};
use crate::store::{EnqueueLimits, EnqueueParams, Enqueued, Error, Result};

/// Stores a workflow's steps (dependencies first) and dependencies in two
/// statements; its steps that wait for nothing are released by [`settle`]
/// as the write commits.
pub async fn write(conn: &mut SqliteConnection, workflow: PreparedWorkflow, now: i64) -> Result<i64> {
    let id: i64 = sqlx::query_scalar("INSERT INTO workflows (label, created_at) VALUES ($1, $2) RETURNING id")
        .bind(&workflow.label)
        .bind(now)
        .fetch_one(&mut *conn)
        .await?;
    let steps: Vec<serde_json::Value> = workflow
        .steps
        .iter()
        .map(|s| {
            serde_json::json!({"name": s.name, "job": s.job, "payload": s.payload, "queue": s.queue,
                               "priority": s.priority, "delay_ms": s.delay_ms, "pending": s.after.len(),
                               "wait": s.wait.as_ref().map(|_| "waiting")})
        })
        .collect();
    sqlx::query(
        "INSERT INTO workflow_steps (workflow_id, name, job, payload, queue, priority, delay_ms, pending, wait)
         SELECT $1, s.value ->> 'name', s.value ->> 'job', s.value -> 'payload', s.value ->> 'queue',
                s.value ->> 'priority', s.value ->> 'delay_ms', s.value ->> 'pending', s.value ->> 'wait'
         FROM json_each($2) s
         ORDER BY s.key",
    )
    .bind(id)
    .bind(Json(&steps))
    .execute(&mut *conn)
    .await?;
    // Ids by name, read back: joining the steps with a JSON list of names
    // lets SQLite's planner scan every step for every edge.
    let ids: HashMap<String, i64> = sqlx::query_as("SELECT name, id FROM workflow_steps WHERE workflow_id = $1")
        .bind(id)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect();
    let waits: Vec<(i64, &PreparedWait)> =
        workflow.steps.iter().filter_map(|s| s.wait.as_ref().map(|w| (ids[&s.name], w))).collect();
    super::wait::write(conn, &waits).await?;
    let edges: Vec<(i64, i64, &str)> = workflow
        .steps
        .iter()
        .flat_map(|s| {
            let (steps, ids) = (&workflow.steps, &ids);
            s.after.iter().map(move |&(dep, policy)| (ids[&s.name], ids[&steps[dep].name], policy.as_str()))
        })
        .collect();
    sqlx::query(
        "INSERT INTO workflow_edges (step_id, dep_id, if_failed)
         SELECT e.value ->> 0, e.value ->> 1, e.value ->> 2 FROM json_each($1) e",
    )
    .bind(Json(&edges))
    .execute(&mut *conn)
    .await?;
    Ok(id)
}

/// Adds the steps a run added to its own workflow, before its ending is
/// written in the same transaction, while its lease still matches: each
/// new step is stored as `STEP/NAME` and waits for the run's step and its
/// own `after`; each step waiting for the run's step, and not ended, waits
/// for every new step too, under the policy it has for the run's step (as
/// `grow_in` does on PostgreSQL).
pub async fn grow(conn: &mut SqliteConnection, growth: &Growth) -> Result<()> {
    let own: Option<(i64, i64, String)> = sqlx::query_as(
        "SELECT s.id, s.workflow_id, s.name
         FROM workflow_steps s JOIN jobs j ON j.id = s.job_id
         WHERE s.job_id = $1 AND j.lease_token = $2 AND s.ended_state IS NULL",
    )
    .bind(growth.job_id)
    .bind(growth.lease_token)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((own_id, workflow_id, own_name)) = own else {
        return Ok(());
    };
    let steps: Vec<serde_json::Value> = growth
        .steps
        .steps
        .iter()
        .map(|s| {
            serde_json::json!({"name": format!("{own_name}/{}", s.name), "job": s.job, "payload": s.payload,
                               "queue": s.queue, "priority": s.priority, "delay_ms": s.delay_ms,
                               "pending": 1 + s.after.len(), "wait": s.wait.as_ref().map(|_| "waiting")})
        })
        .collect();
    sqlx::query(
        "INSERT INTO workflow_steps (workflow_id, name, job, payload, queue, priority, delay_ms, pending, wait)
         SELECT $1, s.value ->> 'name', s.value ->> 'job', s.value -> 'payload', s.value ->> 'queue',
                s.value ->> 'priority', s.value ->> 'delay_ms', s.value ->> 'pending', s.value ->> 'wait'
         FROM json_each($2) s
         ORDER BY s.key",
    )
    .bind(workflow_id)
    .bind(Json(&steps))
    .execute(&mut *conn)
    .await?;
    let prefix = format!("{own_name}/");
    let ids: HashMap<String, i64> = sqlx::query_as(
        "SELECT name, id FROM workflow_steps WHERE workflow_id = $1 AND substr(name, 1, length($2)) = $2",
    )
    .bind(workflow_id)
    .bind(&prefix)
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .collect();
    let inserted: Vec<i64> = growth.steps.steps.iter().map(|s| ids[&format!("{prefix}{}", s.name)]).collect();
    // Armed when their dependencies have ended, the run's step among them.
    let waits: Vec<(i64, &PreparedWait)> =
        inserted.iter().zip(&growth.steps.steps).filter_map(|(id, s)| s.wait.as_ref().map(|w| (*id, w))).collect();
    super::wait::write(conn, &waits).await?;
    let dependents: Vec<(i64, String)> = sqlx::query_as(
        "SELECT s.id, e.if_failed
         FROM workflow_edges e JOIN workflow_steps s ON s.id = e.step_id
         WHERE e.dep_id = $1 AND s.ended_state IS NULL
         ORDER BY s.id",
    )
    .bind(own_id)
    .fetch_all(&mut *conn)
    .await?;
    let mut edges: Vec<(i64, i64, String)> = Vec::new();
    for (&new, step) in inserted.iter().zip(&growth.steps.steps) {
        edges.push((new, own_id, IfFailed::Cancel.as_str().to_string()));
        edges.extend(step.after.iter().map(|&(dep, policy)| (new, inserted[dep], policy.as_str().to_string())));
        edges.extend(dependents.iter().map(|(dependent, policy)| (*dependent, new, policy.clone())));
    }
    sqlx::query(
        "INSERT INTO workflow_edges (step_id, dep_id, if_failed)
         SELECT e.value ->> 0, e.value ->> 1, e.value ->> 2 FROM json_each($1) e",
    )
    .bind(Json(&edges))
    .execute(&mut *conn)
    .await?;
    let dependent_ids: Vec<i64> = dependents.iter().map(|(id, _)| *id).collect();
    sqlx::query("UPDATE workflow_steps SET pending = pending + $2 WHERE id IN (SELECT value FROM json_each($1))")
        .bind(Json(&dependent_ids))
        .bind(inserted.len() as i64)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The steps of a workflow released so far, with their jobs.
pub async fn released(conn: &mut SqliteConnection, id: i64) -> Result<BTreeMap<String, i64>> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT s.name, s.job_id FROM workflow_steps s
         WHERE s.workflow_id = $1 AND s.job_id IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM workflow_edges e WHERE e.step_id = s.id)",
    )
    .bind(id)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}

/// A step due for release.
struct Ready {
    id: i64,
    job: String,
    payload: Json<serde_json::Value>,
    queue: Option<String>,
    priority: Option<i16>,
    delay_ms: i64,
    cancelled: bool,
    /// `waiting` (its wait to arm), `ended` (its wait ended), or none.
    wait: Option<String>,
}

from_row!(sqlx::sqlite::SqliteRow, Ready { id, job, payload, queue, priority, delay_ms, cancelled, wait });

/// Releases every step whose dependencies have all ended, in the caller's
/// transaction, wave by wave: a step its policy ends without running
/// counts down its own dependents, which may be due next. Each is decided
/// by the shared rules ([`release`]); the steps that run go in with one
/// insert, or one by one when that insert is refused, so that an enqueue
/// refused (its type gone, a `raise` limit full, a `_deps` past the payload
/// limit) fails only its own step, with the reason, and never the
/// transaction (guarantee 13). Returns whether any job became available.
pub async fn settle(conn: &mut SqliteConnection, limits: &EnqueueLimits, now: i64) -> Result<bool> {
    let mut any_available = false;
    loop {
        // Through the partial index `workflow_steps_ready`: almost always
        // nothing. Named, since SQLite's planner would rather take the job
        // index's NULLs: every step not released (waiting for dependencies
        // or armed for an event), read at every write.
        let ready: Vec<Ready> = sqlx::query_as(
            "SELECT s.id, s.job, s.payload, s.queue, s.priority, s.delay_ms, w.cancelled_at IS NOT NULL AS cancelled,
                    s.wait
             FROM workflow_steps s INDEXED BY workflow_steps_ready JOIN workflows w ON w.id = s.workflow_id
             WHERE s.pending = 0 AND s.job_id IS NULL AND (s.wait IS NULL OR s.wait <> 'armed')
             ORDER BY s.id",
        )
        .fetch_all(&mut *conn)
        .await?;
        if ready.is_empty() {
            return Ok(any_available);
        }
        // Steps whose waits are to be armed go first: those that stay armed
        // leave the look; those whose waits ended at once come back ended.
        let to_arm: Vec<i64> = ready.iter().filter(|s| s.wait.as_deref() == Some("waiting")).map(|s| s.id).collect();
        if !to_arm.is_empty() {
            super::wait::arm(conn, &to_arm, now).await?;
            continue;
        }
        let waited: Vec<i64> = ready.iter().filter(|s| s.wait.is_some()).map(|s| s.id).collect();
        let mut waits = if waited.is_empty() { HashMap::new() } else { super::wait::ended_of(conn, &waited).await? };
        let configs = configs_of(conn, &ready).await?;
        let mut deps = dependencies_of(conn, &ready).await?;
        let mut running: Vec<(&Ready, PreparedJob)> = Vec::new();
        for step in &ready {
            let ended = deps.remove(&step.id).unwrap_or_default();
            let decided = release(&step.payload.0, &ended, step.cancelled);
            let decided = match waits.remove(&step.id) {
                Some(wait) => crate::store::workflow::apply(decided, &wait),
                None => decided,
            };
            let payload = match decided {
                Release::Run(payload) => payload,
                Release::Cancel(reason) => {
                    end_unrun(conn, step, "cancelled", &reason, now).await?;
                    continue;
                }
                Release::Fail(reason) => {
                    end_unrun(conn, step, "failed", &reason, now).await?;
                    continue;
                }
            };
            let params = EnqueueParams {
                queue: step.queue.clone(),
                priority: step.priority,
                delay_ms: Some(step.delay_ms.max(0) as u64),
                ..EnqueueParams::new(step.job.clone(), payload)
            };
            match prepare_registered(params, &configs, limits) {
                Ok(job) => running.push((step, job)),
                Err(error) => end_unrun(conn, step, "failed", &error.to_string(), now).await?,
            }
        }
        let jobs: Vec<&PreparedJob> = running.iter().map(|(_, job)| job).collect();
        let outcomes = insert_all_or_each(conn, &jobs, now).await?;
        let mut released: Vec<(i64, i64)> = Vec::new();
        for ((step, _), outcome) in running.iter().zip(outcomes) {
            match outcome {
                Ok(Enqueued::New(job_id)) => released.push((step.id, job_id)),
                Ok(Enqueued::Duplicate(claimant) | Enqueued::Replaced(claimant)) => {
                    let reason = format!("a duplicate of unique job {claimant}");
                    end_unrun(conn, step, "discarded", &reason, now).await?;
                }
                Err(reason) => end_unrun(conn, step, "failed", &reason, now).await?,
            }
        }
        any_available |= !released.is_empty();
        record_jobs(conn, &released, now).await?;
    }
}

/// The configurations of the ready steps' types; one that cannot be read
/// fails its steps (as unknown), not every write.
async fn configs_of(conn: &mut SqliteConnection, ready: &[Ready]) -> Result<Configs> {
    let mut configs = Configs::new();
    for name in job_names(ready.iter().map(|s| s.job.as_str())) {
        match super::fleet::job_types_get(&mut *conn, std::slice::from_ref(&name)).await {
            Ok(found) => configs.extend(found),
            Err(Error::CorruptJobType { .. } | Error::Decode(_)) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(configs)
}

/// A dependency as read: its dependent, name, ending, result and policy.
type DependencyRow = (i64, String, String, Option<Json<serde_json::Value>>, String);

/// How each ready step's dependencies ended, in dependency order, by step.
async fn dependencies_of(conn: &mut SqliteConnection, ready: &[Ready]) -> Result<HashMap<i64, Vec<EndedDependency>>> {
    let ids: Vec<i64> = ready.iter().map(|s| s.id).collect();
    let rows: Vec<DependencyRow> = sqlx::query_as(
        "SELECT e.step_id, d.name, d.ended_state, d.result, e.if_failed
         FROM workflow_edges e JOIN workflow_steps d ON d.id = e.dep_id
         WHERE e.step_id IN (SELECT value FROM json_each($1))
         ORDER BY e.step_id, d.id",
    )
    .bind(super::json_list(&ids))
    .fetch_all(&mut *conn)
    .await?;
    let mut deps: HashMap<i64, Vec<EndedDependency>> = HashMap::new();
    for (step, name, state, result, policy) in rows {
        deps.entry(step).or_default().push(EndedDependency {
            name,
            state,
            result: result.map(|r| r.0).unwrap_or_default(),
            if_failed: IfFailed::decode(&policy)?,
        });
    }
    Ok(deps)
}

/// Inserts the jobs of released steps in one insert under a savepoint; if
/// the database refuses it (one step's limit says `raise`), again one by
/// one, so a refusal fails only its own step.
async fn insert_all_or_each(
    conn: &mut SqliteConnection,
    jobs: &[&PreparedJob],
    now: i64,
) -> Result<Vec<std::result::Result<Enqueued, String>>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query("SAVEPOINT release_steps").execute(&mut *conn).await?;
    match super::job::insert(conn, jobs, now).await {
        Ok(outcomes) => {
            sqlx::query("RELEASE release_steps").execute(&mut *conn).await?;
            Ok(outcomes.into_iter().map(Ok).collect())
        }
        Err(error) if error.is_refusal() || matches!(error, Error::InvalidEnqueue(_)) => {
            sqlx::query("ROLLBACK TO release_steps").execute(&mut *conn).await?;
            sqlx::query("RELEASE release_steps").execute(&mut *conn).await?;
            let mut outcomes = Vec::with_capacity(jobs.len());
            for job in jobs {
                outcomes.push(super::batch::enqueue_alone(conn, job, now).await?);
            }
            Ok(outcomes)
        }
        Err(error) => Err(error),
    }
}

/// Records each released step's job; a job the gate discarded at once,
/// before it was its step's, ends its step from the archive as the
/// archive's trigger would.
async fn record_jobs(conn: &mut SqliteConnection, released: &[(i64, i64)], now: i64) -> Result<()> {
    if released.is_empty() {
        return Ok(());
    }
    // One statement a step: an UPDATE joined with a JSON list may scan every step for each.
    for &(step, job_id) in released {
        sqlx::query("UPDATE workflow_steps SET job_id = $2, released_at = $3 WHERE id = $1")
            .bind(step)
            .bind(job_id)
            .bind(now)
            .execute(&mut *conn)
            .await?;
    }
    let pairs = super::json_list(released);
    sqlx::query(
        "UPDATE workflow_steps
         SET ended_state = (SELECT a.state FROM archive a WHERE a.id = workflow_steps.job_id),
             result = (SELECT coalesce(a.errors -> '$[#-1].error', 'null') FROM archive a
                       WHERE a.id = workflow_steps.job_id),
             ended_at = (SELECT a.finished_at FROM archive a WHERE a.id = workflow_steps.job_id)
         WHERE id IN (SELECT r.value ->> 0 FROM json_each($1) r) AND ended_state IS NULL
           AND EXISTS (SELECT 1 FROM archive a WHERE a.id = workflow_steps.job_id)",
    )
    .bind(&pairs)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Ends a step that will not run: it becomes a job straight in the archive
/// with the reason as its error, and its dependents count it down.
async fn end_unrun(conn: &mut SqliteConnection, step: &Ready, state: &str, reason: &str, now: i64) -> Result<()> {
    let job_id = super::job::take_job_ids(conn, 1).await?;
    sqlx::query(
        "UPDATE workflow_steps
         SET job_id = $2, released_at = $3, ended_state = $4, result = json_quote($5), ended_at = $3
         WHERE id = $1",
    )
    .bind(step.id)
    .bind(job_id)
    .bind(now)
    .bind(state)
    .bind(reason)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                              enqueued_at, finished_at)
         SELECT $1, $2, coalesce($3, t.config ->> 'queue', 'default'), coalesce($4, t.config ->> 'priority', 0),
                $5, $6, 0, coalesce(t.config ->> 'max_attempts', 1),
                json_array(json_object('attempt', 0, 'at', $7, 'error', $8)), $9, $9
         FROM (SELECT 1) LEFT JOIN job_types t ON t.name = $2",
    )
    .bind(job_id)
    .bind(&step.job)
    .bind(&step.queue)
    .bind(step.priority)
    .bind(&step.payload)
    .bind(state)
    .bind(super::iso(now))
    .bind(reason)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Marks a workflow cancelled and ends its waiting steps; returns how many
/// and the jobs of its live steps, or none when it does not exist.
pub async fn cancel(conn: &mut SqliteConnection, id: i64, now: i64) -> Result<Option<(usize, Vec<i64>)>> {
    let found = sqlx::query("UPDATE workflows SET cancelled_at = coalesce(cancelled_at, $2) WHERE id = $1")
        .bind(id)
        .bind(now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if found == 0 {
        return Ok(None);
    }
    let waiting: Vec<Ready> = sqlx::query_as(
        "SELECT s.id, s.job, s.payload, s.queue, s.priority, s.delay_ms, 1 AS cancelled, s.wait
         FROM workflow_steps s
         WHERE s.workflow_id = $1 AND s.job_id IS NULL AND s.ended_state IS NULL
         ORDER BY s.id",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    for step in &waiting {
        end_unrun(conn, step, "cancelled", "its workflow was cancelled", now).await?;
    }
    super::wait::skip(conn, &waiting.iter().map(|s| s.id).collect::<Vec<_>>(), now).await?;
    let live: Vec<i64> = sqlx::query_scalar(
        "SELECT job_id FROM workflow_steps
         WHERE workflow_id = $1 AND ended_state IS NULL AND job_id IS NOT NULL ORDER BY id",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(Some((waiting.len(), live)))
}

/// Workflows newest first: one when `id` is given, else up to `limit`.
pub async fn list(pool: &SqlitePool, id: Option<i64>, limit: i64) -> Result<Vec<Workflow>> {
    let rows = sqlx::query(
        "SELECT w.id, w.label, w.created_at, w.cancelled_at,
                (SELECT max(s.ended_at) FROM workflow_steps s WHERE s.workflow_id = w.id) AS last_ended_at,
                (SELECT coalesce(json_group_object(c.state, c.n), '{}')
                 FROM (SELECT s.state, count(*) AS n FROM workflow_step_states s
                       WHERE s.workflow_id = w.id GROUP BY s.state) c) AS counts
         FROM workflows w
         WHERE $1 IS NULL OR w.id = $1
         ORDER BY w.id DESC
         LIMIT $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(workflow_of).collect()
}

fn workflow_of(row: &SqliteRow) -> Result<Workflow> {
    let by_state: BTreeMap<String, i64> = row.try_get::<Json<BTreeMap<String, i64>>, _>("counts")?.0;
    Ok(Workflow::from(StoredWorkflow {
        id: row.try_get("id")?,
        label: row.try_get("label")?,
        created_at: time_of(row.try_get("created_at")?),
        cancelled_at: row.try_get::<Option<i64>, _>("cancelled_at")?.map(time_of),
        last_ended_at: row.try_get::<Option<i64>, _>("last_ended_at")?.map(time_of),
        counts: WorkflowCounts { total: by_state.values().sum(), by_state },
    }))
}

/// One workflow with its steps in dependency order.
pub async fn get(pool: &SqlitePool, id: i64) -> Result<Option<Workflow>> {
    let Some(mut workflow) = list(pool, Some(id), 1).await?.pop() else {
        return Ok(None);
    };
    let rows = sqlx::query(
        "SELECT s.id, s.name, s.job, s.job_id, s.state, s.ended_state, s.result, s.ended_at
         FROM workflow_step_states s WHERE s.workflow_id = $1 ORDER BY s.id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let edges: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT e.step_id, d.name, e.if_failed
         FROM workflow_edges e JOIN workflow_steps d ON d.id = e.dep_id
         WHERE d.workflow_id = $1 ORDER BY e.step_id, d.id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let mut waits = super::wait::shown(pool, id).await?;
    let mut after: HashMap<i64, Vec<StepDependency>> = HashMap::new();
    for (step, dep, policy) in edges {
        after.entry(step).or_default().push(StepDependency { step: dep, if_failed: IfFailed::decode(&policy)? });
    }
    workflow.steps = rows
        .iter()
        .map(|row| {
            let ended_state: Option<String> = row.try_get("ended_state")?;
            let result: Option<Json<serde_json::Value>> = row.try_get("result")?;
            let step_id: i64 = row.try_get("id")?;
            Ok(WorkflowStep {
                name: row.try_get("name")?,
                job: row.try_get("job")?,
                job_id: row.try_get("job_id")?,
                state: StepState::decode(row.try_get("state")?)?,
                after: after.remove(&step_id).unwrap_or_default(),
                error: step_error(ended_state.as_deref(), result.map(|r| r.0)),
                ended_at: row.try_get::<Option<i64>, _>("ended_at")?.map(time_of),
                wait: waits.remove(&step_id),
            })
        })
        .collect::<Result<_>>()?;
    Ok(Some(workflow))
}

/// Deletes workflows whose every step ended before `cutoff` (the archive's
/// retention), at most `limit`: never one with a step still live.
pub async fn prune(conn: &mut SqliteConnection, cutoff: i64, limit: i64) -> Result<()> {
    let done: Vec<i64> = sqlx::query_scalar(
        "SELECT w.id FROM workflows w
         WHERE w.created_at < $1
           AND NOT EXISTS (SELECT 1 FROM workflow_steps s WHERE s.workflow_id = w.id AND s.ended_state IS NULL)
           AND (SELECT max(s.ended_at) FROM workflow_steps s WHERE s.workflow_id = w.id) < $1
         ORDER BY w.id LIMIT $2",
    )
    .bind(cutoff)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    let ids = super::json_list(&done);
    for table in [
        "DELETE FROM workflow_edges WHERE step_id IN
             (SELECT id FROM workflow_steps WHERE workflow_id IN (SELECT value FROM json_each($1)))",
        "DELETE FROM workflow_steps WHERE workflow_id IN (SELECT value FROM json_each($1))",
        "DELETE FROM workflows WHERE id IN (SELECT value FROM json_each($1))",
    ] {
        sqlx::query(table).bind(&ids).execute(&mut *conn).await?;
    }
    Ok(())
}

#[async_trait]
impl WorkflowDriver for SqliteStore {
    async fn workflow_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<()> {
        let cutoff = super::encode::ms_or_now(now) - (retention_secs * 1000.0) as i64;
        self.write_with(async |tx| prune(tx, cutoff, limit).await).await
    }

    async fn workflow_write(&self, workflow: PreparedWorkflow) -> Result<CreatedWorkflow> {
        let mut tx = self.write().await?;
        let id = write(&mut tx, workflow, now_ms()).await?;
        let available = settle(&mut tx, &self.limits, now_ms()).await?;
        let released = released(&mut tx, id).await?;
        tx.commit().await?;
        self.announce(available);
        Ok(CreatedWorkflow { id, released })
    }

    async fn workflow_get(&self, id: i64) -> Result<Option<Workflow>> {
        get(&self.reader, id).await
    }

    async fn workflow_list(&self, limit: i64) -> Result<Vec<Workflow>> {
        list(&self.reader, None, limit).await
    }

    async fn workflow_cancel(&self, change: &Change<'_>, id: i64) -> Result<Option<(usize, Vec<i64>)>> {
        self.write_with(async |tx| {
            let cancelled = cancel(tx, id, now_ms()).await?;
            let outcome = crate::store::workflow::cancel_outcome(
                cancelled.as_ref().map_or(0, |(waiting, _)| *waiting as i64),
                cancelled.as_ref().map(|(_, live)| live.as_slice()),
            );
            super::audit::write(tx, change, &outcome, 1).await?;
            Ok(cancelled)
        })
        .await
    }

    async fn workflow_of_job(&self, job_id: i64) -> Result<Option<(i64, String)>> {
        Ok(sqlx::query_as("SELECT workflow_id, name FROM workflow_steps WHERE job_id = $1")
            .bind(job_id)
            .fetch_optional(&self.reader)
            .await?)
    }
}
