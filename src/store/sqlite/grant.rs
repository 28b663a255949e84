//! Outbound grants in SQLite; methods and secrets as JSON arrays.

use sqlx::{SqliteConnection, SqlitePool};

use crate::store::grant::{NewGrant, OutboundGrant};
use crate::store::secret::{Sealed, SecretInfo};
use crate::store::{Error, Result};

fn json_list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_string())
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
        "INSERT INTO outbound_grants (job_type, origin, methods, secrets, private, idempotency_key, granted_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (job_type, origin) DO UPDATE
            SET methods = excluded.methods, secrets = excluded.secrets, private = excluded.private,
                idempotency_key = excluded.idempotency_key, granted_at = excluded.granted_at",
    )
    .bind(&grant.job_type)
    .bind(&grant.origin)
    .bind(json_list(&grant.methods))
    .bind(json_list(&grant.secrets))
    .bind(grant.private)
    .bind(grant.idempotency_key)
    .bind(now)
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
        "SELECT job_type, origin, methods, secrets, private, idempotency_key, granted_at FROM outbound_grants
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
                granted_at: super::time_of(row.granted_at),
            })
        })
        .collect()
}

#[derive(sqlx::FromRow)]
struct GrantRow {
    job_type: String,
    origin: String,
    methods: String,
    secrets: String,
    private: bool,
    idempotency_key: bool,
    granted_at: i64,
}

pub async fn secret_set(conn: &mut SqliteConnection, name: &str, sealed: &Sealed, now: i64) -> Result<bool> {
    let existed: Option<i64> = sqlx::query_scalar("SELECT 1 FROM outbound_secrets WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO outbound_secrets (name, key_id, nonce, ciphertext, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $5)
         ON CONFLICT (name) DO UPDATE
            SET key_id = excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext,
                updated_at = excluded.updated_at",
    )
    .bind(name)
    .bind(&sealed.key_id)
    .bind(&sealed.nonce)
    .bind(&sealed.ciphertext)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(existed.is_some())
}

pub async fn secret_delete(conn: &mut SqliteConnection, name: &str) -> Result<bool> {
    let removed = sqlx::query("DELETE FROM outbound_secrets WHERE name = $1").bind(name).execute(conn).await?;
    Ok(removed.rows_affected() > 0)
}

pub async fn secrets_list(pool: &SqlitePool) -> Result<Vec<SecretInfo>> {
    let rows: Vec<(String, String, i64, i64)> =
        sqlx::query_as("SELECT name, key_id, created_at, updated_at FROM outbound_secrets ORDER BY name")
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(name, key_id, created, updated)| SecretInfo {
            name,
            key_id,
            created_at: super::time_of(created),
            updated_at: super::time_of(updated),
        })
        .collect())
}

pub async fn secrets_sealed(pool: &SqlitePool, names: &[String]) -> Result<Vec<(String, Sealed)>> {
    let mut found = Vec::new();
    for name in names {
        let row: Option<(String, Vec<u8>, Vec<u8>)> =
            sqlx::query_as("SELECT key_id, nonce, ciphertext FROM outbound_secrets WHERE name = $1")
                .bind(name)
                .fetch_optional(pool)
                .await?;
        if let Some((key_id, nonce, ciphertext)) = row {
            found.push((name.clone(), Sealed { key_id, nonce, ciphertext }));
        }
    }
    Ok(found)
}
