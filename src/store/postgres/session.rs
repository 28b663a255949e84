//! The dashboard's sessions in PostgreSQL, by the database's clock.

use async_trait::async_trait;
use sqlx::PgPool;

use super::PgStore;
use crate::store::Result;
use crate::store::driver::SessionDriver;
use crate::store::session::{SessionLifetime, SignedIn, SignedInWith, TOUCH_EVERY_SECS};
use crate::store::token::TokenHolder;

pub async fn create(
    pool: &PgPool,
    digest: &str,
    lifetime: SessionLifetime,
    token: Option<&SignedInWith>,
) -> Result<bool> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "DELETE FROM jobhost.http_sessions
         WHERE created_at < now() - $1 * interval '1 second' OR last_seen_at < now() - $2 * interval '1 second'",
    )
    .bind(lifetime.absolute.as_secs_f64())
    .bind(lifetime.idle.as_secs_f64())
    .execute(&mut *tx)
    .await?;
    // A named token's session starts only while that very token is live;
    // the row is locked, so a revoke in flight is waited for and seen.
    let started = sqlx::query(
        "INSERT INTO jobhost.http_sessions (digest, token_name)
         SELECT $1, $2 WHERE $2::text IS NULL
            OR EXISTS (SELECT 1 FROM jobhost.access_tokens
                       WHERE name = $2 AND digest = $3 AND revoked_at IS NULL
                         AND (expires_at IS NULL OR expires_at > now())
                       FOR SHARE)",
    )
    .bind(digest)
    .bind(token.map(|t| &t.name))
    .bind(token.map(|t| &t.digest))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(started.rows_affected() == 1)
}

type CheckRow = (bool, Option<String>, Option<String>, Option<Vec<String>>, Option<bool>);

pub async fn check(pool: &PgPool, digest: &str, lifetime: SessionLifetime) -> Result<Option<SignedIn>> {
    // A read; a write only once a session's last record is a minute old. A
    // session of a named token lives only as long as the token does.
    let row: Option<CheckRow> = sqlx::query_as(
        "SELECT s.last_seen_at < now() - $4 * interval '1 second', t.name, t.role, t.queues, t.payloads
         FROM jobhost.http_sessions s LEFT JOIN jobhost.access_tokens t ON t.name = s.token_name
         WHERE s.digest = $1 AND s.created_at >= now() - $2 * interval '1 second'
           AND s.last_seen_at >= now() - $3 * interval '1 second'
           AND (s.token_name IS NULL
                OR (t.name IS NOT NULL AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())))",
    )
    .bind(digest)
    .bind(lifetime.absolute.as_secs_f64())
    .bind(lifetime.idle.as_secs_f64())
    .bind(TOUCH_EVERY_SECS)
    .fetch_optional(pool)
    .await?;
    let Some((stale, name, role, queues, payloads)) = row else { return Ok(None) };
    if stale {
        sqlx::query("UPDATE jobhost.http_sessions SET last_seen_at = now() WHERE digest = $1")
            .bind(digest)
            .execute(pool)
            .await?;
    }
    let token = match (name, role) {
        (Some(name), Some(role)) => {
            Some(TokenHolder { name, role: super::token::role_of(&role)?, queues, payloads: payloads.unwrap_or(false) })
        }
        _ => None,
    };
    Ok(Some(SignedIn { token }))
}

pub async fn revoke(pool: &PgPool, digest: &str) -> Result<()> {
    sqlx::query("DELETE FROM jobhost.http_sessions WHERE digest = $1").bind(digest).execute(pool).await?;
    Ok(())
}

#[async_trait]
impl SessionDriver for PgStore {
    async fn session_create(
        &self,
        digest: &str,
        lifetime: SessionLifetime,
        token: Option<&SignedInWith>,
    ) -> Result<bool> {
        create(&self.pool, digest, lifetime, token).await
    }

    async fn session_check(&self, digest: &str, lifetime: SessionLifetime) -> Result<Option<SignedIn>> {
        check(&self.pool, digest, lifetime).await
    }

    async fn session_revoke(&self, digest: &str) -> Result<()> {
        revoke(&self.pool, digest).await
    }
}
