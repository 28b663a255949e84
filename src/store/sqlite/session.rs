//! The dashboard's sessions in SQLite, by this machine's clock (ms).

use async_trait::async_trait;
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use crate::store::Result;
use crate::store::driver::SessionDriver;
use crate::store::session::{SessionLifetime, SignedIn, SignedInWith, TOUCH_EVERY_SECS};
use crate::store::token::TokenHolder;

fn ms(duration: std::time::Duration) -> i64 {
    duration.as_millis().min(i64::MAX as u128) as i64
}

pub async fn create(
    conn: &mut SqliteConnection,
    digest: &str,
    lifetime: SessionLifetime,
    token: Option<&SignedInWith>,
    now: i64,
) -> Result<bool> {
    sqlx::query("DELETE FROM http_sessions WHERE created_at < $1 - $2 OR last_seen_at < $1 - $3")
        .bind(now)
        .bind(ms(lifetime.absolute))
        .bind(ms(lifetime.idle))
        .execute(&mut *conn)
        .await?;
    // A named token's session starts only while that very token is live.
    let started = sqlx::query(
        "INSERT INTO http_sessions (digest, created_at, last_seen_at, token_name)
         SELECT $1, $2, $2, $3 WHERE $3 IS NULL
            OR EXISTS (SELECT 1 FROM access_tokens
                       WHERE name = $3 AND digest = $4 AND revoked_at IS NULL
                         AND (expires_at IS NULL OR expires_at > $2))",
    )
    .bind(digest)
    .bind(now)
    .bind(token.map(|t| &t.name))
    .bind(token.map(|t| &t.digest))
    .execute(conn)
    .await?;
    Ok(started.rows_affected() == 1)
}

type CheckRow = (bool, Option<String>, Option<String>, Option<String>, Option<bool>);

/// The session if it is valid at `now` (a named token's only while the
/// token is), and whether its use is to be recorded.
pub async fn check(
    pool: &SqlitePool,
    digest: &str,
    lifetime: SessionLifetime,
    now: i64,
) -> Result<Option<(SignedIn, bool)>> {
    let row: Option<CheckRow> = sqlx::query_as(
        "SELECT s.last_seen_at < $4, t.name, t.role, t.queues, t.payloads
         FROM http_sessions s LEFT JOIN access_tokens t ON t.name = s.token_name
         WHERE s.digest = $1 AND s.created_at >= $2 AND s.last_seen_at >= $3
           AND (s.token_name IS NULL
                OR (t.name IS NOT NULL AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > $5)))",
    )
    .bind(digest)
    .bind(now - ms(lifetime.absolute))
    .bind(now - ms(lifetime.idle))
    .bind(now - (TOUCH_EVERY_SECS * 1000.0) as i64)
    .bind(now)
    .fetch_optional(pool)
    .await?;
    let Some((stale, name, role, queues, payloads)) = row else { return Ok(None) };
    let token = match (name, role) {
        (Some(name), Some(role)) => Some(TokenHolder {
            name,
            role: super::token::role_of(&role)?,
            queues: super::token::queues_of(queues)?,
            payloads: payloads.unwrap_or(false),
        }),
        _ => None,
    };
    Ok(Some((SignedIn { token }, stale)))
}

pub async fn touch(conn: &mut SqliteConnection, digest: &str, now: i64) -> Result<()> {
    sqlx::query("UPDATE http_sessions SET last_seen_at = $2 WHERE digest = $1")
        .bind(digest)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn revoke(conn: &mut SqliteConnection, digest: &str) -> Result<()> {
    sqlx::query("DELETE FROM http_sessions WHERE digest = $1").bind(digest).execute(conn).await?;
    Ok(())
}

#[async_trait]
impl SessionDriver for SqliteStore {
    async fn session_create(
        &self,
        digest: &str,
        lifetime: SessionLifetime,
        token: Option<&SignedInWith>,
    ) -> Result<bool> {
        self.write_outside_jobs(async |tx| create(tx, digest, lifetime, token, now_ms()).await).await
    }

    async fn session_check(&self, digest: &str, lifetime: SessionLifetime) -> Result<Option<SignedIn>> {
        let now = now_ms();
        let Some((signed_in, stale)) = check(&self.reader, digest, lifetime, now).await? else {
            return Ok(None);
        };
        if stale {
            self.write_outside_jobs(async |tx| touch(tx, digest, now).await).await?;
        }
        Ok(Some(signed_in))
    }

    async fn session_revoke(&self, digest: &str) -> Result<()> {
        self.write_outside_jobs(async |tx| revoke(tx, digest).await).await
    }
}
