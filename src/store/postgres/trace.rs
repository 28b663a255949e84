//! The trace contexts enqueues carried (0026_traces.sql), in PostgreSQL.

use async_trait::async_trait;
use sqlx::PgConnection;

use super::PgStore;
use crate::store::driver::TraceDriver;
use crate::store::{PreparedJob, Result};

/// Records the trace context of each stored job that carries one, in the
/// enqueue's transaction. Nothing is written when none does.
pub async fn record<'a>(conn: &mut PgConnection, stored: impl Iterator<Item = (i64, &'a PreparedJob)>) -> Result<()> {
    let (ids, traceparents): (Vec<i64>, Vec<&str>) =
        stored.filter_map(|(id, job)| Some((id, job.traceparent.as_deref()?))).unzip();
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO jobhost.job_traces (job_id, traceparent)
         SELECT * FROM unnest($1::bigint[], $2::text[])
         ON CONFLICT (job_id) DO NOTHING",
    )
    .bind(&ids)
    .bind(&traceparents)
    .execute(conn)
    .await?;
    Ok(())
}

#[async_trait]
impl TraceDriver for PgStore {
    async fn job_traceparent(&self, id: i64) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT traceparent FROM jobhost.job_traces WHERE job_id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }
}
