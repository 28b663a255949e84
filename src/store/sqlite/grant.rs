//! Outbound grants in SQLite; methods and secrets as JSON arrays.

use async_trait::async_trait;
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use crate::store::audit::Change;
use crate::store::driver::GrantDriver;
use crate::store::grant::{GrantTimeouts, NewGrant, OutboundGrant};
use crate::store::{Error, Result};

fn json_list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_string())
}

/// Milliseconds as the column keeps them (checked at most an hour when granted).
fn ms_column(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn parse_list(text: &str) -> Result<Vec<String>> {
    serde_json::from_str(text).map_err(|e| Error::Decode(format!("a grant's list is not a JSON array: {e}")))
}

pub async fn set(conn: &mut SqliteConnection, grant: &NewGrant, now: i64) -> Result<bool> {
    let existed: Option<i64> = sqlx::query_scalar("SELECT 1 FROM outbound_grants WHERE job_type = $1 AND origin = $2")
        .bind(&grant.job_type)
        .bind(&grant.origin)
        .fetch_optional(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO outbound_grants (job_type, origin, methods, secrets, private, idempotency_key, granted_at,
                                      connect_timeout_ms, first_byte_timeout_ms, between_bytes_timeout_ms, secrets_in,
                                      secret_headers)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         ON CONFLICT (job_type, origin) DO UPDATE
            SET methods = excluded.methods, secrets = excluded.secrets, private = excluded.private,
                idempotency_key = excluded.idempotency_key, granted_at = excluded.granted_at,
                connect_timeout_ms = excluded.connect_timeout_ms,
                first_byte_timeout_ms = excluded.first_byte_timeout_ms,
                between_bytes_timeout_ms = excluded.between_bytes_timeout_ms, secrets_in = excluded.secrets_in,
                secret_headers = excluded.secret_headers",
    )
    .bind(&grant.job_type)
    .bind(&grant.origin)
    .bind(json_list(&grant.methods))
    .bind(json_list(&grant.secrets))
    .bind(grant.private)
    .bind(grant.idempotency_key)
    .bind(now)
    .bind(grant.timeouts.connect_ms.map(ms_column))
    .bind(grant.timeouts.first_byte_ms.map(ms_column))
    .bind(grant.timeouts.between_bytes_ms.map(ms_column))
    .bind(json_list(&grant.secrets_in))
    .bind(json_list(&grant.secret_headers))
    .execute(conn)
    .await?;
    Ok(existed.is_some())
}

pub async fn revoke(conn: &mut SqliteConnection, job_type: &str, origin: &str) -> Result<bool> {
    let removed = sqlx::query("DELETE FROM outbound_grants WHERE job_type = $1 AND origin = $2")
        .bind(job_type)
        .bind(origin)
        .execute(conn)
        .await?;
    Ok(removed.rows_affected() > 0)
}

pub async fn list(pool: &SqlitePool, job_type: Option<&str>) -> Result<Vec<OutboundGrant>> {
    let rows: Vec<GrantRow> = sqlx::query_as(
        "SELECT job_type, origin, methods, secrets, private, idempotency_key, connect_timeout_ms,
                first_byte_timeout_ms, between_bytes_timeout_ms, secrets_in, secret_headers, granted_at
         FROM outbound_grants
         WHERE $1 IS NULL OR job_type = $1 ORDER BY job_type, origin",
    )
    .bind(job_type)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(OutboundGrant {
                job_type: row.job_type,
                origin: row.origin,
                methods: parse_list(&row.methods)?,
                secrets: parse_list(&row.secrets)?,
                private: row.private,
                idempotency_key: row.idempotency_key,
                timeouts: GrantTimeouts {
                    connect_ms: row.connect_timeout_ms.map(|ms| ms as u64),
                    first_byte_ms: row.first_byte_timeout_ms.map(|ms| ms as u64),
                    between_bytes_ms: row.between_bytes_timeout_ms.map(|ms| ms as u64),
                },
                secrets_in: parse_list(&row.secrets_in)?,
                secret_headers: parse_list(&row.secret_headers)?,
                granted_at: super::time_of(row.granted_at),
            })
        })
        .collect()
}

struct GrantRow {
    job_type: String,
    origin: String,
    methods: String,
    secrets: String,
    private: bool,
    idempotency_key: bool,
    connect_timeout_ms: Option<i64>,
    first_byte_timeout_ms: Option<i64>,
    between_bytes_timeout_ms: Option<i64>,
    secrets_in: String,
    secret_headers: String,
    granted_at: i64,
}

from_row!(
    sqlx::sqlite::SqliteRow,
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

#[async_trait]
impl GrantDriver for SqliteStore {
    async fn grant_set(&self, change: &Change<'_>, new: &crate::store::grant::NewGrant) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| set(tx, new, now_ms()).await).await
    }

    async fn grant_revoke(&self, change: &Change<'_>, job_type: &str, origin: &str) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| revoke(tx, job_type, origin).await).await
    }

    async fn grants(&self, job_type: Option<&str>) -> Result<Vec<crate::store::grant::OutboundGrant>> {
        list(&self.reader, job_type).await
    }
}
