//! Writes a [`FinishPlan`] in PostgreSQL: one call of `jobhost.finish_runs`
//! (or `jobhost.finish_runs_unless_locked`) ends the runs, gives back their
//! slots, promotes blocked jobs into them and leases the next jobs, in one
//! round trip; a plan with children adds their insert in the same
//! transaction.

use std::collections::HashSet;

use sqlx::types::Json;
use sqlx::{Connection, PgConnection, Row};

use crate::store::finish::{ErrorEntry, FinishPlan, Written};
use crate::store::{Error, FetchParams, Result};
use crate::types::JsonText;

/// Writes `plan`; returns what was written and whether any job became
/// available (requeued at once, or promoted into a freed slot).
pub async fn write(conn: &mut PgConnection, plan: &FinishPlan, next: Option<&FetchParams>) -> Result<(Written, bool)> {
    let rows = FinishRows::of(plan);
    // Children and opened batches must commit with their parent's
    // completion (guarantee 9), so a plan with them is one transaction; so
    // is a plan that waits for its runs' keys and batches, which it takes
    // first, in the lock order (`functions/lock_for_ending.sql`).
    // Otherwise the plan is one statement.
    if !plan.has_children() && plan.lock_first.is_empty() {
        return rows.write(conn, next).await;
    }
    // The children go in before the next fetch, so the fetch's claims on
    // `while_executing` keys are the transaction's last locks: an enqueue
    // waiting on a child's key never holds up a claim another fetch waits on.
    let mut tx = conn.begin().await?;
    let work = async {
        if !plan.schedules.is_empty() {
            super::keyed_schedule::lock_changed(&mut tx, &plan.changed_schedules()).await?;
        }
        if !plan.lock_first.is_empty() {
            sqlx::query("SELECT jobhost.lock_for_ending($1)").bind(&plan.lock_first).execute(&mut *tx).await?;
        }
        // A run's steps join its workflow before its ending counts down
        // its dependents (the archive's trigger), in this transaction.
        for growth in &plan.growths {
            super::workflow::grow_in(&mut tx, growth).await?;
        }
        let (mut written, any_available) = rows.write(&mut *tx, None).await?;
        let children = plan.children_of(&written.written);
        let mut enqueued = super::job::insert(&mut tx, &children).await?;
        for batch in plan.batches_of(&written.written) {
            enqueued.extend(super::batch::write_in(&mut tx, batch.clone()).await?.1);
        }
        let mut released = false;
        for workflow in plan.workflows_of(&written.written) {
            released |= !super::workflow::write_in(&mut tx, workflow.clone()).await?.released.is_empty();
        }
        for (parent, event) in plan.events_of(&written.written) {
            super::event::send_in(&mut tx, &event.key, &event.payload, &format!("job:{parent}")).await?;
            // It may have enqueued or released jobs: a fetch finds out.
            released = true;
        }
        for change in plan.schedules_of(&written.written) {
            super::keyed_schedule::change_in(&mut tx, change).await?;
        }
        if let Some(next) = next {
            written.leased = super::job::fetch(&mut *tx, next).await?;
        }
        Ok((written, any_available || released || !enqueued.is_empty()))
    }
    .await;
    super::commit_or_roll_back(tx, work).await
}

/// Runs a result write's statements once in a transaction it rolls back,
/// so a new session compiles and plans them before a real write needs
/// them: a write is several PL/pgSQL functions deep, and the first one a
/// session runs took about ten times a warm one (15 ms against 0.9 ms by
/// `pgbench -C`). The runs it names cannot exist (id and lease token
/// [`crate::store::job::NO_RUN`]; job type and key empty, which no
/// registration allows), so it matches, locks and changes nothing; the
/// promotion is called directly, with one freed key, since a write calls
/// it only for runs it ended.
pub async fn warm(conn: &mut PgConnection) -> Result<()> {
    const RUNS: [i64; 1] = [crate::store::job::NO_RUN];
    let log = serde_json::Value::Null;
    let rows = FinishRows {
        deferrable_ids: RUNS.to_vec(),
        deferrable_tokens: RUNS.to_vec(),
        archive_ids: RUNS.to_vec(),
        archive_tokens: RUNS.to_vec(),
        archive_states: vec!["completed"],
        outputs: vec![None],
        archive_errors: vec![None],
        logs: vec![Json(&log)],
        archive_progress: vec![None],
        requeue_ids: RUNS.to_vec(),
        requeue_tokens: RUNS.to_vec(),
        delays: vec![0],
        refunds: vec![0],
        requeue_errors: vec![None],
        requeue_progress: vec![None],
    };
    let plain = FinishRows { deferrable_ids: Vec::new(), deferrable_tokens: Vec::new(), ..rows.clone() };
    // Once: PostgreSQL settles on a statement's generic plan after its
    // fifth run, and one settled here would be planned for the tables as
    // they are when the host starts (empty, on a new database) and kept
    // until they are next analyzed: six runs here made the unlimited
    // queue's write four times slower (BENCHMARKS.md, "A warm result
    // writer").
    let mut tx = conn.begin().await?;
    rows.write(&mut *tx, None).await?;
    plain.write(&mut *tx, None).await?;
    sqlx::query(include_str!("sql/warm_promotion.sql")).execute(&mut *tx).await?;
    tx.rollback().await?;
    Ok(())
}

/// The columns of `jobhost.finish_runs`: runs that end for good, and runs
/// that go back to wait, borrowed from the plan.
#[derive(Default, Clone)]
struct FinishRows<'a> {
    deferrable_ids: Vec<i64>,
    deferrable_tokens: Vec<i64>,
    archive_ids: Vec<i64>,
    archive_tokens: Vec<i64>,
    archive_states: Vec<&'static str>,
    outputs: Vec<Option<Json<&'a JsonText>>>,
    archive_errors: Vec<Option<Json<&'a ErrorEntry>>>,
    logs: Vec<Json<&'a serde_json::Value>>,
    archive_progress: Vec<Option<Json<&'a serde_json::Value>>>,
    requeue_ids: Vec<i64>,
    requeue_tokens: Vec<i64>,
    delays: Vec<i64>,
    refunds: Vec<i32>,
    requeue_errors: Vec<Option<Json<&'a ErrorEntry>>>,
    requeue_progress: Vec<Option<Json<&'a serde_json::Value>>>,
}

impl<'a> FinishRows<'a> {
    fn of(plan: &'a FinishPlan) -> FinishRows<'a> {
        let mut rows = FinishRows::default();
        for run in &plan.deferrable {
            rows.deferrable_ids.push(run.job_id);
            rows.deferrable_tokens.push(run.lease_token);
        }
        for e in &plan.endings {
            rows.archive_ids.push(e.id);
            rows.archive_tokens.push(e.lease_token);
            rows.archive_states.push(e.state.as_str());
            rows.outputs.push(e.output.as_ref().map(Json));
            rows.archive_errors.push(e.error.as_ref().map(Json));
            rows.logs.push(Json(&e.log));
            rows.archive_progress.push(e.progress.as_ref().map(Json));
        }
        for r in &plan.requeues {
            rows.requeue_ids.push(r.id);
            rows.requeue_tokens.push(r.lease_token);
            rows.delays.push(r.delay_ms);
            rows.refunds.push(r.refund);
            rows.requeue_errors.push(r.error.as_ref().map(Json));
            rows.requeue_progress.push(r.progress.as_ref().map(Json));
        }
        rows
    }

    /// Writes the rows whose lease still matches (see jobhost.finish_runs in
    /// 0004_concurrency.sql, through jobhost.finish_runs_unless_locked in
    /// 0009_batches.sql), leasing the jobs `next` asks for.
    async fn write(&self, executor: impl sqlx::PgExecutor<'_>, next: Option<&FetchParams>) -> Result<(Written, bool)> {
        let next = next.filter(|n| n.limit > 0 && !n.job_types.is_empty() && !n.queues.is_empty());
        let (names, leases): (Vec<&str>, Vec<i32>) =
            next.map(|n| n.job_types.iter().map(|(name, l)| (name.as_str(), *l)).unzip()).unwrap_or_default();
        // A plan with no run holding a key or in a batch has nothing to
        // defer: it skips the wrapper's extra function frame on the hot path.
        let query = if self.deferrable_ids.is_empty() {
            sqlx::query(include_str!("sql/finish_runs.sql"))
        } else {
            sqlx::query(include_str!("sql/finish_runs_unless_locked.sql"))
                .bind(&self.deferrable_ids)
                .bind(&self.deferrable_tokens)
        };
        let rows = query
            .bind(&self.archive_ids)
            .bind(&self.archive_tokens)
            .bind(&self.archive_states)
            .bind(&self.outputs)
            .bind(&self.archive_errors)
            .bind(&self.logs)
            .bind(&self.archive_progress)
            .bind(&self.requeue_ids)
            .bind(&self.requeue_tokens)
            .bind(&self.delays)
            .bind(&self.refunds)
            .bind(&self.requeue_errors)
            .bind(&self.requeue_progress)
            .bind(next.map(|n| n.queues.clone()).unwrap_or_default())
            .bind(names)
            .bind(leases)
            .bind(next.map_or(0, |n| n.limit))
            .bind(next.map_or("", |n| n.host_id.as_str()))
            .fetch_all(executor)
            .await?;
        let first = rows.first().ok_or_else(|| Error::Decode("jobhost.finish_runs returned no row".into()))?;
        let written: Vec<i64> = first.try_get("written")?;
        let deferred: Vec<i64> = first.try_get::<Option<Vec<i64>>, _>("deferred")?.unwrap_or_default();
        let any_available: bool = first.try_get("any_available")?;
        let mut leased = Vec::new();
        for row in &rows {
            if row.try_get::<Option<i64>, _>("id")?.is_some() {
                leased.push(super::job::leased_job(row)?);
            }
        }
        let written = Written {
            written: written.into_iter().collect(),
            deferred: deferred.into_iter().collect::<HashSet<_>>(),
            leased,
        };
        Ok((written, any_available))
    }
}
