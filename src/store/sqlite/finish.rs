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
use crate::store::finish::{FinishPlan, Written};
use crate::store::{FetchParams, Result, Slots};

/// Writes `plan` at `now`; returns what was written and whether any job
/// became available (requeued at once, promoted, or a child enqueued).
pub async fn write(
    conn: &mut SqliteConnection,
    plan: &FinishPlan,
    next: Option<&FetchParams>,
    now: i64,
) -> Result<(Written, bool)> {
    let mut written = HashSet::new();
    let mut freed = Slots::default();
    let mut any_available = false;
    if !plan.endings.is_empty() {
        let ended: Vec<(i64, String, Option<String>)> = sqlx::query_as(include_str!("sql/finish_archive.sql"))
            .bind(json_list(&plan.endings))
            .bind(now)
            .bind(iso(now))
            .fetch_all(&mut *conn)
            .await?;
        let ids: Vec<i64> = ended.iter().map(|(id, _, _)| *id).collect();
        sqlx::query("DELETE FROM jobs WHERE id IN (SELECT value FROM json_each($1))")
            .bind(json_list(&ids))
            .execute(&mut *conn)
            .await?;
        for (id, job, key) in ended {
            written.insert(id);
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
    let mut enqueued = job::insert(conn, &plan.children_of(&written), now).await?;
    for batch in plan.batches_of(&written) {
        enqueued.extend(super::batch::write(conn, batch.clone(), now).await?.1);
    }
    let leased = match next {
        Some(next) => job::fetch(conn, next, now).await?,
        None => Vec::new(),
    };
    let any_available = any_available || !promoted.is_empty() || !enqueued.is_empty();
    Ok((Written { written, deferred: HashSet::new(), leased }, any_available))
}
