//! Keyed schedules in SQLite (`keyed_schedules`): each write and each pass
//! holds the file's one write lock, so a pass's read of what is due, its
//! ticks' jobs and its cursors are one transaction no other write enters.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::types::Json;
use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use super::encode::{now_ms, time_of};
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
use crate::store::{Error, Result};

fn ms(time: Option<DateTime<Utc>>) -> Option<i64> {
    time.map(|t| t.timestamp_millis())
}

fn time(row: &SqliteRow, column: &str) -> Result<DateTime<Utc>> {
    Ok(time_of(row.try_get(column)?))
}

fn time_opt(row: &SqliteRow, column: &str) -> Result<Option<DateTime<Utc>>> {
    Ok(row.try_get::<Option<i64>, _>(column)?.map(time_of))
}

fn schedule_of(row: &SqliteRow) -> Result<KeyedSchedule> {
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
        backfill: u32::try_from(row.try_get::<i64, _>("backfill")?).unwrap_or(0),
        starts_at: time_opt(row, "starts_at")?,
        ends_at: time_opt(row, "ends_at")?,
        paused: row.try_get("paused").unwrap_or(false),
        note: row.try_get("note")?,
    })
}

fn status_of(row: &SqliteRow) -> Result<KeyedScheduleStatus> {
    Ok(KeyedScheduleStatus {
        schedule: schedule_of(row)?,
        since: time(row, "since")?,
        last_tick: time_opt(row, "last_tick")?,
        last_job: row.try_get("last_job")?,
        buffered_tick: time_opt(row, "buffered_tick")?,
        skipped: row.try_get("skipped")?,
        next_tick: time_opt(row, "next_tick")?,
        error: row.try_get("error")?,
        triggered_at: time_opt(row, "triggered_at")?,
        created_at: time(row, "created_at")?,
        updated_at: time(row, "updated_at")?,
    })
}

fn due_of(row: &SqliteRow) -> Result<DueSchedule> {
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
        since: time(row, "since")?,
        last_tick: time_opt(row, "last_tick")?,
        last_job: row.try_get("last_job")?,
        last_job_live: row.try_get("live")?,
        buffered_tick: time_opt(row, "buffered_tick")?,
        triggered_at: time_opt(row, "triggered_at")?,
        looked_at: time_opt(row, "looked_at")?,
        passed_at: time_opt(row, "passed_at")?,
        handovers,
    })
}

/// Writes each plan's jobs: those of types the database cannot refuse in
/// one call, the others each in a savepoint (a refused one is counted
/// skipped, and the rest stand). Returns each plan's latest job.
async fn write_jobs(conn: &mut SqliteConnection, plans: &mut [TickPlan], now: i64) -> Result<Vec<Option<i64>>> {
    let plain: Vec<_> = plans.iter().filter(|p| !p.may_refuse).flat_map(|p| &p.jobs).collect();
    let mut written = super::job::insert(conn, &plain, now).await?.into_iter();
    let mut last_jobs = Vec::with_capacity(plans.len());
    for plan in plans.iter_mut() {
        if plan.jobs.is_empty() {
            last_jobs.push(None);
        } else if !plan.may_refuse {
            let mine: Vec<_> = written.by_ref().take(plan.jobs.len()).collect();
            last_jobs.push(TickPlan::last_job(&mine));
        } else {
            let jobs: Vec<_> = plan.jobs.iter().collect();
            let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
            match super::job::insert(&mut savepoint, &jobs, now).await {
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

async fn write_move(conn: &mut SqliteConnection, plan: &TickPlan, last_job: Option<i64>) -> Result<()> {
    sqlx::query(
        "UPDATE keyed_schedules
         SET last_tick = $3, last_job = coalesce($4, last_job), buffered_tick = $5, skipped = skipped + $6,
             look_at = $7, next_tick = $8, error = $9,
             triggered_at = CASE WHEN $10 THEN NULL ELSE triggered_at END, handovers = $11
         WHERE job = $1 AND key = $2",
    )
    .bind(&plan.job)
    .bind(&plan.key)
    .bind(ms(plan.last_tick))
    .bind(last_job)
    .bind(ms(plan.buffered_tick))
    .bind(plan.skipped)
    .bind(ms(plan.look_at))
    .bind(ms(plan.next_tick))
    .bind(plan.error.as_deref())
    .bind(plan.trigger_done)
    .bind(Json(&plan.handovers))
    .execute(conn)
    .await?;
    Ok(())
}

/// The due schedules of types a live host serves (renewed within `$4` of
/// its heartbeats by `$3`, this machine's clock), by the clock `$1`, at
/// most `$2`, as `sql/keyed_due.sql` reads them on PostgreSQL.
const DUE: &str = "SELECT s.*, t.config, l.looked_at, l.passed_at,
       s.last_job IS NOT NULL AND (EXISTS (SELECT 1 FROM jobs j WHERE j.id = s.last_job)
                                   OR EXISTS (SELECT 1 FROM blocked_jobs b WHERE b.id = s.last_job)) AS live
FROM keyed_schedules s
JOIN job_types t ON t.name = s.job
LEFT JOIN schedule_looks l ON l.job = s.job
WHERE s.job IN (SELECT j.value FROM hosts h, json_each(h.job_types) j
                WHERE h.last_seen_at >= $3 - $4 * h.heartbeat_ms)
  AND s.look_at IS NOT NULL AND s.look_at <= $1 AND NOT s.paused
ORDER BY s.look_at
LIMIT $2";

/// The earliest look due of a type a live host serves (`$1` this
/// machine's clock, `$2` the heartbeats a host may miss).
const NEXT: &str = "SELECT min(look_at) FROM keyed_schedules
WHERE job IN (SELECT j.value FROM hosts h, json_each(h.job_types) j
              WHERE h.last_seen_at >= $1 - $2 * h.heartbeat_ms)
  AND look_at IS NOT NULL AND NOT paused";

/// Records a pass at `$3` for every type a live host serves, vouching up
/// to it or to just before the earliest schedule of the type still due.
const LOOKED: &str = "INSERT INTO schedule_looks (job, looked_at, passed_at)
SELECT served.job,
       min($3, coalesce((SELECT min(s.look_at) - 1 FROM keyed_schedules s
                         WHERE s.job = served.job AND s.look_at <= $3 AND NOT s.paused), $3)),
       $3
FROM (SELECT DISTINCT j.value AS job FROM hosts h, json_each(h.job_types) j
      WHERE h.last_seen_at >= $1 - $2 * h.heartbeat_ms) served
WHERE true
ON CONFLICT (job) DO UPDATE SET looked_at = excluded.looked_at, passed_at = excluded.passed_at
WHERE schedule_looks.passed_at < excluded.passed_at";

/// [`crate::store::Backend::backfill_write`] on SQLite, in the caller's write.
pub(super) async fn backfill_write(
    conn: &mut SqliteConnection,
    job: &str,
    key: &str,
    jobs: &[(DateTime<Utc>, PreparedJob)],
    now: i64,
) -> Result<Option<BackfillWritten>> {
    let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM keyed_schedules WHERE job = $1 AND key = $2")
        .bind(job)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await?;
    if found.is_none() {
        return Ok(None);
    }
    let texts: Vec<String> = jobs.iter().map(|(tick, _)| tick_text(tick)).collect();
    let had: Vec<String> = sqlx::query_scalar(
        "SELECT payload->>'_tick' FROM jobs
         WHERE job = $1 AND payload->>'_schedule' = $2 AND payload->>'_tick' IN (SELECT value FROM json_each($3))
         UNION SELECT payload->>'_tick' FROM blocked_jobs
         WHERE job = $1 AND payload->>'_schedule' = $2 AND payload->>'_tick' IN (SELECT value FROM json_each($3))
         UNION SELECT payload->>'_tick' FROM archive
         WHERE job = $1 AND payload->>'_schedule' = $2 AND payload->>'_tick' IN (SELECT value FROM json_each($3))",
    )
    .bind(job)
    .bind(key)
    .bind(Json(&texts))
    .fetch_all(&mut *conn)
    .await?;
    let fresh: Vec<&(DateTime<Utc>, PreparedJob)> =
        jobs.iter().filter(|(tick, _)| !had.contains(&tick_text(tick))).collect();
    let written = super::job::insert(conn, &fresh.iter().map(|(_, job)| job).collect::<Vec<_>>(), now).await?;
    let ticks = fresh.iter().map(|(tick, _)| *tick).zip(written).collect();
    Ok(Some((ticks, jobs.len() - fresh.len())))
}

/// Creates or replaces a schedule on `conn`, inside the caller's write
/// transaction, at `now` (ms). True when it created it.
async fn upsert_in(conn: &mut SqliteConnection, s: &KeyedSchedule, now: i64) -> Result<bool> {
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM keyed_schedules WHERE job = $1 AND key = $2)")
        .bind(&s.job)
        .bind(&s.key)
        .fetch_one(&mut *conn)
        .await?;
    // As jobhost.schedule_upsert does on PostgreSQL: a changed
    // calendar hands over now, a resume counts from now.
    sqlx::query(
        "INSERT INTO keyed_schedules
             (job, key, cron, time_zone, payload, overlap, jitter_ms, backfill, starts_at, ends_at, paused, note,
              since, look_at, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $13, $13)
         ON CONFLICT (job, key) DO UPDATE SET
             cron = excluded.cron, time_zone = excluded.time_zone, payload = excluded.payload,
             overlap = excluded.overlap, jitter_ms = excluded.jitter_ms, backfill = excluded.backfill,
             starts_at = excluded.starts_at, ends_at = excluded.ends_at,
             paused = coalesce($14, paused), note = coalesce($15, note),
             handovers = CASE
                 WHEN NOT paused
                      AND (cron IS NOT excluded.cron OR time_zone IS NOT excluded.time_zone
                           OR starts_at IS NOT excluded.starts_at)
                      AND max(coalesce(last_tick, since), since, coalesce(starts_at - 1, since))
                          < min(max(excluded.since, coalesce(last_tick, since), since),
                                coalesce(ends_at, 253402300799999))
                     THEN json_insert(
                         CASE WHEN json_array_length(handovers) >= 16 THEN json_remove(handovers, '$[0]')
                              ELSE handovers END,
                         '$[#]',
                         json_object(
                             'cron', cron, 'time_zone', time_zone,
                             'from', strftime('%Y-%m-%dT%H:%M:%fZ',
                                 max(coalesce(last_tick, since), since, coalesce(starts_at - 1, since)) / 1000.0,
                                 'unixepoch'),
                             'until', strftime('%Y-%m-%dT%H:%M:%fZ',
                                 min(max(excluded.since, coalesce(last_tick, since), since),
                                     coalesce(ends_at, 253402300799999)) / 1000.0,
                                 'unixepoch')))
                 ELSE handovers END,
             since = CASE
                 WHEN cron IS NOT excluded.cron OR time_zone IS NOT excluded.time_zone
                      OR starts_at IS NOT excluded.starts_at OR (paused AND NOT coalesce($14, paused))
                     THEN max(excluded.since, coalesce(last_tick, since), since)
                 ELSE since END,
             buffered_tick = CASE WHEN coalesce($14, paused) THEN NULL ELSE buffered_tick END,
             triggered_at = CASE WHEN coalesce($14, paused) THEN NULL ELSE triggered_at END,
             look_at = min(coalesce(look_at, excluded.look_at), excluded.look_at), error = NULL,
             updated_at = excluded.updated_at",
    )
    .bind(&s.job)
    .bind(&s.key)
    .bind(s.cron.trim())
    .bind(&s.time_zone)
    .bind(Json(&s.payload))
    .bind(s.overlap.as_str())
    .bind(i64::try_from(s.jitter_ms).unwrap_or(i64::MAX))
    .bind(i64::from(s.backfill))
    .bind(ms(s.starts_at))
    .bind(ms(s.ends_at))
    .bind(s.paused)
    .bind(&s.note)
    .bind(now)
    .bind(s.pause_written().map(|(paused, _)| paused))
    .bind(s.pause_written().map(|(_, note)| note))
    .execute(&mut *conn)
    .await?;
    Ok(!exists)
}

/// Pauses (keeping the note unless one is given) or resumes a schedule
/// on `conn` at `now` (ms). False when there is none.
async fn pause_in(
    conn: &mut SqliteConnection,
    job: &str,
    key: &str,
    paused: bool,
    note: Option<&str>,
    now: i64,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE keyed_schedules
         SET paused = $3, note = coalesce($4, CASE WHEN $3 THEN note ELSE '' END),
             since = CASE WHEN paused AND NOT $3 THEN max($5, coalesce(last_tick, since), since) ELSE since END,
             buffered_tick = CASE WHEN $3 THEN NULL ELSE buffered_tick END,
             triggered_at = CASE WHEN $3 THEN NULL ELSE triggered_at END,
             look_at = min(coalesce(look_at, $5), $5), updated_at = $5
         WHERE job = $1 AND key = $2",
    )
    .bind(job)
    .bind(key)
    .bind(paused)
    .bind(note)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Removes a schedule on `conn`. False when there was none.
async fn remove_in(conn: &mut SqliteConnection, job: &str, key: &str) -> Result<bool> {
    let done = sqlx::query("DELETE FROM keyed_schedules WHERE job = $1 AND key = $2")
        .bind(job)
        .bind(key)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Writes a run's change to a schedule in its completion's transaction,
/// at `now` (ms). A pause, resume or removal of a schedule that is not
/// there changes nothing.
pub(super) async fn change_in(conn: &mut SqliteConnection, change: &ScheduleChange, now: i64) -> Result<()> {
    match change {
        ScheduleChange::Set(schedule) => {
            upsert_in(conn, schedule, now).await?;
        }
        ScheduleChange::Pause { job, key, note } => {
            pause_in(conn, job, key, true, note.as_deref(), now).await?;
        }
        ScheduleChange::Resume { job, key } => {
            pause_in(conn, job, key, false, None, now).await?;
        }
        ScheduleChange::Remove { job, key } => {
            remove_in(conn, job, key).await?;
        }
    }
    Ok(())
}

#[async_trait]
impl KeyedScheduleDriver for SqliteStore {
    async fn keyed_schedule_upsert(&self, change: &Change<'_>, s: &KeyedSchedule) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| upsert_in(tx, s, now_ms()).await).await
    }

    async fn keyed_schedule_pause(
        &self,
        change: &Change<'_>,
        job: &str,
        key: &str,
        paused: bool,
        note: Option<&str>,
    ) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| pause_in(tx, job, key, paused, note, now_ms()).await).await
    }

    async fn keyed_schedule_remove(&self, change: &Change<'_>, job: &str, key: &str) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| remove_in(tx, job, key).await).await
    }

    async fn keyed_schedule_trigger(&self, change: &Change<'_>, job: &str, key: &str) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| {
            let paused: Option<bool> = sqlx::query_scalar(
                "UPDATE keyed_schedules
                 SET triggered_at = CASE WHEN paused THEN triggered_at ELSE $3 END,
                     look_at = CASE WHEN paused THEN look_at ELSE min(coalesce(look_at, $3), $3) END
                 WHERE job = $1 AND key = $2
                 RETURNING paused",
            )
            .bind(job)
            .bind(key)
            .bind(now_ms())
            .fetch_optional(&mut **tx)
            .await?;
            crate::store::keyed_schedule::triggered(paused)
        })
        .await
    }

    async fn keyed_schedules(&self, job: Option<&str>, key: Option<&str>) -> Result<Vec<KeyedScheduleStatus>> {
        let rows = sqlx::query(
            "SELECT * FROM keyed_schedules WHERE ($1 IS NULL OR job = $1) AND ($2 IS NULL OR key = $2) ORDER BY job, key",
        )
        .bind(job)
        .bind(key)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(status_of).collect()
    }

    async fn keyed_schedules_page(
        &self,
        job: Option<&str>,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<KeyedScheduleStatus>> {
        // One statement per shape, with no `IS NULL OR`: SQLite plans
        // before binding, and an OR keeps the key's range from the index.
        let query = match (job, after) {
            (None, None) => sqlx::query("SELECT * FROM keyed_schedules ORDER BY job, key LIMIT $1").bind(limit),
            (Some(job), None) => sqlx::query("SELECT * FROM keyed_schedules WHERE job = $1 ORDER BY job, key LIMIT $2")
                .bind(job)
                .bind(limit),
            (None, Some((after_job, after_key))) => {
                sqlx::query("SELECT * FROM keyed_schedules WHERE (job, key) > ($1, $2) ORDER BY job, key LIMIT $3")
                    .bind(after_job)
                    .bind(after_key)
                    .bind(limit)
            }
            (Some(job), Some((after_job, after_key))) => sqlx::query(
                "SELECT * FROM keyed_schedules WHERE job = $1 AND (job, key) > ($2, $3) ORDER BY job, key LIMIT $4",
            )
            .bind(job)
            .bind(after_job)
            .bind(after_key)
            .bind(limit),
        };
        let rows = query.fetch_all(&self.reader).await?;
        rows.iter().map(status_of).collect()
    }

    async fn keyed_ticks(&self, now: Option<DateTime<Utc>>, batch: i64, decide: &TickDecider) -> Result<KeyedPass> {
        let wall = now_ms();
        let clock = now.map_or(wall, |t| t.timestamp_millis());
        let (plans, full, next_look) = self
            .write_with(async |tx| {
                let rows = sqlx::query(DUE)
                    .bind(clock)
                    .bind(batch)
                    .bind(wall)
                    .bind(MISSED_HEARTBEATS)
                    .fetch_all(&mut **tx)
                    .await?;
                let due: Vec<DueSchedule> = rows.iter().map(due_of).collect::<Result<Vec<_>>>()?;
                let mut plans: Vec<TickPlan> = due.iter().map(|due| decide(due, time_of(clock))).collect();
                let last_jobs = write_jobs(tx, &mut plans, wall).await?;
                for (plan, last_job) in plans.iter().zip(&last_jobs) {
                    write_move(tx, plan, *last_job).await?;
                }
                let next_look: Option<i64> =
                    sqlx::query_scalar(NEXT).bind(wall).bind(MISSED_HEARTBEATS).fetch_one(&mut **tx).await?;
                let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= batch;
                Ok((plans, full, next_look))
            })
            .await?;
        let written = plans.iter().any(|plan| !plan.jobs.is_empty());
        self.announce(written);
        Ok(KeyedPass { next_look: next_look.map(time_of), ..KeyedPass::of(&plans, time_of(clock), full) })
    }

    async fn keyed_looked(&self, at: DateTime<Utc>) -> Result<()> {
        self.write_outside_jobs(async |tx| {
            sqlx::query(LOOKED)
                .bind(now_ms())
                .bind(MISSED_HEARTBEATS)
                .bind(at.timestamp_millis())
                .execute(&mut **tx)
                .await?;
            Ok(())
        })
        .await
    }
}
