//! Job types and hosts in SQLite.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use sqlx::Row;
use sqlx::SqliteConnection;
use sqlx::types::Json;

use super::SqliteStore;
use super::{json_list, now_ms, time_of};
use crate::store::driver::FleetDriver;
use crate::store::fleet::{HostHealthRow, HostRow, JobTypeRow, Registered};
use crate::store::{HostInfo, JobState, Result};
use crate::types::JobConfig;

/// Records loaded configurations, in the caller's write transaction; the
/// latest loaded version's configuration wins. Returns the types whose
/// configuration changed and how many blocked jobs a raised (or removed)
/// limit promoted. A lowered limit only admits nothing more until the key
/// is under it; running holders are never interrupted.
pub async fn job_types_register(
    conn: &mut SqliteConnection,
    types: &[(JobConfig, String)],
) -> Result<(Vec<String>, u64)> {
    let now = now_ms();
    let mut changed = Vec::new();
    for (config, digest) in types {
        let name: Option<String> = sqlx::query_scalar(
            "INSERT INTO job_types (name, config, digest, updated_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (name) DO UPDATE
             SET config = excluded.config, digest = excluded.digest, updated_at = excluded.updated_at
             WHERE job_types.digest <> excluded.digest
             RETURNING name",
        )
        .bind(&config.name)
        .bind(Json(config))
        .bind(digest)
        .bind(now)
        .fetch_optional(&mut *conn)
        .await?;
        changed.extend(name);
    }
    let mut promoted = 0;
    for (job, key) in super::concurrency::blocked_keys_of(conn, &changed).await? {
        promoted += super::concurrency::fill(conn, &job, &key, 0, now).await?;
    }
    Ok((changed, promoted))
}

pub async fn job_types_get(
    executor: impl sqlx::SqliteExecutor<'_>,
    names: &[String],
) -> Result<HashMap<String, JobConfig>> {
    if names.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(String, Json<serde_json::Value>)> =
        sqlx::query_as("SELECT name, config FROM job_types WHERE name IN (SELECT value FROM json_each($1))")
            .bind(json_list(names))
            .fetch_all(executor)
            .await?;
    crate::store::fleet::decode_configs(rows.into_iter().map(|(name, Json(config))| (name, config)).collect())
}

pub async fn host_upsert(conn: &mut SqliteConnection, host: &HostInfo) -> Result<()> {
    let now = now_ms();
    sqlx::query(
        "INSERT INTO hosts (id, hostname, pid, version, job_types, started_at, last_seen_at, heartbeat_ms,
                            digests, watcher_error)
         VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8, $9)
         ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at, job_types = excluded.job_types,
             digests = excluded.digests, watcher_error = excluded.watcher_error",
    )
    .bind(&host.id)
    .bind(&host.hostname)
    .bind(i64::from(host.pid))
    .bind(&host.version)
    .bind(json_list(&host.job_types))
    .bind(now)
    .bind(host.heartbeat_ms)
    .bind(Json(&host.digests))
    .bind(&host.watcher_error)
    .execute(conn)
    .await?;
    Ok(())
}

/// A host's id, last seen (ms), heartbeat (ms), digests and watcher error.
type HealthRow = (String, i64, i64, Json<BTreeMap<String, String>>, Option<String>);

/// Every host's row as its health is judged (see [`crate::store::fleet::fleet_warnings`]).
pub async fn host_health(pool: &sqlx::SqlitePool, now: i64) -> Result<Vec<HostHealthRow>> {
    let rows: Vec<HealthRow> =
        sqlx::query_as("SELECT id, last_seen_at, heartbeat_ms, digests, watcher_error FROM hosts ORDER BY id")
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(id, last_seen_at, heartbeat_ms, Json(digests), watcher_error)| HostHealthRow {
            id,
            silent_secs: (now - last_seen_at) as f64 / 1000.0,
            heartbeat_ms,
            digests,
            watcher_error,
        })
        .collect())
}

pub async fn host_remove(conn: &mut SqliteConnection, host_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM hosts WHERE id = $1").bind(host_id).execute(conn).await?;
    Ok(())
}

pub async fn host_prune(conn: &mut SqliteConnection, silent_secs: f64) -> Result<u64> {
    let cutoff = now_ms() - (silent_secs * 1000.0) as i64;
    let pruned =
        sqlx::query("DELETE FROM hosts WHERE last_seen_at < $1").bind(cutoff).execute(conn).await?.rows_affected();
    Ok(pruned)
}

/// Every host's row, alive or presumed dead, by id.
pub async fn host_list(pool: &sqlx::SqlitePool, now: i64) -> Result<Vec<HostRow>> {
    let rows = sqlx::query(
        "SELECT id, hostname, pid, version, job_types, digests, watcher_error, heartbeat_ms, started_at, last_seen_at
         FROM hosts ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            let last_seen_at: i64 = row.try_get("last_seen_at")?;
            Ok(HostRow {
                id: row.try_get("id")?,
                hostname: row.try_get("hostname")?,
                pid: row.try_get("pid")?,
                version: row.try_get("version")?,
                job_types: row.try_get::<Json<Vec<String>>, _>("job_types")?.0,
                digests: row.try_get::<Json<BTreeMap<String, String>>, _>("digests")?.0,
                watcher_error: row.try_get("watcher_error")?,
                heartbeat_ms: row.try_get("heartbeat_ms")?,
                started_at: time_of(row.try_get("started_at")?),
                silent_secs: (now - last_seen_at) as f64 / 1000.0,
                alive: false,
            }
            .judged())
        })
        .collect()
}

/// Every registered job type with the configuration it declared, by name.
pub async fn job_types_list(pool: &sqlx::SqlitePool) -> Result<Vec<JobTypeRow>> {
    let rows: Vec<(String, Json<serde_json::Value>, String, i64)> =
        sqlx::query_as("SELECT name, config, digest, updated_at FROM job_types ORDER BY name").fetch_all(pool).await?;
    crate::store::fleet::job_type_rows(
        rows.into_iter().map(|(name, Json(config), digest, at)| (name, config, digest, time_of(at))),
    )
}

/// Jobs that ended within the last `secs` seconds before `now`, by how they ended.
pub async fn finished_since(pool: &sqlx::SqlitePool, now: i64, secs: f64) -> Result<BTreeMap<JobState, i64>> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM archive WHERE finished_at > $1 GROUP BY state")
            .bind(now - (secs * 1000.0) as i64)
            .fetch_all(pool)
            .await?;
    crate::store::job::counts_by_state(rows)
}

#[async_trait]
impl FleetDriver for SqliteStore {
    async fn job_types_register(&self, types: &[(JobConfig, String)]) -> Result<Registered> {
        let (changed, promoted) = self.write_with(async |tx| job_types_register(tx, types).await).await?;
        self.announce(promoted > 0);
        Ok(Registered { changed, promoted })
    }

    async fn job_types_names(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT name FROM job_types ORDER BY name").fetch_all(&self.reader).await?)
    }

    async fn host_upsert(&self, info: &HostInfo) -> Result<()> {
        self.write_with(async |tx| host_upsert(tx, info).await).await
    }

    async fn host_list(&self) -> Result<Vec<crate::store::HostRow>> {
        host_list(&self.reader, now_ms()).await
    }

    async fn job_types_list(&self) -> Result<Vec<crate::store::JobTypeRow>> {
        job_types_list(&self.reader).await
    }

    async fn job_finished_since(&self, secs: f64) -> Result<std::collections::BTreeMap<crate::store::JobState, i64>> {
        finished_since(&self.reader, now_ms(), secs).await
    }

    async fn host_remove(&self, host_id: &str) -> Result<()> {
        self.write_with(async |tx| host_remove(tx, host_id).await).await
    }

    async fn host_prune(&self, silent_secs: f64) -> Result<u64> {
        self.write_with(async |tx| host_prune(tx, silent_secs).await).await
    }

    async fn host_health(&self) -> Result<Vec<HostHealthRow>> {
        host_health(&self.reader, now_ms()).await
    }
}
