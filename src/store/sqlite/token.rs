//! Named access tokens in SQLite, by this machine's clock (ms).

use async_trait::async_trait;
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::{json_list, now_ms, time_of};
use crate::store::audit::Change;
use crate::store::driver::TokenDriver;
use crate::store::token::{Created, NewToken, Role, TOUCH_EVERY_SECS, TokenHolder, TokenInfo};
use crate::store::{Error, Result};

pub async fn create(conn: &mut SqliteConnection, token: &NewToken, now: i64) -> Result<Created> {
    // A revoked or expired token's name may be taken again; its sessions
    // end with it, so none carries over to the new token.
    sqlx::query(
        "DELETE FROM http_sessions WHERE token_name = $1
           AND EXISTS (SELECT 1 FROM access_tokens
                       WHERE name = $1 AND (revoked_at IS NOT NULL OR expires_at <= $2))",
    )
    .bind(&token.name)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    let made = sqlx::query(
        "INSERT INTO access_tokens (name, digest, role, queues, payloads, expires_at, created_by, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (name) DO UPDATE
            SET digest = excluded.digest, role = excluded.role, queues = excluded.queues,
                payloads = excluded.payloads, expires_at = excluded.expires_at, created_by = excluded.created_by,
                created_at = excluded.created_at, revoked_at = NULL, last_used_at = NULL
            WHERE access_tokens.revoked_at IS NOT NULL OR access_tokens.expires_at <= excluded.created_at",
    )
    .bind(&token.name)
    .bind(&token.digest)
    .bind(token.role.as_str())
    .bind(token.queues.as_deref().map(json_list))
    .bind(token.payloads)
    .bind(token.expires_at.map(|t| t.timestamp_millis()))
    .bind(&token.created_by)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(if made.rows_affected() == 1 { Created::Made } else { Created::NameTaken })
}

pub async fn revoke(conn: &mut SqliteConnection, name: &str, now: i64) -> Result<bool> {
    let revoked = sqlx::query("UPDATE access_tokens SET revoked_at = $2 WHERE name = $1 AND revoked_at IS NULL")
        .bind(name)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM http_sessions WHERE token_name = $1").bind(name).execute(conn).await?;
    Ok(revoked.rows_affected() > 0)
}

/// The role a stored name stands for; the schema admits no other.
pub fn role_of(name: &str) -> Result<Role> {
    Role::parse(name).ok_or_else(|| Error::Decode(format!("a token has an unknown role {name:?}")))
}

/// A stored queue list: a JSON array of names, or NULL for every queue.
pub fn queues_of(text: Option<String>) -> Result<Option<Vec<String>>> {
    text.map(|text| {
        serde_json::from_str(&text).map_err(|error| Error::Decode(format!("a token's queues do not read: {error}")))
    })
    .transpose()
}

type InfoRow = (String, String, Option<String>, bool, i64, String, Option<i64>, Option<i64>, Option<i64>);

pub async fn list(pool: &SqlitePool) -> Result<Vec<TokenInfo>> {
    let rows: Vec<InfoRow> = sqlx::query_as(
        "SELECT name, role, queues, payloads, created_at, created_by, expires_at, revoked_at, last_used_at
         FROM access_tokens ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(name, role, queues, payloads, created_at, created_by, expires_at, revoked_at, last_used_at)| {
            Ok(TokenInfo {
                name,
                role: role_of(&role)?,
                queues: queues_of(queues)?,
                payloads,
                created_at: time_of(created_at),
                created_by,
                expires_at: expires_at.map(time_of),
                revoked_at: revoked_at.map(time_of),
                last_used_at: last_used_at.map(time_of),
            })
        })
        .collect()
}

type HolderRow = (String, String, Option<String>, bool, bool);

/// The live token with `digest` at `now`, and whether its use is to be recorded.
pub async fn holder(pool: &SqlitePool, digest: &str, now: i64) -> Result<Option<(TokenHolder, bool)>> {
    let row: Option<HolderRow> = sqlx::query_as(
        "SELECT name, role, queues, payloads, last_used_at IS NULL OR last_used_at < $3
         FROM access_tokens
         WHERE digest = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $2)",
    )
    .bind(digest)
    .bind(now)
    .bind(now - (TOUCH_EVERY_SECS * 1000.0) as i64)
    .fetch_optional(pool)
    .await?;
    let Some((name, role, queues, payloads, stale)) = row else { return Ok(None) };
    Ok(Some((TokenHolder { name, role: role_of(&role)?, queues: queues_of(queues)?, payloads }, stale)))
}

pub async fn touch(conn: &mut SqliteConnection, name: &str, now: i64) -> Result<()> {
    sqlx::query("UPDATE access_tokens SET last_used_at = $2 WHERE name = $1")
        .bind(name)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(())
}

#[async_trait]
impl TokenDriver for SqliteStore {
    async fn token_create(&self, change: &Change<'_>, token: &NewToken) -> Result<Created> {
        self.audited_outside_jobs(change, async |tx| create(tx, token, now_ms()).await).await
    }

    async fn token_revoke(&self, change: &Change<'_>, name: &str) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| revoke(tx, name, now_ms()).await).await
    }

    async fn tokens(&self) -> Result<Vec<TokenInfo>> {
        list(&self.reader).await
    }

    async fn token_holder(&self, digest: &str) -> Result<Option<TokenHolder>> {
        let now = now_ms();
        let Some((holder, stale)) = holder(&self.reader, digest, now).await? else {
            return Ok(None);
        };
        // Recording the use is a courtesy to `token list`: a failure to
        // write it (the file's writer busy) refuses no one.
        if stale && let Err(error) = self.write_outside_jobs(async |tx| touch(tx, &holder.name, now).await).await {
            tracing::debug!(%error, token = holder.name, "could not record a token's use");
        }
        Ok(Some(holder))
    }
}
