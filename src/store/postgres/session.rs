//! The dashboard's sessions in PostgreSQL, by the database's clock.

use async_trait::async_trait;
use sqlx::PgPool;

use super::PgStore;
use crate::store::Result;
use crate::store::driver::SessionDriver;
use crate::store::session::{SessionLifetime, TOUCH_EVERY_SECS};

pub async fn create(pool: &PgPool, digest: &str, lifetime: SessionLifetime) -> Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "DELETE FROM jobhost.http_sessions
         WHERE created_at < now() - $1 * interval '1 second' OR last_seen_at < now() - $2 * interval '1 second'",
    )
    .bind(lifetime.absolute.as_secs_f64())
    .bind(lifetime.idle.as_secs_f64())
    .execute(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO jobhost.http_sessions (digest) VALUES ($1)").bind(digest).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn check(pool: &PgPool, digest: &str, lifetime: SessionLifetime) -> Result<bool> {
    // A read; a write only once a session's last record is a minute old.
    let stale: Option<bool> = sqlx::query_scalar(
        "SELECT last_seen_at < now() - $4 * interval '1 second' FROM jobhost.http_sessions
         WHERE digest = $1 AND created_at >= now() - $2 * interval '1 second'
           AND last_seen_at >= now() - $3 * interval '1 second'",
    )
    .bind(digest)
    .bind(lifetime.absolute.as_secs_f64())
    .bind(lifetime.idle.as_secs_f64())
    .bind(TOUCH_EVERY_SECS)
    .fetch_optional(pool)
    .await?;
    if stale == Some(true) {
        sqlx::query("UPDATE jobhost.http_sessions SET last_seen_at = now() WHERE digest = $1")
            .bind(digest)
            .execute(pool)
            .await?;
    }
    Ok(stale.is_some())
}

pub async fn revoke(pool: &PgPool, digest: &str) -> Result<()> {
    sqlx::query("DELETE FROM jobhost.http_sessions WHERE digest = $1").bind(digest).execute(pool).await?;
    Ok(())
}

#[async_trait]
impl SessionDriver for PgStore {
    async fn session_create(&self, digest: &str, lifetime: SessionLifetime) -> Result<()> {
        create(&self.pool, digest, lifetime).await
    }

    async fn session_check(&self, digest: &str, lifetime: SessionLifetime) -> Result<bool> {
        check(&self.pool, digest, lifetime).await
    }

    async fn session_revoke(&self, digest: &str) -> Result<()> {
        revoke(&self.pool, digest).await
    }
}
