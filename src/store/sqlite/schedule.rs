//! Schedules in SQLite: reading them, and moving a cursor with its ticks'
//! jobs in the caller's write transaction.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use super::time_of;
use crate::store::Schedules;
use crate::store::driver::ScheduleDriver;
use crate::store::fleet::MISSED_HEARTBEATS;
use crate::store::schedule::{ScheduleState, TickWrite};
use crate::store::{Enqueued, Result};

/// A schedule's job, registration and cursor (ms), configuration, the
/// fleet's latest look (ms), and whether a live host serves it.
type Row = (String, i64, Option<i64>, Json<serde_json::Value>, Option<i64>, bool);

/// Every schedule, with whether a live host serves its type (it renewed its
/// row within its last few heartbeats, by `now`, this machine's clock).
pub async fn list(pool: &SqlitePool, now: i64) -> Result<Vec<ScheduleState>> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT s.job, s.since, s.last_tick, t.config, s.looked_at,
                EXISTS (SELECT 1 FROM hosts h, json_each(h.job_types) j
                        WHERE j.value = s.job AND h.last_seen_at >= $1 - $2 * h.heartbeat_ms)
         FROM schedules s JOIN job_types t ON t.name = s.job
         ORDER BY s.job",
    )
    .bind(now)
    .bind(MISSED_HEARTBEATS)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(job, since, last_tick, Json(config), looked_at, served)| {
            crate::store::schedule::state_of(job, config, time_of(since), last_tick.map(time_of), served)
                .map(|state| state.with_looked_at(looked_at.map(time_of)))
        })
        .collect())
}

/// Records a look at `at` (ms) that handled the schedules of `jobs`; an
/// earlier look never replaces a later one.
pub async fn looked(conn: &mut SqliteConnection, jobs: &[String], at: i64) -> Result<()> {
    sqlx::query(
        "UPDATE schedules SET looked_at = $2
         WHERE job IN (SELECT value FROM json_each($1)) AND (looked_at IS NULL OR looked_at < $2)",
    )
    .bind(Json(jobs))
    .bind(at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Moves the cursor and inserts the jobs, or writes nothing when the cursor
/// is not `write.expected` any more. The write lock held since the
/// transaction began means nothing can move it in between.
pub async fn write(conn: &mut SqliteConnection, write: &TickWrite, now: i64) -> Result<Option<Vec<Enqueued>>> {
    let moved = sqlx::query("UPDATE schedules SET last_tick = $4 WHERE job = $1 AND since = $2 AND last_tick IS $3")
        .bind(&write.job)
        .bind(write.since.timestamp_millis())
        .bind(write.expected.map(|t| t.timestamp_millis()))
        .bind(write.last_tick.timestamp_millis())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if moved == 0 {
        return Ok(None);
    }
    Ok(Some(super::job::insert(conn, &write.jobs.iter().collect::<Vec<_>>(), now).await?))
}

#[async_trait]
impl ScheduleDriver for SqliteStore {
    async fn schedule_list(&self, now: Option<DateTime<Utc>>) -> Result<Schedules> {
        let schedules = list(&self.reader, now_ms()).await?;
        Ok(Schedules { now: now.unwrap_or_else(|| time_of(now_ms())), schedules })
    }

    async fn schedule_looked(&self, jobs: &[String], at: DateTime<Utc>) -> Result<()> {
        self.write_outside_jobs(async |tx| looked(tx, jobs, at.timestamp_millis()).await).await?;
        Ok(())
    }
}
