//! Schedules in PostgreSQL: reading them, and moving a cursor with its
//! ticks' jobs.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::Json;

use super::PgStore;
use crate::store::driver::ScheduleDriver;
use crate::store::fleet::MISSED_HEARTBEATS;
use crate::store::schedule::{Schedules, TickWrite};
use crate::store::{Enqueued, Error, Result};

/// The clock, and a schedule's job, registration, cursor, configuration,
/// the fleet's latest look and whether it is served (all null but the clock
/// when there is none).
type Row = (
    DateTime<Utc>,
    Option<String>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<Json<serde_json::Value>>,
    Option<DateTime<Utc>>,
    Option<bool>,
);

pub async fn list(pool: &PgPool, now: Option<DateTime<Utc>>) -> Result<Schedules> {
    let rows: Vec<Row> =
        sqlx::query_as(include_str!("sql/schedule_list.sql")).bind(now).bind(MISSED_HEARTBEATS).fetch_all(pool).await?;
    let now =
        rows.first().map(|row| row.0).ok_or_else(|| Error::Decode("the schedule listing returned no clock".into()))?;
    let schedules = rows
        .into_iter()
        .filter_map(|(_, job, since, last_tick, config, looked_at, served)| {
            let (job, since, Json(config)) = (job?, since?, config?);
            crate::store::schedule::state_of(job, config, since, last_tick, served.unwrap_or(false))
                .map(|state| state.with_looked_at(looked_at))
        })
        .collect();
    Ok(Schedules { now, schedules })
}

/// Records a look at `at` that handled the schedules of `jobs`; an earlier
/// look never replaces a later one. Locks: those schedules' rows, briefly.
pub async fn looked(pool: &PgPool, jobs: &[String], at: DateTime<Utc>) -> Result<()> {
    sqlx::query(
        "UPDATE jobhost.schedules SET looked_at = $2
         WHERE job = ANY($1) AND (looked_at IS NULL OR looked_at < $2)",
    )
    .bind(jobs)
    .bind(at)
    .execute(pool)
    .await?;
    Ok(())
}

/// Moves the cursor and inserts the jobs in one transaction, or writes
/// nothing when the cursor is not `write.expected` any more.
pub async fn write(pool: &PgPool, write: TickWrite) -> Result<Option<Vec<Enqueued>>> {
    let mut tx = pool.begin().await?;
    // Locks the schedule's row until commit: another host writing the same
    // ticks waits here, then (READ COMMITTED re-reads the row it waited
    // for) finds the cursor moved and matches nothing.
    let moved = sqlx::query(
        "UPDATE jobhost.schedules SET last_tick = $4
         WHERE job = $1 AND since = $2 AND last_tick IS NOT DISTINCT FROM $3",
    )
    .bind(&write.job)
    .bind(write.since)
    .bind(write.expected)
    .bind(write.last_tick)
    .execute(&mut *tx)
    .await
    .map(|done| done.rows_affected());
    let written = match moved {
        Ok(0) => {
            super::commit_or_roll_back(tx, Ok(())).await?;
            return Ok(None);
        }
        Ok(_) => super::job::insert(&mut tx, &write.jobs.iter().collect::<Vec<_>>()).await,
        Err(error) => Err(error.into()),
    };
    super::commit_or_roll_back(tx, written).await.map(Some)
}

#[async_trait]
impl ScheduleDriver for PgStore {
    async fn schedule_list(&self, now: Option<DateTime<Utc>>) -> Result<Schedules> {
        list(&self.pool, now).await
    }

    async fn schedule_looked(&self, jobs: &[String], at: DateTime<Utc>) -> Result<()> {
        looked(&self.pool, jobs, at).await
    }
}
