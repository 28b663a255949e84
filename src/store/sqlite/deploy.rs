//! Components deployed through the database, in SQLite
//! (migrations/sqlite/0008_deployments.sql). A change runs in a write
//! transaction, which holds the file's one write lock: changes to a type
//! are decided one after the other, each on the history the other left.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::types::Json;
use sqlx::{SqliteConnection, SqlitePool};

use super::DEPLOYMENT_LOOK;
use super::SqliteStore;
use super::{now_ms, time_of};
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::deploy::{self, DeployAction, DeployChange, DeployRequest, Deployment, DeploymentEntry};
use crate::store::driver::DeployDriver;
use crate::types::JobConfig;

type EntryRow = (i64, String, Option<String>, String, i64);

/// Decides and records `request`, in the caller's write transaction.
/// Returns the change and how many blocked jobs the served version's
/// registered limit promoted.
pub async fn apply(
    conn: &mut SqliteConnection,
    job_type: &str,
    request: DeployRequest<'_>,
) -> Result<(DeployChange, u64)> {
    let history = history_in(&mut *conn, job_type).await?;
    let (mut change, action) = deploy::decide(job_type, &history, request)?;
    let now = now_ms();
    if let DeployRequest::Deploy { digest, bytes, config } = request {
        // Written when new, or when the stored bytes differ from these
        // validated ones: then they were damaged, and are repaired.
        let written: Option<String> = sqlx::query_scalar(
            "INSERT INTO component_sources (digest, job_type, bytes, config, uploaded_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (digest) DO UPDATE SET bytes = excluded.bytes
             WHERE component_sources.bytes <> excluded.bytes
             RETURNING digest",
        )
        .bind(digest)
        .bind(job_type)
        .bind(bytes)
        .bind(Json(config))
        .bind(now)
        .fetch_optional(&mut *conn)
        .await?;
        change.changed |= written.is_some();
    }
    if !change.changed {
        return Ok((change, 0));
    }
    sqlx::query("INSERT INTO deployments (job_type, digest, action, at) VALUES ($1, $2, $3, $4)")
        .bind(job_type)
        .bind(&change.current)
        .bind(action.as_str())
        .bind(now)
        .execute(&mut *conn)
        .await?;
    let promoted = match &change.current {
        Some(digest) => register_served(conn, job_type, digest, now).await?,
        None => 0,
    };
    Ok((change, promoted))
}

/// Registers the configuration of the version now served, as its newest:
/// enqueues apply it at once, before any host has loaded it, and a
/// rollback brings back the settings of the version it serves (the
/// forward-only rule of 0003 would otherwise keep a later-seen version's).
async fn register_served(conn: &mut SqliteConnection, job_type: &str, digest: &str, now: i64) -> Result<u64> {
    let Json(config): Json<JobConfig> = sqlx::query_scalar("SELECT config FROM component_sources WHERE digest = $1")
        .bind(digest)
        .fetch_one(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO job_type_digests (id, name, digest, first_registered_at)
         VALUES ((SELECT coalesce(max(id), 0) + 1 FROM job_type_digests), $1, $2, $3)
         ON CONFLICT (name, digest) DO UPDATE SET id = (SELECT max(id) + 1 FROM job_type_digests)",
    )
    .bind(job_type)
    .bind(digest)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    let (_, promoted) = super::fleet::job_types_register(conn, &[(config, digest.to_string())]).await?;
    Ok(promoted)
}

pub async fn current(pool: &SqlitePool) -> Result<Vec<Deployment>> {
    let rows: Vec<(i64, String, String, i64, i64, String)> = sqlx::query_as(
        "SELECT d.id, d.job_type, d.digest, length(s.bytes), d.at, d.action
         FROM deployments d
         JOIN component_sources s ON s.digest = d.digest
         WHERE d.id = (SELECT max(id) FROM deployments n WHERE n.job_type = d.job_type)
         ORDER BY d.job_type",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(entry, job_type, digest, size_bytes, at, action)| {
            let action = DeployAction::parse(&action)?;
            Ok(Deployment { entry, job_type, digest, size_bytes, deployed_at: time_of(at), action })
        })
        .collect()
}

pub async fn history_in(executor: impl sqlx::SqliteExecutor<'_>, job_type: &str) -> Result<Vec<DeploymentEntry>> {
    let rows: Vec<EntryRow> =
        sqlx::query_as("SELECT id, job_type, digest, action, at FROM deployments WHERE job_type = $1 ORDER BY id DESC")
            .bind(job_type)
            .fetch_all(executor)
            .await?;
    rows.into_iter()
        .map(|(id, job_type, digest, action, at)| {
            Ok(DeploymentEntry { id, job_type, digest, action: DeployAction::parse(&action)?, at: time_of(at) })
        })
        .collect()
}

pub async fn source(pool: &SqlitePool, digest: &str) -> Result<Option<Vec<u8>>> {
    Ok(sqlx::query_scalar("SELECT bytes FROM component_sources WHERE digest = $1")
        .bind(digest)
        .fetch_optional(pool)
        .await?)
}

#[async_trait]
impl DeployDriver for SqliteStore {
    async fn deployment_change(
        &self,
        audit: &Change<'_>,
        job_type: &str,
        request: DeployRequest<'_>,
    ) -> Result<DeployChange> {
        let (change, promoted) = self
            .write_with(async |tx| {
                let (change, promoted) = apply(tx, job_type, request).await?;
                super::audit::record(tx, audit, &change).await?;
                Ok((change, promoted))
            })
            .await?;
        self.announce(promoted > 0);
        Ok(change)
    }

    async fn deployments_current(&self) -> Result<Vec<Deployment>> {
        current(&self.reader).await
    }

    async fn deployment_history(&self, job_type: &str) -> Result<Vec<DeploymentEntry>> {
        history_in(&self.reader, job_type).await
    }

    async fn component_source(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        source(&self.reader, digest).await
    }

    async fn deployments_wait(&self, timeout: Duration) {
        // Another process's change shows only by looking; the look is one
        // indexed read of the newest entry.
        tokio::time::sleep(timeout.min(DEPLOYMENT_LOOK)).await;
    }
}
