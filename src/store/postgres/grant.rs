//! Outbound grants in PostgreSQL.

use sqlx::PgPool;

use crate::store::Result;
use chrono::{DateTime, Utc};

use crate::store::grant::{NewGrant, OutboundGrant};
use crate::store::secret::{Sealed, SecretInfo};

pub async fn set(pool: &PgPool, grant: &NewGrant) -> Result<bool> {
    // `xmax <> 0` on the returned row: the insert met the old row and updated it.
    let replaced: bool = sqlx::query_scalar(
        "INSERT INTO jobhost.outbound_grants (job_type, origin, methods, secrets, private, idempotency_key)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (job_type, origin) DO UPDATE
            SET methods = EXCLUDED.methods, secrets = EXCLUDED.secrets, private = EXCLUDED.private,
                idempotency_key = EXCLUDED.idempotency_key, granted_at = now()
         RETURNING xmax <> 0",
    )
    .bind(&grant.job_type)
    .bind(&grant.origin)
    .bind(&grant.methods)
    .bind(&grant.secrets)
    .bind(grant.private)
    .bind(grant.idempotency_key)
    .fetch_one(pool)
    .await?;
    Ok(replaced)
}

pub async fn revoke(pool: &PgPool, job_type: &str, origin: &str) -> Result<bool> {
    let removed = sqlx::query("DELETE FROM jobhost.outbound_grants WHERE job_type = $1 AND origin = $2")
        .bind(job_type)
        .bind(origin)
        .execute(pool)
        .await?;
    Ok(removed.rows_affected() > 0)
}

pub async fn list(pool: &PgPool, job_type: Option<&str>) -> Result<Vec<OutboundGrant>> {
    let rows: Vec<GrantRow> = sqlx::query_as(
        "SELECT job_type, origin, methods, secrets, private, idempotency_key, granted_at FROM jobhost.outbound_grants
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
            granted_at: row.granted_at,
        })
        .collect())
}

#[derive(sqlx::FromRow)]
struct GrantRow {
    job_type: String,
    origin: String,
    methods: Vec<String>,
    secrets: Vec<String>,
    private: bool,
    idempotency_key: bool,
    granted_at: chrono::DateTime<chrono::Utc>,
}

pub async fn secret_set(pool: &PgPool, name: &str, sealed: &Sealed) -> Result<bool> {
    let replaced: bool = sqlx::query_scalar(
        "INSERT INTO jobhost.outbound_secrets (name, key_id, nonce, ciphertext) VALUES ($1, $2, $3, $4)
         ON CONFLICT (name) DO UPDATE
            SET key_id = EXCLUDED.key_id, nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext, updated_at = now()
         RETURNING xmax <> 0",
    )
    .bind(name)
    .bind(&sealed.key_id)
    .bind(&sealed.nonce)
    .bind(&sealed.ciphertext)
    .fetch_one(pool)
    .await?;
    Ok(replaced)
}

pub async fn secret_delete(pool: &PgPool, name: &str) -> Result<bool> {
    let removed = sqlx::query("DELETE FROM jobhost.outbound_secrets WHERE name = $1").bind(name).execute(pool).await?;
    Ok(removed.rows_affected() > 0)
}

pub async fn secrets_list(pool: &PgPool) -> Result<Vec<SecretInfo>> {
    let rows: Vec<(String, String, DateTime<Utc>, DateTime<Utc>)> =
        sqlx::query_as("SELECT name, key_id, created_at, updated_at FROM jobhost.outbound_secrets ORDER BY name")
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(name, key_id, created_at, updated_at)| SecretInfo { name, key_id, created_at, updated_at })
        .collect())
}

pub async fn secrets_sealed(pool: &PgPool, names: &[String]) -> Result<Vec<(String, Sealed)>> {
    let rows: Vec<(String, String, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT name, key_id, nonce, ciphertext FROM jobhost.outbound_secrets WHERE name = ANY($1) ORDER BY name",
    )
    .bind(names)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(name, key_id, nonce, ciphertext)| (name, Sealed { key_id, nonce, ciphertext })).collect())
}
