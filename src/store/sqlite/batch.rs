//! Batches in SQLite, inside the writer's transaction: creating and
//! closing batches, reading them back, and settling finished ones (new
//! members are counted in `membership`). A trigger counts each archived member
//! (migrations/sqlite/0007_batches.sql); [`settle`] runs just before every
//! write transaction commits, so the transaction that ends a closed
//! batch's last member (by any path) also enqueues its callbacks, once:
//! the batch's `finished_at` is set in that same transaction.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::types::Json;
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use super::time_of;
use crate::store::batch::{Batch, BatchCounts, BatchInfo, Callbacks, PreparedBatch, StoredBatch, settle_callbacks};
use crate::store::driver::BatchDriver;
use crate::store::enqueue::{Configs, job_names};
use crate::store::{EnqueueLimits, Enqueued, Error, PreparedJob, Result};

/// Creates a batch and inserts its first members, closing it unless it is
/// to stay open.
pub async fn write(conn: &mut SqliteConnection, batch: PreparedBatch, now: i64) -> Result<(i64, Vec<Enqueued>)> {
    let c = &batch.callbacks;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO batches (label, created_at, on_finish, on_success, on_failure, callback_payload)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(&batch.label)
    .bind(now)
    .bind(&c.on_finish)
    .bind(&c.on_success)
    .bind(&c.on_failure)
    .bind(Json(&batch.callback_payload))
    .fetch_one(&mut *conn)
    .await?;
    let members: Vec<PreparedJob> =
        batch.members.into_iter().map(|m| PreparedJob { batch_id: Some(id), ..m }).collect();
    let enqueued = super::job::insert(conn, &members.iter().collect::<Vec<_>>(), now).await?;
    if !batch.open {
        close(conn, id, now).await?;
    }
    Ok((id, enqueued))
}

/// Closes a batch; false when it was closed already.
pub async fn close(conn: &mut SqliteConnection, id: i64, now: i64) -> Result<bool> {
    let closed = sqlx::query("UPDATE batches SET closed_at = $2 WHERE id = $1 AND closed_at IS NULL")
        .bind(id)
        .bind(now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if closed == 0
        && !sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM batches WHERE id = $1)")
            .bind(id)
            .fetch_one(&mut *conn)
            .await?
    {
        return Err(Error::BatchRefused(format!("batch {id} does not exist")));
    }
    Ok(closed == 1)
}

/// Finishes every closed batch whose members have all ended and enqueues
/// its callbacks, in the caller's transaction. A callback that cannot be
/// enqueued (its type gone, its limit full with `raise`) is recorded on the
/// batch with the reason, and never fails the transaction: the member's
/// result is written regardless (guarantee 13). Returns whether any job
/// became available.
pub async fn settle(conn: &mut SqliteConnection, limits: &EnqueueLimits, now: i64) -> Result<bool> {
    // Read through the partial index `batches_due`, which holds only such
    // batches: almost always none, however many batches are open.
    let done: Vec<Finished> = sqlx::query_as(
        "UPDATE batches SET finished_at = $1
         WHERE closed_at IS NOT NULL AND finished_at IS NULL
           AND completed + failed + discarded + cancelled >= total
         RETURNING id, label, total, completed, failed, discarded, cancelled,
                   on_finish, on_success, on_failure, callback_payload",
    )
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    let mut any_available = false;
    for Finished {
        id,
        label,
        total,
        completed,
        failed,
        discarded,
        cancelled,
        on_finish,
        on_success,
        on_failure,
        callback_payload: base,
    } in done
    {
        let callbacks = Callbacks { on_finish, on_success, on_failure };
        let counts = BatchCounts { total, completed, failed, discarded, cancelled, ..Default::default() };
        let info = BatchInfo { id, label, counts };
        let names = job_names(callbacks.due(&counts).into_iter().map(|(_, job)| job));
        // A stored configuration that cannot be read is its callback's
        // problem, not every write's: this runs before each commit.
        let mut configs = Configs::new();
        let mut unreadable: HashMap<String, String> = HashMap::new();
        for name in names {
            match super::fleet::job_types_get(&mut *conn, std::slice::from_ref(&name)).await {
                Ok(found) => configs.extend(found),
                Err(error @ (Error::CorruptJobType { .. } | Error::Decode(_))) => {
                    unreadable.insert(name, error.to_string());
                }
                Err(error) => return Err(error),
            }
        }
        let mut jobs: HashMap<&str, i64> = HashMap::new();
        let mut errors: HashMap<&str, String> = HashMap::new();
        let planned =
            settle_callbacks(&callbacks, &base.0, &info, &configs, limits).into_iter().zip(callbacks.due(&counts));
        let planned: Vec<_> = planned
            .map(|((kind, prepared), (_, job))| match unreadable.get(job) {
                Some(reason) => (kind, Err(reason.clone())),
                None => (kind, prepared),
            })
            .collect();
        for (kind, prepared) in planned {
            let enqueued = match prepared {
                Ok(job) => enqueue_alone(conn, &job, now).await?,
                Err(reason) => Err(reason),
            };
            match enqueued {
                Ok(outcome) => {
                    any_available |= matches!(outcome, Enqueued::New(_));
                    jobs.insert(kind, outcome.id());
                }
                Err(reason) => {
                    tracing::error!(batch = id, callback = kind, %reason, "a finished batch's callback was refused");
                    errors.insert(kind, reason);
                }
            }
        }
        sqlx::query("UPDATE batches SET callback_jobs = $2, callback_errors = $3 WHERE id = $1")
            .bind(id)
            .bind(Json(&jobs))
            .bind(Json(&errors))
            .execute(&mut *conn)
            .await?;
    }
    Ok(any_available)
}

/// A batch [`settle`] found finished.
struct Finished {
    id: i64,
    label: Option<String>,
    total: i64,
    completed: i64,
    failed: i64,
    discarded: i64,
    cancelled: i64,
    on_finish: Option<String>,
    on_success: Option<String>,
    on_failure: Option<String>,
    callback_payload: Json<serde_json::Value>,
}

from_row!(
    sqlx::sqlite::SqliteRow,
    Finished {
        id,
        label,
        total,
        completed,
        failed,
        discarded,
        cancelled,
        on_finish,
        on_success,
        on_failure,
        callback_payload
    }
);

/// Inserts one job (a callback, a released workflow step) under a
/// savepoint, so that its refusal (a `raise` limit, a duplicate that
/// raises) undoes only it. A database failing in
/// itself is not a refusal: it fails the whole write, to be tried again.
pub(super) async fn enqueue_alone(
    conn: &mut SqliteConnection,
    job: &PreparedJob,
    now: i64,
) -> Result<Result<Enqueued, String>> {
    sqlx::query("SAVEPOINT enqueue_alone").execute(&mut *conn).await?;
    match super::job::insert(conn, &[job], now).await {
        Ok(outcomes) => {
            sqlx::query("RELEASE enqueue_alone").execute(&mut *conn).await?;
            let outcome =
                outcomes.first().copied().ok_or_else(|| Error::Decode("an insert returned nothing".into()))?;
            Ok(Ok(outcome))
        }
        Err(error) if error.is_refusal() || matches!(error, Error::InvalidEnqueue(_)) => {
            sqlx::query("ROLLBACK TO enqueue_alone").execute(&mut *conn).await?;
            sqlx::query("RELEASE enqueue_alone").execute(&mut *conn).await?;
            Ok(Err(error.to_string()))
        }
        Err(error) => Err(error),
    }
}

/// Batches newest first: one when `id` is given, else up to `limit`.
pub async fn list(pool: &SqlitePool, id: Option<i64>, limit: i64) -> Result<Vec<Batch>> {
    let rows = sqlx::query(
        "SELECT b.*,
                (SELECT count(*) FROM jobs j WHERE j.batch_id = b.id AND j.state = 'running') AS running,
                (SELECT coalesce(sum(min(1.0, max(0.0,
                            CAST(l.progress ->> 'done' AS REAL) / nullif(CAST(l.progress ->> 'total' AS REAL), 0)))), 0.0)
                 FROM (SELECT progress FROM jobs WHERE batch_id = b.id AND progress IS NOT NULL
                       UNION ALL
                       SELECT progress FROM blocked_jobs WHERE batch_id = b.id AND progress IS NOT NULL) l
                ) AS live_done
         FROM batches b
         WHERE $1 IS NULL OR b.id = $1
         ORDER BY b.id DESC
         LIMIT $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(batch_of).collect()
}

fn batch_of(row: &SqliteRow) -> Result<Batch> {
    let time = |column: &str| row.try_get::<Option<i64>, _>(column).map(|ms| ms.map(time_of));
    Ok(Batch::from(StoredBatch {
        id: row.try_get("id")?,
        label: row.try_get("label")?,
        total: row.try_get("total")?,
        completed: row.try_get("completed")?,
        failed: row.try_get("failed")?,
        discarded: row.try_get("discarded")?,
        cancelled: row.try_get("cancelled")?,
        running: row.try_get("running")?,
        live_done: row.try_get::<Option<f64>, _>("live_done")?.unwrap_or(0.0),
        callbacks: Callbacks {
            on_finish: row.try_get("on_finish")?,
            on_success: row.try_get("on_success")?,
            on_failure: row.try_get("on_failure")?,
        },
        callback_payload: row.try_get::<Json<serde_json::Value>, _>("callback_payload")?.0,
        callback_jobs: row.try_get::<Json<BTreeMap<String, i64>>, _>("callback_jobs")?.0,
        callback_errors: row.try_get::<Json<BTreeMap<String, String>>, _>("callback_errors")?.0,
        created_at: time_of(row.try_get("created_at")?),
        closed_at: time("closed_at")?,
        finished_at: time("finished_at")?,
    }))
}

#[async_trait]
impl BatchDriver for SqliteStore {
    async fn batch_close(&self, id: i64) -> Result<bool> {
        self.write_with(async |tx| close(tx, id, now_ms()).await).await
    }

    async fn batch_get(&self, id: i64) -> Result<Option<Batch>> {
        Ok(list(&self.reader, Some(id), 1).await?.pop())
    }

    async fn batch_list(&self, limit: i64) -> Result<Vec<Batch>> {
        list(&self.reader, None, limit).await
    }
}
