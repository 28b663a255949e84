//! Keyed schedules in PostgreSQL (`jobhost.keyed_schedules`): writes go
//! through the functions applications call (`jobhost.schedule_upsert`,
//! `jobhost.schedule_remove`), and a pass locks what is due, writes its
//! ticks' jobs and moves the cursors in one transaction.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, Row};

use super::PgStore;
use crate::calendar::tick_text;
use crate::schedule_spec::ScheduleChange;
use crate::store::audit::Change;
use crate::store::backend::BackfillWritten;
use crate::store::driver::{KeyedScheduleDriver, TickDecider};
use crate::store::enqueue::PreparedJob;
use crate::store::fleet::MISSED_HEARTBEATS;
use crate::store::keyed_schedule::{
    DueSchedule, Handover, KeyedPass, KeyedSchedule, KeyedScheduleStatus, Overlap, TickPlan,
};
use crate::store::{Enqueued, Error, Result};

/// The function's refusal of a field (SQLSTATE 22023) as the caller's error.
fn refused_as_invalid(error: sqlx::Error) -> Error {
    match error.as_database_error() {
        Some(db) if db.code().as_deref() == Some("22023") => {
            Error::InvalidSchedule(db.message().trim_start_matches("invalid schedule: ").to_string())
        }
        _ => Error::from(error),
    }
}

/// What its writer gave, from a row with the writer's columns.
fn schedule_of(row: &PgRow) -> Result<KeyedSchedule> {
    let overlap: String = row.try_get("overlap")?;
    let Json(payload): Json<serde_json::Map<String, serde_json::Value>> = row.try_get("payload")?;
    Ok(KeyedSchedule {
        job: row.try_get("job")?,
        key: row.try_get("key")?,
        cron: row.try_get("cron")?,
        time_zone: row.try_get("time_zone")?,
        payload,
        overlap: Overlap::parse(&overlap).map_err(Error::Decode)?,
        jitter_ms: u64::try_from(row.try_get::<i64, _>("jitter_ms")?).unwrap_or(0),
        backfill: u32::try_from(row.try_get::<i32, _>("backfill")?).unwrap_or(0),
        starts_at: row.try_get("starts_at")?,
        ends_at: row.try_get("ends_at")?,
        paused: row.try_get("paused").unwrap_or(false),
        note: row.try_get("note")?,
    })
}

fn status_of(row: &PgRow) -> Result<KeyedScheduleStatus> {
    Ok(KeyedScheduleStatus {
        schedule: schedule_of(row)?,
        since: row.try_get("since")?,
        last_tick: row.try_get("last_tick")?,
        last_job: row.try_get("last_job")?,
        buffered_tick: row.try_get("buffered_tick")?,
        skipped: row.try_get("skipped")?,
        next_tick: row.try_get("next_tick")?,
        error: row.try_get("error")?,
        triggered_at: row.try_get("triggered_at")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// A due schedule from a row of `sql/keyed_due.sql`, without its type's
/// configuration when the stored one cannot be read (reported; it stops
/// no other).
fn due_of(row: &PgRow) -> Result<DueSchedule> {
    let Json(config): Json<serde_json::Value> = row.try_get("config")?;
    let job: String = row.try_get("job")?;
    let config = serde_json::from_value(config)
        .inspect_err(|error| {
            tracing::warn!(job, %error, "a job type's stored configuration cannot be read: its keyed schedules wait");
        })
        .ok();
    let Json(handovers): Json<Vec<Handover>> = row.try_get("handovers")?;
    Ok(DueSchedule {
        schedule: schedule_of(row)?,
        config,
        since: row.try_get("since")?,
        last_tick: row.try_get("last_tick")?,
        last_job: row.try_get("last_job")?,
        last_job_live: false,
        buffered_tick: row.try_get("buffered_tick")?,
        triggered_at: row.try_get("triggered_at")?,
        looked_at: row.try_get("looked_at")?,
        passed_at: row.try_get("passed_at")?,
        handovers,
    })
}

/// Marks each schedule whose latest job has not ended (it waits, runs, is
/// blocked or waits to retry), read in a statement of its own after the
/// rows are locked, so it sees a job the pass before committed.
async fn with_live_jobs(conn: &mut PgConnection, mut due: Vec<DueSchedule>) -> Result<Vec<DueSchedule>> {
    let ids: Vec<i64> = due.iter().filter_map(|d| d.last_job).collect();
    if ids.is_empty() {
        return Ok(due);
    }
    let live: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM jobhost.jobs WHERE id = ANY($1) UNION ALL SELECT id FROM jobhost.blocked_jobs WHERE id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(conn)
    .await?;
    for schedule in &mut due {
        schedule.last_job_live = schedule.last_job.is_some_and(|id| live.contains(&id));
    }
    Ok(due)
}

/// Writes each plan's jobs: those of types the database cannot refuse in
/// one call, the others each in a savepoint (a refused one is counted
/// skipped, and the rest stand). Returns each plan's latest job.
async fn write_jobs(conn: &mut PgConnection, plans: &mut [TickPlan]) -> Result<Vec<Option<i64>>> {
    let plain: Vec<_> = plans.iter().filter(|p| !p.may_refuse).flat_map(|p| &p.jobs).collect();
    let mut written = super::job::insert(conn, &plain).await?.into_iter();
    let mut last_jobs = Vec::with_capacity(plans.len());
    for plan in plans.iter_mut() {
        if plan.jobs.is_empty() {
            last_jobs.push(None);
        } else if !plan.may_refuse {
            let mine: Vec<Enqueued> = written.by_ref().take(plan.jobs.len()).collect();
            last_jobs.push(TickPlan::last_job(&mine));
        } else {
            let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
            let jobs: Vec<_> = plan.jobs.iter().collect();
            match super::job::insert(&mut savepoint, &jobs).await {
                Ok(mine) => {
                    savepoint.commit().await?;
                    last_jobs.push(TickPlan::last_job(&mine));
                }
                Err(error) if error.is_refusal() => {
                    savepoint.rollback().await?;
                    *plan = plan.clone().refused(error.to_string());
                    last_jobs.push(None);
                }
                Err(error) => return Err(error),
            }
        }
    }
    Ok(last_jobs)
}

/// Moves each schedule as its plan says.
async fn write_moves(conn: &mut PgConnection, plans: &[TickPlan], last_jobs: &[Option<i64>]) -> Result<()> {
    sqlx::query(include_str!("sql/keyed_moved.sql"))
        .bind(plans.iter().map(|p| p.job.as_str()).collect::<Vec<_>>())
        .bind(plans.iter().map(|p| p.key.as_str()).collect::<Vec<_>>())
        .bind(plans.iter().map(|p| p.last_tick).collect::<Vec<_>>())
        .bind(last_jobs)
        .bind(plans.iter().map(|p| p.buffered_tick).collect::<Vec<_>>())
        .bind(plans.iter().map(|p| p.skipped).collect::<Vec<_>>())
        .bind(plans.iter().map(|p| p.look_at).collect::<Vec<_>>())
        .bind(plans.iter().map(|p| p.next_tick).collect::<Vec<_>>())
        .bind(plans.iter().map(|p| p.error.as_deref()).collect::<Vec<_>>())
        .bind(plans.iter().map(|p| p.trigger_done).collect::<Vec<_>>())
        .bind(plans.iter().map(|p| Json(&p.handovers)).collect::<Vec<_>>())
        .execute(conn)
        .await?;
    Ok(())
}

/// The ticks a job of the schedule already has, live or archived, among `ticks`.
const TICKS_HAD: &str = "SELECT payload->>'_tick' FROM jobhost.jobs
     WHERE job = $1 AND payload->>'_schedule' = $2 AND payload->>'_tick' = ANY($3)
     UNION SELECT payload->>'_tick' FROM jobhost.blocked_jobs
     WHERE job = $1 AND payload->>'_schedule' = $2 AND payload->>'_tick' = ANY($3)
     UNION SELECT payload->>'_tick' FROM jobhost.archive
     WHERE job = $1 AND payload->>'_schedule' = $2 AND payload->>'_tick' = ANY($3)";

/// [`crate::store::Backend::backfill_write`] on PostgreSQL.
pub(super) async fn backfill_write(
    pool: &sqlx::PgPool,
    change: &Change<'_>,
    job: &str,
    key: &str,
    jobs: Vec<(DateTime<Utc>, PreparedJob)>,
) -> Result<Option<BackfillWritten>> {
    let mut tx = pool.begin().await?;
    let work: Result<Option<BackfillWritten>> = async {
        let found: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM jobhost.keyed_schedules WHERE job = $1 AND key = $2 FOR UPDATE")
                .bind(job)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await?;
        if found.is_none() {
            super::audit::record(&mut tx, change, &false).await?;
            return Ok(None);
        }
        let texts: Vec<String> = jobs.iter().map(|(tick, _)| tick_text(tick)).collect();
        let had: Vec<String> =
            sqlx::query_scalar(TICKS_HAD).bind(job).bind(key).bind(&texts).fetch_all(&mut *tx).await?;
        let fresh: Vec<&(DateTime<Utc>, PreparedJob)> =
            jobs.iter().filter(|(tick, _)| !had.contains(&tick_text(tick))).collect();
        let written = super::job::insert(&mut tx, &fresh.iter().map(|(_, job)| job).collect::<Vec<_>>()).await?;
        let written = (fresh.iter().map(|(tick, _)| *tick).zip(written).collect(), jobs.len() - fresh.len());
        super::audit::record(&mut tx, change, &written).await?;
        Ok(Some(written))
    }
    .await;
    super::commit_or_roll_back(tx, work).await
}

/// Creates or replaces a schedule through `jobhost.schedule_upsert`, on
/// `conn` (the caller's transaction, or none). True when it created it.
async fn upsert_in(conn: &mut PgConnection, s: &KeyedSchedule) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT jobhost.schedule_upsert($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)")
        .bind(&s.job)
        .bind(&s.key)
        .bind(&s.cron)
        .bind(&s.time_zone)
        .bind(Json(&s.payload))
        .bind(s.overlap.as_str())
        .bind(i64::try_from(s.jitter_ms).unwrap_or(i64::MAX))
        .bind(i32::try_from(s.backfill).unwrap_or(i32::MAX))
        .bind(s.starts_at)
        .bind(s.ends_at)
        .bind(s.pause_written().map(|(paused, _)| paused))
        .bind(s.pause_written().map(|(_, note)| note))
        .fetch_one(conn)
        .await
}

/// Pauses (keeping the note unless one is given) or resumes a schedule,
/// on `conn`. False when there is none.
async fn pause_in(conn: &mut PgConnection, job: &str, key: &str, paused: bool, note: Option<&str>) -> Result<bool> {
    // A resume counts from now: ticks while paused are not made up.
    let done = sqlx::query(
        "UPDATE jobhost.keyed_schedules
         SET paused = $3, note = coalesce($4, CASE WHEN $3 THEN note ELSE '' END),
             since = CASE WHEN paused AND NOT $3 THEN greatest(clock_timestamp(), last_tick, since) ELSE since END,
             buffered_tick = CASE WHEN $3 THEN NULL ELSE buffered_tick END,
             triggered_at = CASE WHEN $3 THEN NULL ELSE triggered_at END,
             look_at = least(look_at, now()), updated_at = now()
         WHERE job = $1 AND key = $2",
    )
    .bind(job)
    .bind(key)
    .bind(paused)
    .bind(note)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Removes a schedule through `jobhost.schedule_remove`, on `conn`.
async fn remove_in(conn: &mut PgConnection, job: &str, key: &str) -> Result<bool> {
    Ok(sqlx::query_scalar("SELECT jobhost.schedule_remove($1, $2)").bind(job).bind(key).fetch_one(conn).await?)
}

/// Of the schedules named, those another transaction holds locked: the
/// rows that exist but cannot be locked now. Asked outside any write, so
/// the locks it takes end with the statement.
pub(super) async fn held(pool: &sqlx::PgPool, schedules: &[(String, String)]) -> Result<HashSet<(String, String)>> {
    let (jobs, keys): (Vec<&str>, Vec<&str>) = schedules.iter().map(|(j, k)| (j.as_str(), k.as_str())).unzip();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT s.job, s.key FROM jobhost.keyed_schedules s
         WHERE (s.job, s.key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
           AND NOT EXISTS (SELECT 1 FROM jobhost.keyed_schedules free
                           WHERE free.job = s.job AND free.key = s.key FOR UPDATE SKIP LOCKED)",
    )
    .bind(&jobs)
    .bind(&keys)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Locks the rows of the schedules a completion changes, in (type, key)
/// order, before anything else the write locks: a pass locks a schedule's
/// row before the semaphores its ticks' jobs take, so a completion that
/// gives back a slot and then changed the schedule whose ticks use it
/// would otherwise wait for the pass while the pass waits for it.
pub(super) async fn lock_changed(conn: &mut PgConnection, schedules: &[(String, String)]) -> Result<()> {
    let (jobs, keys): (Vec<&str>, Vec<&str>) = schedules.iter().map(|(j, k)| (j.as_str(), k.as_str())).unzip();
    sqlx::query(
        "SELECT 1 FROM jobhost.keyed_schedules
         WHERE (job, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
         ORDER BY job, key FOR UPDATE",
    )
    .bind(&jobs)
    .bind(&keys)
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes a run's change to a schedule in its completion's transaction.
/// A field the function refuses stays the database's error (a refusal,
/// SQLSTATE 22023): the result writer then fails that run with the reason
/// (`worker::complete`), rather than failing the batch again and again.
/// A pause, resume or removal of a schedule that is not there changes nothing.
pub(super) async fn change_in(conn: &mut PgConnection, change: &ScheduleChange) -> Result<()> {
    match change {
        ScheduleChange::Set(schedule) => {
            // A job's own change is not the trail's: its run records it.
            super::audit::set_actor(conn, None).await?;
            upsert_in(conn, schedule).await?;
        }
        ScheduleChange::Pause { job, key, note } => {
            pause_in(conn, job, key, true, note.as_deref()).await?;
        }
        ScheduleChange::Resume { job, key } => {
            pause_in(conn, job, key, false, None).await?;
        }
        ScheduleChange::Remove { job, key } => {
            super::audit::set_actor(conn, None).await?;
            remove_in(conn, job, key).await?;
        }
    }
    Ok(())
}

#[async_trait]
impl KeyedScheduleDriver for PgStore {
    async fn keyed_schedule_upsert(&self, change: &Change<'_>, s: &KeyedSchedule) -> Result<bool> {
        // The function records the change, as this actor.
        let mut tx = self.pool.begin().await?;
        super::audit::set_actor(&mut tx, Some(change)).await?;
        let created = upsert_in(&mut tx, s).await.map_err(refused_as_invalid)?;
        tx.commit().await?;
        Ok(created)
    }

    async fn keyed_schedule_pause(
        &self,
        change: &Change<'_>,
        job: &str,
        key: &str,
        paused: bool,
        note: Option<&str>,
    ) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| pause_in(conn, job, key, paused, note).await).await
    }

    async fn keyed_schedule_remove(&self, change: &Change<'_>, job: &str, key: &str) -> Result<bool> {
        // The function records the change, as this actor.
        let mut tx = self.pool.begin().await?;
        super::audit::set_actor(&mut tx, Some(change)).await?;
        let removed = remove_in(&mut tx, job, key).await?;
        tx.commit().await?;
        Ok(removed)
    }

    async fn keyed_schedule_trigger(&self, change: &Change<'_>, job: &str, key: &str) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| {
            let paused: Option<bool> = sqlx::query_scalar(
                "UPDATE jobhost.keyed_schedules
             SET triggered_at = CASE WHEN paused THEN triggered_at ELSE clock_timestamp() END,
                 look_at = CASE WHEN paused THEN look_at ELSE least(look_at, now()) END
             WHERE job = $1 AND key = $2
             RETURNING paused",
            )
            .bind(job)
            .bind(key)
            .fetch_optional(conn)
            .await?;
            crate::store::keyed_schedule::triggered(paused)
        })
        .await
    }

    async fn keyed_schedules(&self, job: Option<&str>, key: Option<&str>) -> Result<Vec<KeyedScheduleStatus>> {
        let rows = sqlx::query(
            "SELECT * FROM jobhost.keyed_schedules
             WHERE ($1::text IS NULL OR job = $1) AND ($2::text IS NULL OR key = $2)
             ORDER BY job, key",
        )
        .bind(job)
        .bind(key)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(status_of).collect()
    }

    async fn keyed_schedules_page(
        &self,
        job: Option<&str>,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<KeyedScheduleStatus>> {
        // One statement per shape, with no `IS NULL OR`: a kept generic
        // plan would otherwise scan from the first schedule for every page.
        let query = match (job, after) {
            (None, None) => sqlx::query("SELECT * FROM jobhost.keyed_schedules ORDER BY job, key LIMIT $1").bind(limit),
            (Some(job), None) => {
                sqlx::query("SELECT * FROM jobhost.keyed_schedules WHERE job = $1 ORDER BY job, key LIMIT $2").bind(job).bind(limit)
            }
            (None, Some((after_job, after_key))) => {
                sqlx::query("SELECT * FROM jobhost.keyed_schedules WHERE (job, key) > ($1, $2) ORDER BY job, key LIMIT $3")
                    .bind(after_job)
                    .bind(after_key)
                    .bind(limit)
            }
            (Some(job), Some((after_job, after_key))) => sqlx::query(
                "SELECT * FROM jobhost.keyed_schedules WHERE job = $1 AND (job, key) > ($2, $3) ORDER BY job, key LIMIT $4",
            )
            .bind(job)
            .bind(after_job)
            .bind(after_key)
            .bind(limit),
        };
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(status_of).collect()
    }

    async fn keyed_ticks(&self, now: Option<DateTime<Utc>>, batch: i64, decide: &TickDecider) -> Result<KeyedPass> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(include_str!("sql/keyed_due.sql"))
            .bind(now)
            .bind(batch)
            .bind(MISSED_HEARTBEATS)
            .fetch_all(&mut *tx)
            .await?;
        let due: Vec<DueSchedule> = rows.iter().map(due_of).collect::<Result<Vec<_>>>()?;
        let due = with_live_jobs(&mut tx, due).await?;
        let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= batch;
        let work: Result<(Vec<TickPlan>, DateTime<Utc>, Option<DateTime<Utc>>)> = async {
            let mut plans = Vec::new();
            if let Some(row) = rows.first() {
                let clock: DateTime<Utc> = row.try_get("now")?;
                plans = due.iter().map(|due| decide(due, clock)).collect();
                let last_jobs = write_jobs(&mut tx, &mut plans).await?;
                write_moves(&mut tx, &plans, &last_jobs).await?;
            }
            let (clock, next_look) = sqlx::query_as(include_str!("sql/keyed_next.sql"))
                .bind(now)
                .bind(MISSED_HEARTBEATS)
                .fetch_one(&mut *tx)
                .await?;
            Ok((plans, clock, next_look))
        }
        .await;
        let (plans, clock, next_look) = super::commit_or_roll_back(tx, work).await?;
        let clock = rows.first().map(|row| row.try_get("now")).transpose()?.unwrap_or(clock);
        Ok(KeyedPass { next_look, ..KeyedPass::of(&plans, clock, full) })
    }

    async fn keyed_looked(&self, at: DateTime<Utc>) -> Result<()> {
        // It vouches up to `at`, or to just before the earliest schedule of
        // the type still due (one another transaction held).
        sqlx::query(
            "INSERT INTO jobhost.schedule_looks (job, looked_at, passed_at)
             SELECT served.job,
                    least($1::timestamptz,
                          (SELECT s.look_at - interval '1 millisecond' FROM jobhost.keyed_schedules s
                           WHERE s.job = served.job AND s.look_at <= $1 AND NOT s.paused
                           ORDER BY s.look_at LIMIT 1)),
                    $1
             FROM (SELECT DISTINCT served_job AS job FROM jobhost.hosts h, unnest(h.job_types) AS served_job
                   WHERE h.last_seen_at >= now() - $2 * h.heartbeat_ms * interval '1 millisecond') served
             ON CONFLICT (job) DO UPDATE SET looked_at = EXCLUDED.looked_at, passed_at = EXCLUDED.passed_at
             WHERE jobhost.schedule_looks.passed_at < EXCLUDED.passed_at",
        )
        .bind(at)
        .bind(MISSED_HEARTBEATS)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
