//! The trace contexts enqueues carried (0020_traces.sql), in SQLite.

use async_trait::async_trait;
use sqlx::SqliteConnection;

use super::SqliteStore;
use super::encode::json_list;
use crate::store::driver::TraceDriver;
use crate::store::{PreparedJob, Result};

/// Records the trace context of each stored job that carries one, in the
/// enqueue's transaction. Nothing is written when none does.
pub async fn record<'a>(
    conn: &mut SqliteConnection,
    stored: impl Iterator<Item = (i64, &'a PreparedJob)>,
) -> Result<()> {
    let traced: Vec<(i64, &str)> = stored.filter_map(|(id, job)| Some((id, job.traceparent.as_deref()?))).collect();
    if traced.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO job_traces (job_id, traceparent)
         SELECT i.value ->> 0, i.value ->> 1 FROM json_each($1) i
         WHERE true
         ON CONFLICT (job_id) DO NOTHING",
    )
    .bind(json_list(&traced))
    .execute(conn)
    .await?;
    Ok(())
}

#[async_trait]
impl TraceDriver for SqliteStore {
    async fn job_traceparent(&self, id: i64) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT traceparent FROM job_traces WHERE job_id = $1")
            .bind(id)
            .fetch_optional(&self.reader)
            .await?)
    }
}
