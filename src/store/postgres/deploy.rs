//! Components deployed through the database, in PostgreSQL
//! (migrations/postgres/0010_deployments.sql). A change takes a
//! transaction-scoped advisory lock on its job type, so two operators'
//! changes to one type are decided one after the other, each on the
//! history the other left; its `NOTIFY` goes out when it commits.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};

use super::PgStore;
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::deploy::{self, DeployAction, DeployChange, DeployRequest, Deployment, DeploymentEntry};
use crate::store::driver::DeployDriver;
use crate::types::JobConfig;

/// The channel on which deployment changes name their job type.
pub const CHANNEL: &str = "jobhost_components";

type EntryRow = (i64, String, Option<String>, String, DateTime<Utc>);

pub async fn change(
    pool: &PgPool,
    audit: &Change<'_>,
    job_type: &str,
    request: DeployRequest<'_>,
) -> Result<DeployChange> {
    super::audit::audited(pool, audit, async |conn| apply(conn, job_type, request).await).await
}

async fn apply(conn: &mut PgConnection, job_type: &str, request: DeployRequest<'_>) -> Result<DeployChange> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('jobhost.deployments'), hashtext($1))")
        .bind(job_type)
        .execute(&mut *conn)
        .await?;
    let history = history_in(&mut *conn, job_type).await?;
    let (mut change, action) = deploy::decide(job_type, &history, request)?;
    if let DeployRequest::Deploy { digest, bytes, config } = request {
        // Written when new, or when the stored bytes differ from these
        // validated ones: then they were damaged, and are repaired.
        let written: Option<String> = sqlx::query_scalar(
            "INSERT INTO jobhost.component_sources (digest, job_type, bytes, config) VALUES ($1, $2, $3, $4)
             ON CONFLICT (digest) DO UPDATE SET bytes = excluded.bytes
             WHERE jobhost.component_sources.bytes <> excluded.bytes
             RETURNING digest",
        )
        .bind(digest)
        .bind(job_type)
        .bind(bytes)
        .bind(Json(config))
        .fetch_optional(&mut *conn)
        .await?;
        change.changed |= written.is_some();
    }
    if !change.changed {
        return Ok(change);
    }
    sqlx::query("INSERT INTO jobhost.deployments (job_type, digest, action) VALUES ($1, $2, $3)")
        .bind(job_type)
        .bind(&change.current)
        .bind(action.as_str())
        .execute(&mut *conn)
        .await?;
    if let Some(digest) = &change.current {
        register_served(conn, job_type, digest).await?;
    }
    sqlx::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(job_type).execute(&mut *conn).await?;
    Ok(change)
}

/// Registers the configuration of the version now served, as its newest:
/// enqueues apply it at once, before any host has loaded it, and a
/// rollback brings back the settings of the version it serves.
async fn register_served(conn: &mut PgConnection, job_type: &str, digest: &str) -> Result<()> {
    let Json(config): Json<JobConfig> =
        sqlx::query_scalar("SELECT config FROM jobhost.component_sources WHERE digest = $1")
            .bind(digest)
            .fetch_one(&mut *conn)
            .await?;
    super::fleet::renumber_as_newest(conn, job_type, digest).await?;
    super::fleet::register_in(conn, &[(config, digest.to_string())]).await?;
    Ok(())
}

pub async fn current(pool: &PgPool) -> Result<Vec<Deployment>> {
    let rows: Vec<(i64, String, String, i64, DateTime<Utc>, String)> = sqlx::query_as(
        "SELECT d.id, d.job_type, d.digest, octet_length(s.bytes)::bigint, d.at, d.action
         FROM (SELECT DISTINCT ON (job_type) id, job_type, digest, at, action
               FROM jobhost.deployments ORDER BY job_type, id DESC) d
         JOIN jobhost.component_sources s ON s.digest = d.digest
         ORDER BY d.job_type",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(entry, job_type, digest, size_bytes, deployed_at, action)| {
            Ok(Deployment { entry, job_type, digest, size_bytes, deployed_at, action: DeployAction::parse(&action)? })
        })
        .collect()
}

pub async fn history(pool: &PgPool, job_type: &str) -> Result<Vec<DeploymentEntry>> {
    history_in(pool, job_type).await
}

async fn history_in(executor: impl sqlx::PgExecutor<'_>, job_type: &str) -> Result<Vec<DeploymentEntry>> {
    let rows: Vec<EntryRow> = sqlx::query_as(
        "SELECT id, job_type, digest, action, at FROM jobhost.deployments WHERE job_type = $1 ORDER BY id DESC",
    )
    .bind(job_type)
    .fetch_all(executor)
    .await?;
    rows.into_iter().map(entry_of).collect()
}

pub async fn source(pool: &PgPool, digest: &str) -> Result<Option<Vec<u8>>> {
    Ok(sqlx::query_scalar("SELECT bytes FROM jobhost.component_sources WHERE digest = $1")
        .bind(digest)
        .fetch_optional(pool)
        .await?)
}

fn entry_of((id, job_type, digest, action, at): EntryRow) -> Result<DeploymentEntry> {
    Ok(DeploymentEntry { id, job_type, digest, action: DeployAction::parse(&action)?, at })
}

#[async_trait]
impl DeployDriver for PgStore {
    async fn deployment_change(
        &self,
        audit: &Change<'_>,
        job_type: &str,
        request: DeployRequest<'_>,
    ) -> Result<DeployChange> {
        change(&self.pool, audit, job_type, request).await
    }

    async fn deployments_current(&self) -> Result<Vec<Deployment>> {
        current(&self.pool).await
    }

    async fn deployment_history(&self, job_type: &str) -> Result<Vec<DeploymentEntry>> {
        history(&self.pool, job_type).await
    }

    async fn component_source(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        source(&self.pool, digest).await
    }

    async fn deployments_wait(&self, timeout: Duration) {
        self.listen().await;
        let _ = tokio::time::timeout(timeout, self.deployed.notified()).await;
    }
}
