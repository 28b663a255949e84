//! Outbound grants in PostgreSQL.

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool};

use super::PgStore;
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::driver::GrantDriver;
use crate::store::grant::{GrantTimeouts, NewGrant, OutboundGrant};

pub async fn set(conn: &mut PgConnection, grant: &NewGrant) -> Result<bool> {
    // `xmax <> 0` on the returned row: the insert met the old row and updated it.
    let replaced: bool = sqlx::query_scalar(
        "INSERT INTO jobhost.outbound_grants (job_type, origin, methods, secrets, private, idempotency_key,
                                               connect_timeout_ms, first_byte_timeout_ms, between_bytes_timeout_ms,
                                               secrets_in, secret_headers)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (job_type, origin) DO UPDATE
            SET methods = EXCLUDED.methods, secrets = EXCLUDED.secrets, private = EXCLUDED.private,
                idempotency_key = EXCLUDED.idempotency_key, connect_timeout_ms = EXCLUDED.connect_timeout_ms,
                first_byte_timeout_ms = EXCLUDED.first_byte_timeout_ms,
                between_bytes_timeout_ms = EXCLUDED.between_bytes_timeout_ms, secrets_in = EXCLUDED.secrets_in,
                secret_headers = EXCLUDED.secret_headers, granted_at = now()
         RETURNING xmax <> 0",
    )
    .bind(&grant.job_type)
    .bind(&grant.origin)
    .bind(&grant.methods)
    .bind(&grant.secrets)
    .bind(grant.private)
    .bind(grant.idempotency_key)
    .bind(grant.timeouts.connect_ms.map(ms_column))
    .bind(grant.timeouts.first_byte_ms.map(ms_column))
    .bind(grant.timeouts.between_bytes_ms.map(ms_column))
    .bind(&grant.secrets_in)
    .bind(&grant.secret_headers)
    .fetch_one(conn)
    .await?;
    Ok(replaced)
}

pub async fn revoke(conn: &mut PgConnection, job_type: &str, origin: &str) -> Result<bool> {
    let removed = sqlx::query("DELETE FROM jobhost.outbound_grants WHERE job_type = $1 AND origin = $2")
        .bind(job_type)
        .bind(origin)
        .execute(conn)
        .await?;
    Ok(removed.rows_affected() > 0)
}

pub async fn list(pool: &PgPool, job_type: Option<&str>) -> Result<Vec<OutboundGrant>> {
    let rows: Vec<GrantRow> = sqlx::query_as(
        "SELECT job_type, origin, methods, secrets, private, idempotency_key, connect_timeout_ms,
                first_byte_timeout_ms, between_bytes_timeout_ms, secrets_in, secret_headers, granted_at
         FROM jobhost.outbound_grants
         WHERE $1::text IS NULL OR job_type = $1 ORDER BY job_type, origin",
    )
    .bind(job_type)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| OutboundGrant {
            job_type: row.job_type,
            origin: row.origin,
            methods: row.methods,
            secrets: row.secrets,
            private: row.private,
            idempotency_key: row.idempotency_key,
            timeouts: GrantTimeouts {
                connect_ms: row.connect_timeout_ms.map(|ms| ms as u64),
                first_byte_ms: row.first_byte_timeout_ms.map(|ms| ms as u64),
                between_bytes_ms: row.between_bytes_timeout_ms.map(|ms| ms as u64),
            },
            secrets_in: row.secrets_in,
            secret_headers: row.secret_headers,
            granted_at: row.granted_at,
        })
        .collect())
}

struct GrantRow {
    job_type: String,
    origin: String,
    methods: Vec<String>,
    secrets: Vec<String>,
    private: bool,
    idempotency_key: bool,
    connect_timeout_ms: Option<i64>,
    first_byte_timeout_ms: Option<i64>,
    between_bytes_timeout_ms: Option<i64>,
    secrets_in: Vec<String>,
    secret_headers: Vec<String>,
    granted_at: chrono::DateTime<chrono::Utc>,
}

from_row!(
    sqlx::postgres::PgRow,
    GrantRow {
        job_type,
        origin,
        methods,
        secrets,
        private,
        idempotency_key,
        connect_timeout_ms,
        first_byte_timeout_ms,
        between_bytes_timeout_ms,
        secrets_in,
        secret_headers,
        granted_at
    }
);

/// Milliseconds as the column keeps them (checked at most an hour when granted).
fn ms_column(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

#[async_trait]
impl GrantDriver for PgStore {
    async fn grant_set(&self, change: &Change<'_>, new: &crate::store::grant::NewGrant) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| set(conn, new).await).await
    }

    async fn grant_revoke(&self, change: &Change<'_>, job_type: &str, origin: &str) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| revoke(conn, job_type, origin).await).await
    }

    async fn grants(&self, job_type: Option<&str>) -> Result<Vec<crate::store::grant::OutboundGrant>> {
        list(&self.pool, job_type).await
    }
}
