//! Events and durable waits in PostgreSQL: sending an event
//! (`jobhost.event_send`, the same function an application calls in its own
//! transaction as `jobhost.send_event`), listing and pruning events, and
//! the maintenance that ends due sleeps and timeouts and arms waits the
//! release could not (functions/workflow_waits_due.sql).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::types::Json;

use super::PgStore;
use crate::store::audit::Change;
use crate::store::driver::EventDriver;
use crate::store::wait::{EventRow, SentEvent, StoredEvent, TriggeredJob, stored_event};
use crate::store::{Error, Result};

/// The function's own refusal of an event (SQLSTATE 22023: a payload past
/// the database's limit as `jsonb` text measures it) as the caller's error.
fn refused_as_invalid(error: sqlx::Error) -> Error {
    match error.as_database_error() {
        Some(db) if db.code().as_deref() == Some("22023") => {
            Error::InvalidEvent(db.message().trim_start_matches("invalid event: ").to_string())
        }
        _ => Error::from(error),
    }
}

/// Sends an event a run sent, in its completion's transaction (`conn`),
/// in one round trip: the caller wakes its fetch for whatever it enqueued
/// or released rather than reading that back.
pub(super) async fn send_in(
    conn: &mut PgConnection,
    key: &str,
    payload: &serde_json::Value,
    source: &str,
) -> Result<()> {
    sqlx::query("SELECT jobhost.event_send($1, $2, NULL, $3)")
        .bind(key)
        .bind(Json(payload))
        .bind(source)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The jobs event `id` enqueued for its key's subscribers.
async fn jobs_of(executor: impl sqlx::PgExecutor<'_>, id: i64) -> Result<Vec<TriggeredJob>> {
    let jobs: Option<Json<Vec<TriggeredJob>>> =
        sqlx::query_scalar("SELECT jobs FROM jobhost.events WHERE id = $1").bind(id).fetch_optional(executor).await?;
    Ok(jobs.map(|j| j.0).unwrap_or_default())
}

#[async_trait]
impl EventDriver for PgStore {
    async fn event_send(
        &self,
        change: &Change<'_>,
        key: &str,
        payload: &serde_json::Value,
        idempotency_key: Option<&str>,
        source: &str,
    ) -> Result<SentEvent> {
        let mut tx = self.pool.begin().await?;
        let (id, released, duplicate): (i64, i32, bool) =
            sqlx::query_as("SELECT id, released, duplicate FROM jobhost.event_send($1, $2, $3, $4)")
                .bind(key)
                .bind(Json(payload))
                .bind(idempotency_key)
                .bind(source)
                .fetch_one(&mut *tx)
                .await
                .map_err(refused_as_invalid)?;
        let sent = SentEvent { id, released: released.into(), duplicate, jobs: Vec::new() };
        super::audit::record(&mut tx, change, &sent).await?;
        tx.commit().await?;
        // Read after the send's commit: the function's result cannot carry
        // them without changing its signature, which callers rely on.
        let jobs = jobs_of(&self.pool, id).await?;
        Ok(SentEvent { jobs, ..sent })
    }

    async fn event_list(&self, key: Option<&str>, limit: i64) -> Result<Vec<StoredEvent>> {
        let rows: Vec<EventRow<DateTime<Utc>>> = sqlx::query_as(
            "SELECT id, key, payload, source, sent_at, released::int8, jobs FROM jobhost.events
             WHERE $1::text IS NULL OR key = $1
             ORDER BY id DESC LIMIT $2",
        )
        .bind(key)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|row| stored_event(row, |at| at)).collect())
    }

    async fn waits_due(&self, now: Option<DateTime<Utc>>, batch: i64) -> Result<u64> {
        let batch = i32::try_from(batch).unwrap_or(i32::MAX);
        let ended: i32 = sqlx::query_scalar("SELECT jobhost.workflow_waits_due(coalesce($1, now()), $2)")
            .bind(now)
            .bind(batch)
            .fetch_one(&self.sweeps)
            .await?;
        // Waits left unarmed wait here for their key's senders, as long as
        // a sweep waits for a lock; past that, the next pass tries again.
        let armed =
            match sqlx::query_scalar::<_, i32>("SELECT jobhost.workflow_waits_arm_late(coalesce($1, now()), $2)")
                .bind(now)
                .bind(batch)
                .fetch_one(&self.sweeps)
                .await
            {
                Ok(armed) => armed,
                Err(error) => match Error::from(error) {
                    busy if busy.is_lock_timeout() => 0,
                    other => return Err(other),
                },
            };
        Ok(u64::try_from(ended + armed).unwrap_or(0))
    }

    async fn event_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        Ok(sqlx::query(
            "DELETE FROM jobhost.events WHERE id IN (
                 SELECT id FROM jobhost.events
                 WHERE sent_at < coalesce($1, now()) - $2 * interval '1 second'
                 ORDER BY sent_at LIMIT $3)",
        )
        .bind(now)
        .bind(retention_secs)
        .bind(limit)
        .execute(&self.sweeps)
        .await?
        .rows_affected())
    }
}
