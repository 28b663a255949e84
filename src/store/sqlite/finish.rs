//! Writes a [`FinishPlan`] in SQLite, inside the caller's `BEGIN IMMEDIATE`
//! transaction: the runs whose lease still matches end (sql/finish_archive.sql)
//! or go back to wait (sql/finish_requeue.sql), their slots are given back
//! and blocked jobs promoted into them, the children of written parents are
//! inserted (guarantee 9), and then, when `next` asks for any, jobs are
//! leased to the writing host. Writers take the file's lock one at a time
//! and hold no row locks, so nothing is ever deferred here.

use std::collections::HashSet;

use sqlx::SqliteConnection;

use super::{concurrency, iso, job, json_list};
use crate::store::enqueue::EnqueueLimits;
use crate::store::finish::{FinishPlan, Written};
use crate::store::{FetchParams, Result, Slots};

/// What a result write did, for its commit and its announcement.
pub struct Wrote {
    pub written: Written,
    /// A job became available: requeued at once, promoted, or a child enqueued.
    pub any_available: bool,
    /// How many jobs the fetch sent back to wait for a start (rate limits).
    pub sent_back: u64,
    /// A batch member may have ended (archived, or discarded by the gate
    /// as a child or batch was enqueued), so the commit settles batches.
    pub may_finish_batch: bool,
}

/// Writes `plan` at `now`.
pub async fn write(
    conn: &mut SqliteConnection,
    plan: &FinishPlan,
    next: Option<&FetchParams>,
    limits: &EnqueueLimits,
    now: i64,
) -> Result<Wrote> {
    let mut written = HashSet::new();
    let mut freed = Slots::default();
    let mut any_available = false;
    let mut may_finish_batch = false;
    // A run's steps join its workflow before its ending counts down its
    // dependents (the archive's trigger); `settle` releases at the commit.
    for growth in &plan.growths {
        super::workflow::grow(conn, growth).await?;
    }
    if !plan.endings.is_empty() {
        let ended: Vec<(i64, String, Option<String>, Option<i64>)> =
            sqlx::query_as(include_str!("sql/finish_archive.sql"))
                .bind(json_list(&plan.endings))
                .bind(now)
                .bind(iso(now))
                .fetch_all(&mut *conn)
                .await?;
        for (id, job, key, batch_id) in ended {
            written.insert(id);
            may_finish_batch |= batch_id.is_some();
            freed.push(&job, key.as_deref());
        }
    }
    if !plan.requeues.is_empty() {
        let back: Vec<(i64, String, String, Option<String>)> = sqlx::query_as(include_str!("sql/finish_requeue.sql"))
            .bind(json_list(&plan.requeues))
            .bind(now)
            .bind(iso(now))
            .fetch_all(&mut *conn)
            .await?;
        for (id, state, job, key) in back {
            written.insert(id);
            // A job available again at once keeps its slot; one that waits gives it back.
            if state == "scheduled" {
                freed.push(&job, key.as_deref());
            } else {
                any_available = true;
            }
        }
    }
    let promoted = concurrency::release(conn, &freed, now).await?;
    let children = plan.children_of(&written);
    let batches = plan.batches_of(&written);
    may_finish_batch |= !children.is_empty() || !batches.is_empty();
    let mut enqueued = job::insert(conn, &children, now).await?;
    for batch in batches {
        enqueued.extend(super::batch::write(conn, batch.clone(), now).await?.1);
    }
    // Their first steps are released by `settle` as the write commits.
    for workflow in plan.workflows_of(&written) {
        super::workflow::write(conn, workflow.clone(), now).await?;
    }
    // Their runs' events go out once the waits their endings armed are
    // armed (a step after one of them may wait for what it sends); the
    // waits the events end release their steps at the commit's `settle`.
    let mut triggered = false;
    let events: Vec<_> = plan.events_of(&written).collect();
    if !events.is_empty() {
        any_available |= super::workflow::settle(conn, limits, now).await?;
    }
    for (parent, event) in events {
        let source = format!("job:{parent}");
        let sent = super::wait::send(conn, &event.key, &event.payload, None, &source, limits, now).await?;
        triggered |= sent.jobs.iter().any(|job| job.id.is_some());
    }
    for change in plan.schedules_of(&written) {
        super::keyed_schedule::change_in(conn, change, now).await?;
    }
    let (leased, sent_back) = match next {
        Some(next) => job::fetch(conn, next, now).await?,
        None => (Vec::new(), 0),
    };
    Ok(Wrote {
        written: Written { written, deferred: HashSet::new(), leased },
        any_available: any_available || promoted > 0 || !enqueued.is_empty() || triggered,
        sent_back,
        may_finish_batch,
    })
}
