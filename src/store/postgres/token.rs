//! Named access tokens in PostgreSQL, by the database's clock.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::PgStore;
use crate::store::audit::Change;
use crate::store::driver::TokenDriver;
use crate::store::token::{Created, NewToken, Role, TOUCH_EVERY_SECS, TokenHolder, TokenInfo};
use crate::store::{Error, Result};

pub async fn create(pool: &PgPool, change: &Change<'_>, token: &NewToken) -> Result<Created> {
    let mut tx = pool.begin().await?;
    // A revoked or expired token's name may be taken again; its sessions
    // end with it, so none carries over to the new token.
    sqlx::query(
        "DELETE FROM jobhost.http_sessions WHERE token_name = $1
           AND EXISTS (SELECT 1 FROM jobhost.access_tokens
                       WHERE name = $1 AND (revoked_at IS NOT NULL OR expires_at <= now()))",
    )
    .bind(&token.name)
    .execute(&mut *tx)
    .await?;
    let made = sqlx::query(
        "INSERT INTO jobhost.access_tokens (name, digest, role, queues, payloads, expires_at, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (name) DO UPDATE
            SET digest = EXCLUDED.digest, role = EXCLUDED.role, queues = EXCLUDED.queues,
                payloads = EXCLUDED.payloads, expires_at = EXCLUDED.expires_at, created_by = EXCLUDED.created_by,
                created_at = now(), revoked_at = NULL, last_used_at = NULL
            WHERE access_tokens.revoked_at IS NOT NULL OR access_tokens.expires_at <= now()",
    )
    .bind(&token.name)
    .bind(&token.digest)
    .bind(token.role.as_str())
    .bind(&token.queues)
    .bind(token.payloads)
    .bind(token.expires_at)
    .bind(&token.created_by)
    .execute(&mut *tx)
    .await?;
    let created = if made.rows_affected() == 1 { Created::Made } else { Created::NameTaken };
    super::audit::record(&mut tx, change, &created).await?;
    tx.commit().await?;
    Ok(created)
}

pub async fn revoke(pool: &PgPool, change: &Change<'_>, name: &str) -> Result<bool> {
    let mut tx = pool.begin().await?;
    let revoked =
        sqlx::query("UPDATE jobhost.access_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL")
            .bind(name)
            .execute(&mut *tx)
            .await?;
    sqlx::query("DELETE FROM jobhost.http_sessions WHERE token_name = $1").bind(name).execute(&mut *tx).await?;
    let revoked = revoked.rows_affected() > 0;
    super::audit::record(&mut tx, change, &revoked).await?;
    tx.commit().await?;
    Ok(revoked)
}

type InfoRow = (
    String,
    String,
    Option<Vec<String>>,
    bool,
    DateTime<Utc>,
    String,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

pub async fn list(pool: &PgPool) -> Result<Vec<TokenInfo>> {
    let rows: Vec<InfoRow> = sqlx::query_as(
        "SELECT name, role, queues, payloads, created_at, created_by, expires_at, revoked_at, last_used_at
         FROM jobhost.access_tokens ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(name, role, queues, payloads, created_at, created_by, expires_at, revoked_at, last_used_at)| {
            Ok(TokenInfo {
                name,
                role: role_of(&role)?,
                queues,
                payloads,
                created_at,
                created_by,
                expires_at,
                revoked_at,
                last_used_at,
            })
        })
        .collect()
}

/// The role a stored name stands for; the schema admits no other.
pub fn role_of(name: &str) -> Result<Role> {
    Role::parse(name).ok_or_else(|| Error::Decode(format!("a token has an unknown role {name:?}")))
}

type HolderRow = (String, String, Option<Vec<String>>, bool, bool);

pub async fn holder(pool: &PgPool, digest: &str) -> Result<Option<TokenHolder>> {
    // A read; a write only once a token's last record is a minute old.
    let row: Option<HolderRow> = sqlx::query_as(
        "SELECT name, role, queues, payloads,
                last_used_at IS NULL OR last_used_at < now() - $2 * interval '1 second'
         FROM jobhost.access_tokens
         WHERE digest = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())",
    )
    .bind(digest)
    .bind(TOUCH_EVERY_SECS)
    .fetch_optional(pool)
    .await?;
    let Some((name, role, queues, payloads, stale)) = row else { return Ok(None) };
    // Recording the use is a courtesy to `token list`: a failure to write
    // it refuses no one.
    if stale
        && let Err(error) = sqlx::query("UPDATE jobhost.access_tokens SET last_used_at = now() WHERE name = $1")
            .bind(&name)
            .execute(pool)
            .await
    {
        tracing::debug!(%error, token = name, "could not record a token's use");
    }
    Ok(Some(TokenHolder { name, role: role_of(&role)?, queues, payloads }))
}

#[async_trait]
impl TokenDriver for PgStore {
    async fn token_create(&self, change: &Change<'_>, token: &NewToken) -> Result<Created> {
        create(&self.pool, change, token).await
    }

    async fn token_revoke(&self, change: &Change<'_>, name: &str) -> Result<bool> {
        revoke(&self.pool, change, name).await
    }

    async fn tokens(&self) -> Result<Vec<TokenInfo>> {
        list(&self.pool).await
    }

    async fn token_holder(&self, digest: &str) -> Result<Option<TokenHolder>> {
        holder(&self.pool, digest).await
    }
}
