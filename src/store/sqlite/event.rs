//! Events in SQLite: the writes that send an event, end due waits and
//! prune old events, each releasing the steps whose waits it ended
//! (`workflow::settle`) before it commits; the waits' own rows are
//! `sqlite::wait`'s.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::SqliteStore;
use super::encode::{ms_or_now, now_ms, time_of};
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::driver::EventDriver;
use crate::store::wait::{EventRow, SentEvent, StoredEvent, WaitEnd, stored_event};

#[async_trait]
impl EventDriver for SqliteStore {
    async fn event_send(
        &self,
        change: &Change<'_>,
        key: &str,
        payload: &serde_json::Value,
        idempotency_key: Option<&str>,
        source: &str,
    ) -> Result<SentEvent> {
        let mut tx = self.write().await?;
        let now = now_ms();
        let sent = super::wait::send(&mut tx, key, payload, idempotency_key, source, &self.limits, now).await?;
        let available = super::workflow::settle(&mut tx, &self.limits, now).await?;
        super::audit::record(&mut tx, change, &sent).await?;
        tx.commit().await?;
        self.announce(available || sent.jobs.iter().any(|job| job.id.is_some()));
        Ok(sent)
    }

    async fn event_list(&self, key: Option<&str>, limit: i64) -> Result<Vec<StoredEvent>> {
        let rows: Vec<EventRow<i64>> = sqlx::query_as(
            "SELECT id, key, payload, source, sent_at, released, jobs FROM events
             WHERE $1 IS NULL OR key = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(key)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        Ok(rows.into_iter().map(|row| stored_event(row, time_of)).collect())
    }

    async fn waits_due(&self, now: Option<DateTime<Utc>>, batch: i64) -> Result<u64> {
        let at = ms_or_now(now);
        let due: Vec<(i64, Option<String>)> = sqlx::query_as(
            "SELECT step_id, key FROM workflow_waits
             WHERE ended_by IS NULL AND due_at <= $1 AND armed_at IS NOT NULL ORDER BY due_at LIMIT $2",
        )
        .bind(at)
        .bind(batch)
        .fetch_all(&self.reader)
        .await?;
        if due.is_empty() {
            return Ok(0);
        }
        let sleeps: Vec<i64> = due.iter().filter(|(_, key)| key.is_none()).map(|(step, _)| *step).collect();
        let timeouts: Vec<i64> = due.iter().filter(|(_, key)| key.is_some()).map(|(step, _)| *step).collect();
        let mut tx = self.write().await?;
        let ended = super::wait::end(&mut tx, &sleeps, WaitEnd::Time, None, at).await?
            + super::wait::end(&mut tx, &timeouts, WaitEnd::Timeout, None, at).await?;
        let available = super::workflow::settle(&mut tx, &self.limits, at).await?;
        tx.commit().await?;
        self.announce(available);
        Ok(u64::try_from(ended).unwrap_or(0))
    }

    async fn event_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        let cutoff = ms_or_now(now) - (retention_secs * 1000.0) as i64;
        self.write_with(async |tx| {
            Ok(sqlx::query(
                "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE sent_at < $1 ORDER BY sent_at LIMIT $2)",
            )
            .bind(cutoff)
            .bind(limit)
            .execute(&mut **tx)
            .await?
            .rows_affected())
        })
        .await
    }
}
