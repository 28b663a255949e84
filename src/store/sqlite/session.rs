//! The dashboard's sessions in SQLite, by this machine's clock (ms).

use async_trait::async_trait;
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use crate::store::Result;
use crate::store::driver::SessionDriver;
use crate::store::session::{SessionLifetime, TOUCH_EVERY_SECS};

fn ms(duration: std::time::Duration) -> i64 {
    duration.as_millis().min(i64::MAX as u128) as i64
}

pub async fn create(conn: &mut SqliteConnection, digest: &str, lifetime: SessionLifetime, now: i64) -> Result<()> {
    sqlx::query("DELETE FROM http_sessions WHERE created_at < $1 - $2 OR last_seen_at < $1 - $3")
        .bind(now)
        .bind(ms(lifetime.absolute))
        .bind(ms(lifetime.idle))
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO http_sessions (digest, created_at, last_seen_at) VALUES ($1, $2, $2)")
        .bind(digest)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether the session is valid at `now`, and whether its use is to be recorded.
pub async fn check(pool: &SqlitePool, digest: &str, lifetime: SessionLifetime, now: i64) -> Result<Option<bool>> {
    Ok(sqlx::query_scalar(
        "SELECT last_seen_at < $4 FROM http_sessions
         WHERE digest = $1 AND created_at >= $2 AND last_seen_at >= $3",
    )
    .bind(digest)
    .bind(now - ms(lifetime.absolute))
    .bind(now - ms(lifetime.idle))
    .bind(now - (TOUCH_EVERY_SECS * 1000.0) as i64)
    .fetch_optional(pool)
    .await?)
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
    async fn session_create(&self, digest: &str, lifetime: SessionLifetime) -> Result<()> {
        self.write_outside_jobs(async |tx| create(tx, digest, lifetime, now_ms()).await).await
    }

    async fn session_check(&self, digest: &str, lifetime: SessionLifetime) -> Result<bool> {
        let now = now_ms();
        let Some(stale) = check(&self.reader, digest, lifetime, now).await? else {
            return Ok(false);
        };
        if stale {
            self.write_outside_jobs(async |tx| touch(tx, digest, now).await).await?;
        }
        Ok(true)
    }

    async fn session_revoke(&self, digest: &str) -> Result<()> {
        self.write_outside_jobs(async |tx| revoke(tx, digest).await).await
    }
}
