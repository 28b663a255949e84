//! Job types and hosts in PostgreSQL.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use sqlx::Row;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};

use super::PgStore;
use crate::store::driver::FleetDriver;
use crate::store::fleet::{HostHealthRow, HostRow, JobTypeRow, Registered};
use crate::store::{HostInfo, JobState, Result};
use crate::types::JobConfig;

pub async fn job_types_register(pool: &PgPool, types: &[(JobConfig, String)]) -> Result<Registered> {
    let mut tx = pool.begin().await?;
    let registered = register_in(&mut tx, types).await?;
    tx.commit().await?;
    Ok(registered)
}

/// Records loaded configurations in the caller's transaction; the latest
/// loaded version's configuration wins, fleet-wide.
pub async fn register_in(conn: &mut PgConnection, types: &[(JobConfig, String)]) -> Result<Registered> {
    let names: Vec<&str> = types.iter().map(|(c, _)| c.name.as_str()).collect();
    let configs: Vec<Json<&JobConfig>> = types.iter().map(|(c, _)| Json(c)).collect();
    let digests: Vec<&str> = types.iter().map(|(_, d)| d.as_str()).collect();
    let changed: Vec<String> = sqlx::query_scalar(
        "INSERT INTO jobhost.job_types (name, config, digest)
         SELECT * FROM unnest($1::text[], $2::jsonb[], $3::text[])
         ON CONFLICT (name) DO UPDATE
         SET config = excluded.config, digest = excluded.digest, updated_at = now()
         WHERE jobhost.job_types.digest <> excluded.digest
         RETURNING name",
    )
    .bind(&names)
    .bind(&configs)
    .bind(&digests)
    .fetch_all(&mut *conn)
    .await?;
    // A raised limit (or one removed) frees slots at once: blocked jobs of a
    // changed type take them now. A lowered limit only admits nothing more
    // until the key is under it; running holders are never interrupted.
    let promoted = super::concurrency::promote_blocked_of_types(conn, &changed).await?;
    Ok(Registered { changed, promoted })
}

/// Makes `digest` the newest registered version of `name`, so registering
/// it replaces whatever a later-seen digest stored (a rollback, a redeploy
/// of an older build), which the forward-only rule would otherwise refuse.
pub async fn renumber_as_newest(conn: &mut PgConnection, name: &str, digest: &str) -> Result<()> {
    sqlx::query(
        "INSERT INTO jobhost.job_type_digests AS d (name, digest) VALUES ($1, $2)
         ON CONFLICT (name, digest) DO UPDATE SET seq = DEFAULT",
    )
    .bind(name)
    .bind(digest)
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn job_types_get(
    executor: impl sqlx::PgExecutor<'_>,
    names: &[String],
) -> Result<HashMap<String, JobConfig>> {
    let rows: Vec<(String, Json<serde_json::Value>)> =
        sqlx::query_as("SELECT name, config FROM jobhost.job_types WHERE name = ANY($1)")
            .bind(names)
            .fetch_all(executor)
            .await?;
    crate::store::fleet::decode_configs(rows.into_iter().map(|(name, Json(config))| (name, config)).collect())
}

pub async fn host_upsert(pool: &PgPool, host: &HostInfo) -> Result<()> {
    sqlx::query(
        "INSERT INTO jobhost.hosts (id, hostname, pid, version, job_types, heartbeat_ms, digests, watcher_error)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (id) DO UPDATE SET last_seen_at = now(), job_types = excluded.job_types,
             digests = excluded.digests, watcher_error = excluded.watcher_error",
    )
    .bind(&host.id)
    .bind(&host.hostname)
    .bind(host.pid as i32)
    .bind(&host.version)
    .bind(&host.job_types)
    .bind(host.heartbeat_ms.min(i64::from(i32::MAX)) as i32)
    .bind(Json(&host.digests))
    .bind(&host.watcher_error)
    .execute(pool)
    .await?;
    Ok(())
}

/// A host's id, seconds since last seen, heartbeat (ms), digests and watcher error.
type HealthRow = (String, f64, i64, Json<BTreeMap<String, String>>, Option<String>);

/// Every host's row as its health is judged (see [`crate::store::fleet::fleet_warnings`]).
pub async fn host_health(pool: &PgPool) -> Result<Vec<HostHealthRow>> {
    let rows: Vec<HealthRow> = sqlx::query_as(
        "SELECT id, extract(epoch FROM now() - last_seen_at)::float8, heartbeat_ms::bigint, digests, watcher_error
         FROM jobhost.hosts ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, silent_secs, heartbeat_ms, Json(digests), watcher_error)| HostHealthRow {
            id,
            silent_secs,
            heartbeat_ms,
            digests,
            watcher_error,
        })
        .collect())
}

pub async fn host_remove(pool: &PgPool, host_id: &str) -> Result<()> {
    sqlx::query("DELETE FROM jobhost.hosts WHERE id = $1").bind(host_id).execute(pool).await?;
    Ok(())
}

pub async fn host_prune(pool: &PgPool, silent_secs: f64) -> Result<u64> {
    let pruned = sqlx::query("DELETE FROM jobhost.hosts WHERE last_seen_at < now() - $1 * interval '1 second'")
        .bind(silent_secs)
        .execute(pool)
        .await?
        .rows_affected();
    Ok(pruned)
}

/// Every host's row, alive or presumed dead, by id.
pub async fn host_list(pool: &PgPool) -> Result<Vec<HostRow>> {
    let rows = sqlx::query(
        "SELECT id, hostname, pid::bigint, version, job_types, digests, watcher_error, heartbeat_ms::bigint,
                started_at, extract(epoch FROM now() - last_seen_at)::float8 AS silent_secs
         FROM jobhost.hosts ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(HostRow {
                id: row.try_get("id")?,
                hostname: row.try_get("hostname")?,
                pid: row.try_get("pid")?,
                version: row.try_get("version")?,
                job_types: row.try_get("job_types")?,
                digests: row.try_get::<Json<BTreeMap<String, String>>, _>("digests")?.0,
                watcher_error: row.try_get("watcher_error")?,
                heartbeat_ms: row.try_get("heartbeat_ms")?,
                started_at: row.try_get("started_at")?,
                silent_secs: row.try_get("silent_secs")?,
                alive: false,
            }
            .judged())
        })
        .collect()
}

/// Every registered job type with the configuration it declared, by name.
pub async fn job_types_list(pool: &PgPool) -> Result<Vec<JobTypeRow>> {
    let rows: Vec<(String, Json<serde_json::Value>, String, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT name, config, digest, updated_at FROM jobhost.job_types ORDER BY name")
            .fetch_all(pool)
            .await?;
    crate::store::fleet::job_type_rows(
        rows.into_iter().map(|(name, Json(config), digest, at)| (name, config, digest, at)),
    )
}

/// Jobs that ended within the last `secs` seconds, by how they ended.
pub async fn finished_since(pool: &PgPool, secs: f64) -> Result<BTreeMap<JobState, i64>> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM jobhost.archive
         WHERE finished_at > now() - $1 * interval '1 second' GROUP BY state",
    )
    .bind(secs)
    .fetch_all(pool)
    .await?;
    crate::store::job::counts_by_state(rows)
}

#[async_trait]
impl FleetDriver for PgStore {
    async fn job_types_register(&self, types: &[(JobConfig, String)]) -> Result<Registered> {
        job_types_register(&self.pool, types).await
    }

    async fn job_types_names(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT name FROM jobhost.job_types").fetch_all(&self.pool).await?)
    }

    async fn host_upsert(&self, info: &HostInfo) -> Result<()> {
        host_upsert(&self.pool, info).await
    }

    async fn host_list(&self) -> Result<Vec<crate::store::HostRow>> {
        host_list(&self.pool).await
    }

    async fn job_types_list(&self) -> Result<Vec<crate::store::JobTypeRow>> {
        job_types_list(&self.pool).await
    }

    async fn job_finished_since(&self, secs: f64) -> Result<std::collections::BTreeMap<crate::store::JobState, i64>> {
        finished_since(&self.pool, secs).await
    }

    async fn host_remove(&self, host_id: &str) -> Result<()> {
        host_remove(&self.pool, host_id).await
    }

    async fn host_prune(&self, silent_secs: f64) -> Result<u64> {
        host_prune(&self.sweeps, silent_secs).await
    }

    async fn host_health(&self) -> Result<Vec<HostHealthRow>> {
        host_health(&self.pool).await
    }
}
