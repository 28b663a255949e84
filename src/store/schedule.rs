//! Schedules in the store: what a look at them reads (each scheduled job
//! type's configuration, cursor and whether a live host serves it), what
//! operators see, and the rule that turns ticks into jobs, decided once for
//! both backends: each tick's payload is the declared one plus `_tick`, and
//! it goes through the enqueue rules ([`super::enqueue::prepare`]) like any
//! other job. A backend only writes what this hands it
//! (`Backend::ticks_write`): the cursor moved with a compare-and-set, and
//! the jobs, in one transaction.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::enqueue::{EnqueueLimits, PreparedJob, prepare};
use super::{Backend, EnqueueParams, Enqueued, Result};
use crate::calendar::{Calendar, TICK_FIELD, tick_text};
use crate::types::{JobConfig, ScheduleConfig};

/// One scheduled job type as a look at the schedules reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleState {
    /// The job type.
    pub job: String,
    /// Its registered configuration, which every tick's job is prepared with.
    pub config: JobConfig,
    /// Its schedule (the configuration's, taken out once).
    pub schedule: ScheduleConfig,
    /// When its calendar was registered: no tick at or before this is due.
    pub since: DateTime<Utc>,
    /// The latest tick the fleet has enqueued, if any yet.
    pub last_tick: Option<DateTime<Utc>>,
    /// Whether a live host serves the job type: only then does it tick.
    pub served: bool,
    /// The latest look of any host of the fleet that handled the schedule
    /// (wrote its due ticks or found none due), by the clock of that look,
    /// recorded at most every few seconds: what tells a tick that came due
    /// while the fleet was looking (enqueued however late) from one missed
    /// while none was (only the latest `backfill` of those are enqueued).
    pub looked_at: Option<DateTime<Utc>>,
}

impl ScheduleState {
    /// A state from a stored row, or `None` when the stored configuration
    /// declares no schedule (a row the registration trigger is about to
    /// remove).
    pub fn new(
        job: String,
        config: JobConfig,
        since: DateTime<Utc>,
        last_tick: Option<DateTime<Utc>>,
        served: bool,
    ) -> Option<Self> {
        let schedule = config.schedule.clone()?;
        Some(ScheduleState { job, config, schedule, since, last_tick, served, looked_at: None })
    }

    /// The state, with the fleet's latest look at it.
    pub fn with_looked_at(self, looked_at: Option<DateTime<Utc>>) -> Self {
        ScheduleState { looked_at, ..self }
    }

    /// The cursor: every tick at or before it is done.
    pub fn cursor(&self) -> DateTime<Utc> {
        self.last_tick.unwrap_or(self.since)
    }
}

/// A schedule's state from a stored row. `None` for a configuration that
/// cannot be read (reported, and skipped: it stops no other schedule) or
/// that declares no schedule.
pub(crate) fn state_of(
    job: String,
    config: serde_json::Value,
    since: DateTime<Utc>,
    last_tick: Option<DateTime<Utc>>,
    served: bool,
) -> Option<ScheduleState> {
    match serde_json::from_value::<JobConfig>(config) {
        Ok(config) => ScheduleState::new(job, config, since, last_tick, served),
        Err(error) => {
            tracing::warn!(job, %error, "a scheduled job type's stored configuration cannot be read: it does not tick");
            None
        }
    }
}

/// Every scheduled job type, and the clock to read their ticks by.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedules {
    /// The database's time of the read (or the one a test gave).
    pub now: DateTime<Utc>,
    /// One per scheduled job type, by name.
    pub schedules: Vec<ScheduleState>,
}

/// One scheduled job type as operators see it (`jobhost schedules`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleStatus {
    /// The job type.
    pub job: String,
    /// Always empty: a declared schedule is its type's schedule with the
    /// empty key (schedules made at run time have one).
    pub key: &'static str,
    /// Its cron expression.
    pub cron: String,
    /// The zone the expression is read in.
    pub time_zone: String,
    /// How many missed ticks a host that starts after an outage enqueues.
    pub backfill: u32,
    /// When this calendar was registered; ticks count from it.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub since: DateTime<Utc>,
    /// The latest tick enqueued.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub last_tick: Option<DateTime<Utc>>,
    /// The first tick after now not enqueued yet.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub next_tick: Option<DateTime<Utc>>,
    /// Whether a live host serves the job type: without one it does not tick.
    pub served: bool,
}

impl ScheduleStatus {
    /// What operators see of `state` at `now`.
    pub fn new(state: &ScheduleState, now: DateTime<Utc>) -> Self {
        ScheduleStatus {
            job: state.job.clone(),
            key: "",
            cron: state.schedule.cron.clone(),
            time_zone: state.schedule.time_zone.clone(),
            backfill: state.schedule.backfill,
            since: state.since,
            last_tick: state.last_tick,
            next_tick: Calendar::new(&state.schedule)
                .ok()
                .and_then(|calendar| calendar.next_after(now.max(state.cursor()))),
            served: state.served,
        }
    }
}

/// What a backend writes for one look at a schedule: the cursor moved from
/// `expected` to `last_tick` (only if it is still `expected` for the
/// calendar registered at `since`), and `jobs` written as any enqueue's, in
/// one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct TickWrite {
    /// The job type.
    pub job: String,
    /// The registration of the calendar the ticks were read from.
    pub since: DateTime<Utc>,
    /// The cursor as read; another value means another host got there first.
    pub expected: Option<DateTime<Utc>>,
    /// The new cursor: the latest tick written.
    pub last_tick: DateTime<Utc>,
    /// The ticks' jobs; none when the ticks are skipped.
    pub jobs: Vec<PreparedJob>,
}

/// What became of one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tick {
    /// Its job was written like any enqueue: stored as a new job, or, for a
    /// unique job type whose key a job still holds (the job of an earlier
    /// tick, still waiting or running), not stored (`Duplicate`: the tick
    /// is skipped) or taken by that job if it waits (`Replaced`).
    Written(Enqueued),
    /// The enqueue rules or the database refused its job (a payload they
    /// will not take, a `raise` limit with no free slot): the tick is
    /// skipped, for good, with the reason.
    Refused(String),
}

/// What one look at a schedule did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// Another host moved the cursor first: this look wrote nothing.
    Taken,
    /// The cursor moved past these ticks, each enqueued or refused.
    Done(Vec<(DateTime<Utc>, Tick)>),
}

/// Enqueues one job per tick of `state`'s schedule, oldest first, moving
/// its cursor past the last: all in one transaction when the database
/// takes them. When it refuses them, each tick is written in a transaction
/// of its own, and a tick whose job is refused is skipped with the reason
/// (guarantee 13: no tick stalls the ticks after it). Nothing is written
/// when another host moved the cursor first.
///
/// # Errors
/// The database failing (not refusing): the ticks stay due for the next look.
pub(crate) async fn fire(
    backend: &(impl Backend + ?Sized),
    state: &ScheduleState,
    ticks: &[DateTime<Utc>],
) -> Result<Fired> {
    let Some(&last_tick) = ticks.last() else {
        return Ok(Fired::Done(Vec::new()));
    };
    let limits = backend.limits();
    let refusal = match ticks.iter().map(|tick| prepare_tick(state, *tick, limits)).collect::<Result<Vec<_>>>() {
        Ok(jobs) => {
            let write =
                TickWrite { job: state.job.clone(), since: state.since, expected: state.last_tick, last_tick, jobs };
            match backend.ticks_write(write).await {
                Ok(Some(written)) => {
                    return Ok(Fired::Done(
                        ticks.iter().copied().zip(written.into_iter().map(Tick::Written)).collect(),
                    ));
                }
                Ok(None) => return Ok(Fired::Taken),
                Err(error) if error.is_refusal() => error,
                Err(error) => return Err(error),
            }
        }
        Err(error) => error,
    };
    if let [tick] = ticks {
        return skip(backend, state, state.last_tick, *tick, refusal.to_string()).await;
    }
    // One at a time, so one tick's refusal skips that tick only.
    let mut done = Vec::new();
    let mut expected = state.last_tick;
    for &tick in ticks {
        let outcome = match prepare_tick(state, tick, limits) {
            Ok(job) => {
                let write = TickWrite {
                    job: state.job.clone(),
                    since: state.since,
                    expected,
                    last_tick: tick,
                    jobs: vec![job],
                };
                match backend.ticks_write(write).await {
                    Ok(Some(written)) => Fired::Done(ticks_written(tick, written)),
                    Ok(None) => Fired::Taken,
                    Err(error) if error.is_refusal() => skip(backend, state, expected, tick, error.to_string()).await?,
                    Err(error) => return Err(error),
                }
            }
            Err(error) => skip(backend, state, expected, tick, error.to_string()).await?,
        };
        match outcome {
            Fired::Done(ticks) => done.extend(ticks),
            // Another host moved on meanwhile: what is done stays done.
            Fired::Taken if done.is_empty() => return Ok(Fired::Taken),
            Fired::Taken => break,
        }
        expected = Some(tick);
    }
    Ok(Fired::Done(done))
}

/// One tick's outcome, from what its single job's write returned.
fn ticks_written(tick: DateTime<Utc>, written: Vec<Enqueued>) -> Vec<(DateTime<Utc>, Tick)> {
    written.into_iter().map(|enqueued| (tick, Tick::Written(enqueued))).collect()
}

/// Moves the cursor past a refused tick without a job.
async fn skip(
    backend: &(impl Backend + ?Sized),
    state: &ScheduleState,
    expected: Option<DateTime<Utc>>,
    tick: DateTime<Utc>,
    reason: String,
) -> Result<Fired> {
    let write = TickWrite { job: state.job.clone(), since: state.since, expected, last_tick: tick, jobs: Vec::new() };
    Ok(match backend.ticks_write(write).await? {
        Some(_) => Fired::Done(vec![(tick, Tick::Refused(reason))]),
        None => Fired::Taken,
    })
}

/// The job of one tick: the declared payload with the tick added, through
/// the enqueue rules with the job type's registered configuration.
///
/// # Errors
/// What [`prepare`] refuses.
pub fn prepare_tick(state: &ScheduleState, tick: DateTime<Utc>, limits: &EnqueueLimits) -> Result<PreparedJob> {
    let mut payload = state.schedule.payload.clone();
    payload.insert(TICK_FIELD.to_string(), serde_json::Value::String(tick_text(&tick)));
    prepare(EnqueueParams::new(state.job.clone(), serde_json::Value::Object(payload)), &state.config, limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Backoff;

    fn state(payload: serde_json::Value) -> ScheduleState {
        let schedule = ScheduleConfig {
            payload: payload.as_object().cloned().unwrap_or_default(),
            ..ScheduleConfig::new("* * * * * *")
        };
        let config = JobConfig {
            name: "report".into(),
            queue: "reports".into(),
            priority: 2,
            max_attempts: 3,
            backoff: Backoff { base_ms: 1, cap_ms: 2 },
            timeout_ms: 1000,
            memory_limit_bytes: 1 << 20,
            concurrency: None,
            unique: None,
            schedule: Some(schedule),
            outbound: Vec::new(),
            rate_limit: None,
            on_events: Vec::new(),
        };
        ScheduleState::new("report".into(), config, DateTime::UNIX_EPOCH, None, true).unwrap()
    }

    #[test]
    fn a_tick_is_the_declared_payload_with_its_time_through_the_enqueue_rules() {
        let tick = DateTime::parse_from_rfc3339("2026-03-29T03:00:00+02:00").unwrap().to_utc();
        let job = prepare_tick(&state(serde_json::json!({"scope": "all"})), tick, &EnqueueLimits::default()).unwrap();
        assert_eq!(job.payload, serde_json::json!({"scope": "all", "_tick": "2026-03-29T01:00:00Z"}));
        assert_eq!((job.queue.as_str(), job.priority, job.max_attempts), ("reports", 2, 3));
        let tight = EnqueueLimits { max_payload_bytes: 10 };
        assert!(prepare_tick(&state(serde_json::json!({})), tick, &tight).is_err(), "the payload limit applies");
    }

    #[test]
    fn operators_see_the_next_tick_after_now() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00.250Z").unwrap().to_utc();
        let status = ScheduleStatus::new(&state(serde_json::json!({})), now);
        assert_eq!(status.next_tick, Some(DateTime::parse_from_rfc3339("2026-01-01T00:00:01Z").unwrap().to_utc()));
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["next_tick"], "2026-01-01T00:00:01.000000Z");
        assert_eq!(json["last_tick"], serde_json::Value::Null);
    }
}
