//! Batches in PostgreSQL: creating and closing them, and reading them back
//! (new members are counted in `membership`). The counting of ended
//! members and the callbacks are triggers (migrations/postgres/0009_batches.sql),
//! so every path that archives a job counts it.

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Row};

use super::PgStore;
use super::membership::refused_or_failed;
use crate::store::batch::{Batch, Callbacks, PreparedBatch, StoredBatch};
use crate::store::driver::BatchDriver;
use crate::store::{Enqueued, PreparedJob, Result};

/// Creates a batch and inserts its first members in one transaction,
/// closing it unless it is to stay open.
pub async fn write(pool: &PgPool, batch: PreparedBatch) -> Result<(i64, Vec<Enqueued>)> {
    let mut tx = pool.begin().await?;
    let work = write_in(&mut tx, batch).await;
    super::commit_or_roll_back(tx, work).await
}

/// [`write`], in the caller's transaction.
pub async fn write_in(conn: &mut PgConnection, batch: PreparedBatch) -> Result<(i64, Vec<Enqueued>)> {
    let c = &batch.callbacks;
    let id: i64 = sqlx::query_scalar("SELECT jobhost.batch_open($1, $2, $3, $4, $5)")
        .bind(&batch.label)
        .bind(&c.on_finish)
        .bind(&c.on_success)
        .bind(&c.on_failure)
        .bind(Json(&batch.callback_payload))
        .fetch_one(&mut *conn)
        .await?;
    let members: Vec<PreparedJob> =
        batch.members.into_iter().map(|m| PreparedJob { batch_id: Some(id), ..m }).collect();
    let enqueued = super::job::insert(conn, &members.iter().collect::<Vec<_>>()).await?;
    if !batch.open {
        sqlx::query("SELECT jobhost.batch_close($1)").bind(id).execute(&mut *conn).await?;
    }
    Ok((id, enqueued))
}

/// Closes a batch; false when it was closed already. A closed batch whose
/// members have all ended finishes as this commits.
pub async fn close(pool: &PgPool, id: i64) -> Result<bool> {
    sqlx::query_scalar("SELECT jobhost.batch_close($1)").bind(id).fetch_one(pool).await.map_err(refused_or_failed)
}

/// Batches, newest first: one when `id` is given, else up to `limit`.
pub async fn list(pool: &PgPool, id: Option<i64>, limit: i64) -> Result<Vec<Batch>> {
    let rows = sqlx::query(include_str!("sql/batch_list.sql")).bind(id).bind(limit).fetch_all(pool).await?;
    rows.iter().map(batch_of).collect()
}

fn batch_of(row: &PgRow) -> Result<Batch> {
    Ok(Batch::from(StoredBatch {
        id: row.try_get("id")?,
        label: row.try_get("label")?,
        total: row.try_get("total")?,
        completed: row.try_get("completed")?,
        failed: row.try_get("failed")?,
        discarded: row.try_get("discarded")?,
        cancelled: row.try_get("cancelled")?,
        running: row.try_get("running")?,
        live_done: row.try_get("live_done")?,
        callbacks: Callbacks {
            on_finish: row.try_get("on_finish")?,
            on_success: row.try_get("on_success")?,
            on_failure: row.try_get("on_failure")?,
        },
        callback_payload: row.try_get::<Json<serde_json::Value>, _>("callback_payload")?.0,
        callback_jobs: row.try_get::<Json<BTreeMap<String, i64>>, _>("callback_jobs")?.0,
        callback_errors: row.try_get::<Json<BTreeMap<String, String>>, _>("callback_errors")?.0,
        created_at: row.try_get("created_at")?,
        closed_at: row.try_get("closed_at")?,
        finished_at: row.try_get("finished_at")?,
    }))
}

#[async_trait]
impl BatchDriver for PgStore {
    async fn batch_close(&self, id: i64) -> Result<bool> {
        close(&self.pool, id).await
    }

    async fn batch_get(&self, id: i64) -> Result<Option<Batch>> {
        Ok(list(&self.pool, Some(id), 1).await?.pop())
    }

    async fn batch_list(&self, limit: i64) -> Result<Vec<Batch>> {
        list(&self.pool, None, limit).await
    }
}
