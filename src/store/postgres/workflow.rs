//! Workflows in PostgreSQL: creating them (their first steps released in
//! the same transaction), cancelling them, and reading them back. Releasing
//! a step when its last dependency ends is the archive's trigger
//! (migrations/postgres/0023_workflows.sql), so every path that ends a job
//! releases its dependents in the transaction that ends it (guarantee 14).

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Row};

use super::PgStore;
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::driver::WorkflowDriver;
use crate::store::finish::Growth;
use crate::store::wait::{PreparedWait, StepWait};
use crate::store::workflow::{
    CreatedWorkflow, IfFailed, PreparedWorkflow, StepDependency, StepState, StoredWorkflow, Workflow, WorkflowCounts,
    WorkflowStep,
};

/// Stores a workflow's steps and dependencies and releases the steps that
/// wait for nothing, all in one transaction.
pub async fn write(pool: &PgPool, workflow: PreparedWorkflow) -> Result<CreatedWorkflow> {
    let mut tx = pool.begin().await?;
    let work = write_in(&mut tx, workflow).await;
    super::commit_or_roll_back(tx, work).await
}

pub(super) async fn write_in(conn: &mut PgConnection, workflow: PreparedWorkflow) -> Result<CreatedWorkflow> {
    let id: i64 = sqlx::query_scalar("INSERT INTO jobhost.workflows (label) VALUES ($1) RETURNING id")
        .bind(&workflow.label)
        .fetch_one(&mut *conn)
        .await?;
    let steps = &workflow.steps;
    let inserted: Vec<(i64, String)> = sqlx::query_as(
        "INSERT INTO jobhost.workflow_steps (workflow_id, name, job, payload, queue, priority, delay_ms, pending, wait)
         SELECT $1, s.name, s.job, s.payload, s.queue, s.priority, s.delay_ms, s.pending,
                CASE WHEN s.waits THEN 'waiting' END
         FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::text[], $6::int2[], $7::int8[], $8::int4[], $9::bool[])
             AS s(name, job, payload, queue, priority, delay_ms, pending, waits)
         RETURNING id, name",
    )
    .bind(id)
    .bind(steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>())
    .bind(steps.iter().map(|s| s.job.as_str()).collect::<Vec<_>>())
    .bind(steps.iter().map(|s| Json(&s.payload)).collect::<Vec<_>>())
    .bind(steps.iter().map(|s| s.queue.as_deref()).collect::<Vec<_>>())
    .bind(steps.iter().map(|s| s.priority).collect::<Vec<_>>())
    .bind(steps.iter().map(|s| s.delay_ms).collect::<Vec<_>>())
    .bind(steps.iter().map(|s| s.after.len() as i32).collect::<Vec<_>>())
    .bind(steps.iter().map(|s| s.wait.is_some()).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    let by_name: HashMap<String, i64> = inserted.into_iter().map(|(step, name)| (name, step)).collect();
    let step_ids: Vec<i64> = steps.iter().map(|s| by_name[&s.name]).collect();
    let waits: Vec<(i64, &PreparedWait)> =
        step_ids.iter().zip(steps).filter_map(|(id, s)| s.wait.as_ref().map(|w| (*id, w))).collect();
    write_waits(conn, &waits).await?;
    let (mut dependents, mut deps, mut policies) = (Vec::new(), Vec::new(), Vec::new());
    for (step, prepared) in step_ids.iter().zip(steps) {
        for &(dep, policy) in &prepared.after {
            dependents.push(*step);
            deps.push(step_ids[dep]);
            policies.push(policy.as_str());
        }
    }
    sqlx::query(
        "INSERT INTO jobhost.workflow_edges (step_id, dep_id, if_failed)
         SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[])",
    )
    .bind(&dependents)
    .bind(&deps)
    .bind(&policies)
    .execute(&mut *conn)
    .await?;
    let roots: Vec<i64> = step_ids.iter().zip(steps).filter(|(_, s)| s.after.is_empty()).map(|(id, _)| *id).collect();
    // A root that ends at once (a duplicate, a refused enqueue) counts down its dependents too.
    sqlx::query("SELECT jobhost.workflow_steps_ended(jobhost.workflow_release($1))")
        .bind(&roots)
        .execute(&mut *conn)
        .await?;
    let released: Vec<(String, i64)> = sqlx::query_as(
        "SELECT name, job_id FROM jobhost.workflow_steps WHERE id = ANY($1) AND job_id IS NOT NULL ORDER BY id",
    )
    .bind(&roots)
    .fetch_all(&mut *conn)
    .await?;
    Ok(CreatedWorkflow { id, released: released.into_iter().collect() })
}

/// Stores the waits of the steps that have one (armed later, when their
/// dependencies have ended: `jobhost.workflow_waits_arm`).
async fn write_waits(conn: &mut PgConnection, waits: &[(i64, &PreparedWait)]) -> Result<()> {
    if waits.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO jobhost.workflow_waits
             (step_id, key, match, match_one, sleep_ms, until, timeout_ms, on_timeout, lookback_ms, match_later)
         SELECT w.step_id, w.key, w.match, jobhost.match_one(w.match), w.sleep_ms, w.until, w.timeout_ms,
                w.on_timeout, w.lookback_ms, w.match_later
         FROM unnest($1::int8[], $2::text[], $3::jsonb[], $4::int8[], $5::timestamptz[], $6::int8[],
                     $7::text[], $8::int8[], $9::jsonb[])
             AS w(step_id, key, match, sleep_ms, until, timeout_ms, on_timeout, lookback_ms, match_later)",
    )
    .bind(waits.iter().map(|(id, _)| *id).collect::<Vec<_>>())
    .bind(waits.iter().map(|(_, w)| w.key.as_deref()).collect::<Vec<_>>())
    .bind(waits.iter().map(|(_, w)| Json(&w.matching)).collect::<Vec<_>>())
    .bind(waits.iter().map(|(_, w)| w.sleep_ms).collect::<Vec<_>>())
    .bind(waits.iter().map(|(_, w)| w.until).collect::<Vec<_>>())
    .bind(waits.iter().map(|(_, w)| w.timeout_ms).collect::<Vec<_>>())
    .bind(waits.iter().map(|(_, w)| w.on_timeout.as_str()).collect::<Vec<_>>())
    .bind(waits.iter().map(|(_, w)| w.lookback_ms).collect::<Vec<_>>())
    .bind(waits.iter().map(|(_, w)| w.match_later.as_ref().map(Json)).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Adds the steps a run added to its own workflow, in the transaction
/// that is about to archive the run, while its lease still matches (the
/// caller holds its job row, `jobhost.lock_for_ending`): one call of
/// `jobhost.workflow_grow` (functions/workflow_grow.sql), which stores each
/// new step as `STEP/NAME` waiting for the run's step and its own `after`,
/// and makes each step waiting for the run's step, and not ended, wait for
/// every new step too. The archive's count-down that follows then finds
/// them in place, so no dependent is released before the new steps end.
pub(super) async fn grow_in(conn: &mut PgConnection, growth: &Growth) -> Result<()> {
    let steps = &growth.steps.steps;
    let (mut inner_steps, mut inner_deps, mut inner_policies) = (Vec::new(), Vec::new(), Vec::new());
    for (position, step) in steps.iter().enumerate() {
        for &(dep, policy) in &step.after {
            // 1-based, as SQL arrays are.
            inner_steps.push(position as i32 + 1);
            inner_deps.push(dep as i32 + 1);
            inner_policies.push(policy.as_str());
        }
    }
    sqlx::query("SELECT jobhost.workflow_grow($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
        .bind(growth.job_id)
        .bind(growth.lease_token)
        .bind(steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>())
        .bind(steps.iter().map(|s| s.job.as_str()).collect::<Vec<_>>())
        .bind(steps.iter().map(|s| Json(&s.payload)).collect::<Vec<_>>())
        .bind(steps.iter().map(|s| s.queue.as_deref()).collect::<Vec<_>>())
        .bind(steps.iter().map(|s| s.priority).collect::<Vec<_>>())
        .bind(steps.iter().map(|s| s.delay_ms).collect::<Vec<_>>())
        .bind(&inner_steps)
        .bind(&inner_deps)
        .bind(&inner_policies)
        .execute(&mut *conn)
        .await?;
    grow_waits(conn, growth).await
}

/// Marks the grown steps that wait and stores their waits, armed when
/// their dependencies have ended (the run's step among them, so none is
/// armed before this transaction archives the run). Only while the run's
/// lease matches, as `jobhost.workflow_grow` checks: a stale completion
/// marks no step another run of the job grew.
async fn grow_waits(conn: &mut PgConnection, growth: &Growth) -> Result<()> {
    let steps = &growth.steps.steps;
    if steps.iter().all(|s| s.wait.is_none()) {
        return Ok(());
    }
    let names: Vec<&str> = steps.iter().filter(|s| s.wait.is_some()).map(|s| s.name.as_str()).collect();
    let marked: Vec<(i64, String)> = sqlx::query_as(
        "UPDATE jobhost.workflow_steps s SET wait = 'waiting'
         FROM jobhost.workflow_steps own JOIN jobhost.jobs j ON j.id = own.job_id
         WHERE own.job_id = $1 AND j.lease_token = $3 AND own.ended_state IS NULL
           AND s.workflow_id = own.workflow_id
           AND s.name = ANY (SELECT own.name || '/' || n FROM unnest($2::text[]) n)
           AND s.job_id IS NULL AND s.wait IS NULL
         RETURNING s.id, substr(s.name, length(own.name) + 2)",
    )
    .bind(growth.job_id)
    .bind(&names)
    .bind(growth.lease_token)
    .fetch_all(&mut *conn)
    .await?;
    let by_name: HashMap<String, i64> = marked.into_iter().map(|(id, name)| (name, id)).collect();
    let waits: Vec<(i64, &PreparedWait)> =
        steps.iter().filter_map(|s| Some((*by_name.get(&s.name)?, s.wait.as_ref()?))).collect();
    write_waits(conn, &waits).await
}

/// Workflows newest first: one when `id` is given, else up to `limit`.
pub async fn list(pool: &PgPool, id: Option<i64>, limit: i64) -> Result<Vec<Workflow>> {
    let rows = sqlx::query(
        "SELECT w.id, w.label, w.created_at, w.cancelled_at,
                (SELECT max(s.ended_at) FROM jobhost.workflow_steps s WHERE s.workflow_id = w.id) AS last_ended_at,
                (SELECT coalesce(jsonb_object_agg(c.state, c.n), '{}')
                 FROM (SELECT s.state, count(*) AS n FROM jobhost.workflow_step_states s
                       WHERE s.workflow_id = w.id GROUP BY s.state) c) AS counts
         FROM jobhost.workflows w
         WHERE $1::bigint IS NULL OR w.id = $1
         ORDER BY w.id DESC
         LIMIT $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(workflow_of).collect()
}

fn workflow_of(row: &PgRow) -> Result<Workflow> {
    let by_state: BTreeMap<String, i64> = row.try_get::<Json<BTreeMap<String, i64>>, _>("counts")?.0;
    Ok(Workflow::from(StoredWorkflow {
        id: row.try_get("id")?,
        label: row.try_get("label")?,
        created_at: row.try_get("created_at")?,
        cancelled_at: row.try_get("cancelled_at")?,
        last_ended_at: row.try_get("last_ended_at")?,
        counts: WorkflowCounts { total: by_state.values().sum(), by_state },
    }))
}

/// One workflow with its steps in dependency order.
pub async fn get(pool: &PgPool, id: i64) -> Result<Option<Workflow>> {
    let Some(mut workflow) = list(pool, Some(id), 1).await?.pop() else {
        return Ok(None);
    };
    let rows = sqlx::query(
        "SELECT s.name, s.job, s.job_id, s.state, s.ended_state, s.result, s.ended_at,
                coalesce((SELECT jsonb_agg(jsonb_build_array(d.name, e.if_failed) ORDER BY d.id)
                          FROM jobhost.workflow_edges e JOIN jobhost.workflow_steps d ON d.id = e.dep_id
                          WHERE e.step_id = s.id), '[]') AS after,
                (SELECT to_jsonb(w) FROM jobhost.workflow_waits w WHERE w.step_id = s.id) AS wait
         FROM jobhost.workflow_step_states s
         WHERE s.workflow_id = $1
         ORDER BY s.id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    workflow.steps = rows.iter().map(step_of).collect::<Result<_>>()?;
    Ok(Some(workflow))
}

fn step_of(row: &PgRow) -> Result<WorkflowStep> {
    let ended_state: Option<String> = row.try_get("ended_state")?;
    let result: Option<Json<serde_json::Value>> = row.try_get("result")?;
    let ended_at: Option<DateTime<Utc>> = row.try_get("ended_at")?;
    let after: Vec<(String, String)> = row.try_get::<Json<Vec<(String, String)>>, _>("after")?.0;
    Ok(WorkflowStep {
        name: row.try_get("name")?,
        job: row.try_get("job")?,
        job_id: row.try_get("job_id")?,
        state: StepState::decode(row.try_get("state")?)?,
        after: after
            .into_iter()
            .map(|(step, policy)| Ok(StepDependency { step, if_failed: IfFailed::decode(&policy)? }))
            .collect::<Result<_>>()?,
        error: crate::store::workflow::step_error(ended_state.as_deref(), result.map(|r| r.0)),
        ended_at,
        wait: row.try_get::<Option<Json<StepWait>>, _>("wait")?.map(|w| w.0),
    })
}

/// Marks a workflow cancelled and ends its waiting steps; returns how many
/// and the jobs of its live steps, or none when it does not exist.
pub async fn cancel(pool: &PgPool, change: &Change<'_>, id: i64) -> Result<Option<(usize, Vec<i64>)>> {
    let mut tx = pool.begin().await?;
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobhost.workflow_steps WHERE workflow_id = $1 AND job_id IS NULL AND ended_state IS NULL",
    )
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    let live: Option<Vec<i64>> =
        sqlx::query_scalar("SELECT jobhost.workflow_cancel($1)").bind(id).fetch_one(&mut *tx).await?;
    super::audit::write(&mut tx, change, &crate::store::workflow::cancel_outcome(waiting, live.as_deref()), 1).await?;
    tx.commit().await?;
    Ok(live.map(|live| (waiting as usize, live)))
}

/// The workflow and step a job is, if it is one.
pub async fn of_job(pool: &PgPool, job_id: i64) -> Result<Option<(i64, String)>> {
    Ok(sqlx::query_as("SELECT workflow_id, name FROM jobhost.workflow_steps WHERE job_id = $1")
        .bind(job_id)
        .fetch_optional(pool)
        .await?)
}

/// Deletes workflows whose every step ended before `cutoff` (the archive's
/// retention), at most `limit`: never one with a step still live.
pub async fn prune(pool: &PgPool, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM jobhost.workflows WHERE id IN (
             SELECT w.id FROM jobhost.workflows w
             WHERE w.created_at < coalesce($1, now()) - $2 * interval '1 second'
               AND NOT EXISTS (SELECT 1 FROM jobhost.workflow_steps s
                               WHERE s.workflow_id = w.id AND s.ended_state IS NULL)
               AND (SELECT max(s.ended_at) FROM jobhost.workflow_steps s WHERE s.workflow_id = w.id)
                   < coalesce($1, now()) - $2 * interval '1 second'
             ORDER BY w.id LIMIT $3)",
    )
    .bind(now)
    .bind(retention_secs)
    .bind(limit)
    .execute(pool)
    .await?
    .rows_affected())
}

#[async_trait]
impl WorkflowDriver for PgStore {
    async fn workflow_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<()> {
        prune(&self.sweeps, now, retention_secs, limit).await.map(|_| ())
    }

    async fn workflow_write(&self, workflow: PreparedWorkflow) -> Result<CreatedWorkflow> {
        write(&self.pool, workflow).await
    }

    async fn workflow_get(&self, id: i64) -> Result<Option<Workflow>> {
        get(&self.pool, id).await
    }

    async fn workflow_list(&self, limit: i64) -> Result<Vec<Workflow>> {
        list(&self.pool, None, limit).await
    }

    async fn workflow_cancel(&self, change: &Change<'_>, id: i64) -> Result<Option<(usize, Vec<i64>)>> {
        cancel(&self.pool, change, id).await
    }

    async fn workflow_of_job(&self, job_id: i64) -> Result<Option<(i64, String)>> {
        of_job(&self.pool, job_id).await
    }
}
