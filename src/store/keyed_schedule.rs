//! Schedules made at run time (docs/schedules.md, "Schedules made at run
//! time"): many per job type, one per key, each with its own calendar,
//! payload, overlap policy and jitter, written by applications and
//! operators rather than declared by a component.
//!
//! The database holds them and decides which host ticks one: a pass takes
//! the schedules that are due (`look_at` passed) with their rows locked and
//! skipped by other hosts, enqueues their ticks' jobs and moves each
//! cursor, in one transaction. So each tick is enqueued once across a
//! fleet, a pass costs what is due rather than a scan of every schedule,
//! and a change (an upsert, a pause, a removal) either commits before a
//! pass locks the row, and the pass sees it, or waits for the pass.
//!
//! This module holds what both backends share: the checks on a write, and
//! [`plan`], the pure rule that turns a due schedule into its jobs.

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use super::enqueue::{EnqueueLimits, PreparedJob, prepare};
use super::wait::{holds_nul, jsonb_text_len};
use super::{EnqueueParams, Enqueued, Error, Result};
use crate::calendar::{Calendar, MAX_BACKFILL, TICK_FIELD, due_ticks, tick_text};
pub use crate::schedule_spec::{KeyedSchedule, Overlap};
use crate::types::{JobConfig, OnConflict, OnDuplicate, ScheduleConfig};

/// The payload field in which the host gives a keyed schedule's job its key.
pub const KEY_FIELD: &str = "_schedule";

/// The longest key.
pub const MAX_KEY_CHARS: usize = 200;

/// The longest note on a paused schedule.
pub const MAX_NOTE_CHARS: usize = 1_000;

/// The widest jitter: a day.
pub const MAX_JITTER_MS: u64 = 86_400_000;

/// How soon a schedule holding a buffered tick looks again whether the job
/// before it has ended.
pub const BUFFER_RECHECK: TimeDelta = TimeDelta::seconds(1);

/// How soon a schedule whose job type's configuration this host cannot
/// read is looked at again (by any host: one of a newer version may).
pub const UNREADABLE_RECHECK: TimeDelta = TimeDelta::minutes(1);

impl KeyedSchedule {
    /// The calendar part, as a declared schedule has it.
    pub fn calendar_config(&self) -> ScheduleConfig {
        ScheduleConfig {
            cron: self.cron.clone(),
            time_zone: self.time_zone.clone(),
            payload: self.payload.clone(),
            backfill: self.backfill,
        }
    }

    /// Checks everything but the job type's existence, naming the field.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] naming the bad field and why.
    pub fn check(&self) -> Result<()> {
        let invalid = |field: &str, reason: String| Err(Error::InvalidSchedule(format!("{field}: {reason}")));
        check_key(&self.key).map_err(|reason| Error::InvalidSchedule(format!("key: {reason}")))?;
        // The shape `jobhost.schedule_upsert` accepts, so every writer and
        // both backends refuse the same expressions (the parser alone also
        // takes nicknames such as `@daily` and a seventh field, the year).
        let fields: Vec<&str> = self.cron.split_whitespace().collect();
        let cron_chars = |f: &&str| f.chars().all(|c| c.is_ascii_alphanumeric() || "*?/,#-".contains(c));
        if !(5..=6).contains(&fields.len()) || !fields.iter().all(cron_chars) {
            let reason = format!("{:?} is not a cron expression of five fields, or six with seconds first", self.cron);
            return invalid("cron", reason);
        }
        if let Err(reason) = Calendar::new(&self.calendar_config()) {
            let field = if reason.contains("time zone") { "time_zone" } else { "cron" };
            return invalid(field, reason);
        }
        if let Err(reason) = crate::calendar::check(&self.calendar_config()) {
            let field = if reason.starts_with("backfill") {
                "backfill"
            } else if reason.contains("payload") {
                "payload"
            } else {
                "cron"
            };
            return invalid(field, reason);
        }
        if self.backfill > MAX_BACKFILL {
            return invalid("backfill", format!("{} is more than the most allowed, {MAX_BACKFILL}", self.backfill));
        }
        if self.payload.contains_key(KEY_FIELD) {
            return invalid("payload", format!("may not have a {KEY_FIELD:?} field: the host adds it"));
        }
        if self.jitter_ms > MAX_JITTER_MS {
            return invalid("jitter", format!("{} ms is more than a day", self.jitter_ms));
        }
        let years = |at: &DateTime<Utc>| (1..=9998).contains(&chrono::Datelike::year(at));
        if self.starts_at.is_some_and(|at| !years(&at)) {
            return invalid("starts_at", "must be a time between the years 1 and 9999".into());
        }
        if self.ends_at.is_some_and(|at| !years(&at)) {
            return invalid("ends_at", "must be a time between the years 1 and 9999".into());
        }
        if let (Some(starts), Some(ends)) = (self.starts_at, self.ends_at)
            && ends <= starts
        {
            return invalid("ends_at", "must be after starts_at".into());
        }
        check_note(&self.note).map_err(|reason| Error::InvalidSchedule(format!("note: {reason}")))?;
        if holds_nul(&serde_json::Value::Object(self.payload.clone())) {
            return invalid("payload", "may not hold the character U+0000".into());
        }
        Ok(())
    }
}

/// Checks a pause's note: at most [`MAX_NOTE_CHARS`], no U+0000 (which
/// PostgreSQL's text cannot hold).
///
/// # Errors
/// Why the note is refused.
pub fn check_note(note: &str) -> std::result::Result<(), String> {
    if note.chars().count() > MAX_NOTE_CHARS {
        return Err(format!("is longer than {MAX_NOTE_CHARS} characters"));
    }
    if note.contains('\0') {
        return Err("may not hold the character U+0000".into());
    }
    Ok(())
}

/// Checks a schedule's payload against the payload limit as PostgreSQL
/// measures it (its `jsonb` text), as `jobhost.schedule_upsert` does.
///
/// # Errors
/// [`Error::InvalidSchedule`] naming the payload.
pub fn check_payload_size(schedule: &KeyedSchedule, max_bytes: usize) -> Result<()> {
    let bytes = jsonb_text_len(&serde_json::Value::Object(schedule.payload.clone()));
    if bytes > max_bytes {
        return Err(Error::InvalidSchedule(format!(
            "payload: {bytes} bytes of JSON, more than the largest accepted, {max_bytes} bytes"
        )));
    }
    Ok(())
}

/// Checks a schedule as every writer's is checked: its fields, its job
/// type registered (`config`, as read), and each tick's job passing the
/// enqueue rules (its payload with `_tick` and `_schedule` added).
///
/// # Errors
/// [`Error::InvalidSchedule`] naming the field.
pub fn check_registered(schedule: &KeyedSchedule, config: Option<&JobConfig>, limits: &EnqueueLimits) -> Result<()> {
    schedule.check()?;
    check_payload_size(schedule, limits.max_payload_bytes)?;
    let config =
        config.ok_or_else(|| Error::InvalidSchedule(format!("job: no job type {:?} is registered", schedule.job)))?;
    prepare_keyed_tick(schedule, config, Utc::now(), limits)
        .map_err(|error| Error::InvalidSchedule(format!("payload: {error}")))?;
    Ok(())
}

/// Checks a schedule's key: not empty (the empty key is the type's declared
/// schedule), at most [`MAX_KEY_CHARS`], no control characters.
///
/// # Errors
/// Why the key is refused.
pub fn check_key(key: &str) -> std::result::Result<(), String> {
    if key.is_empty() {
        return Err("must not be empty (the empty key is the schedule the job type declares)".into());
    }
    if key.chars().count() > MAX_KEY_CHARS {
        return Err(format!("is longer than {MAX_KEY_CHARS} characters"));
    }
    if key.chars().any(char::is_control) {
        return Err("must not hold control characters".into());
    }
    Ok(())
}

/// A stored schedule as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyedScheduleStatus {
    /// What its writer gave.
    #[serde(flatten)]
    pub schedule: KeyedSchedule,
    /// When its calendar was written; ticks count from it.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub since: DateTime<Utc>,
    /// The latest tick done (enqueued, buffered or skipped).
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub last_tick: Option<DateTime<Utc>>,
    /// The job the latest enqueued tick made (or the job that held its
    /// unique key).
    pub last_job: Option<i64>,
    /// A tick kept until the job before it ends (`buffer_one`).
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub buffered_tick: Option<DateTime<Utc>>,
    /// Ticks counted as skipped: overlapping, or their job refused.
    pub skipped: i64,
    /// The next tick, as the latest pass found it (none yet for a schedule
    /// no pass has looked at since it was written).
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub next_tick: Option<DateTime<Utc>>,
    /// Why a host cannot tick it (a calendar written through SQL that the
    /// host's parser refuses), or why its latest tick's job was refused.
    pub error: Option<String>,
    /// A tick asked for now, not yet enqueued.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub triggered_at: Option<DateTime<Utc>>,
    /// When it was written first.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub created_at: DateTime<Utc>,
    /// When it was written last.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub updated_at: DateTime<Utc>,
}

/// A due schedule as a pass reads it, its row locked.
#[derive(Debug, Clone, PartialEq)]
pub struct DueSchedule {
    /// What its writer gave.
    pub schedule: KeyedSchedule,
    /// The job type's registered configuration; `None` when the stored
    /// one cannot be read (the schedule waits, reporting it).
    pub config: Option<JobConfig>,
    /// When its calendar was written.
    pub since: DateTime<Utc>,
    /// The cursor: every tick at or before it is done.
    pub last_tick: Option<DateTime<Utc>>,
    /// The job of its latest enqueued tick.
    pub last_job: Option<i64>,
    /// Whether that job has not ended yet.
    pub last_job_live: bool,
    /// A tick kept for when that job ends.
    pub buffered_tick: Option<DateTime<Utc>>,
    /// A tick asked for now.
    pub triggered_at: Option<DateTime<Utc>>,
    /// How far the fleet's latest pass over the job type's schedules
    /// vouches: every tick up to it was handled, but those of schedules
    /// still due.
    pub looked_at: Option<DateTime<Utc>>,
    /// When that pass was: only a recent one vouches.
    pub passed_at: Option<DateTime<Utc>>,
    /// The calendars changes replaced, oldest first, while their last ticks
    /// may be due.
    pub handovers: Vec<Handover>,
}

/// A calendar a change of a schedule replaced: its ticks after `from` up
/// to `until` (the change, or its end) are still the schedule's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// The old expression.
    pub cron: String,
    /// The old zone.
    pub time_zone: String,
    /// The cursor when the change came.
    pub from: DateTime<Utc>,
    /// The change.
    pub until: DateTime<Utc>,
}

/// What a pass writes for one schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct TickPlan {
    /// The job type.
    pub job: String,
    /// The key.
    pub key: String,
    /// The jobs to enqueue, oldest tick first.
    pub jobs: Vec<PreparedJob>,
    /// The cursor after this pass.
    pub last_tick: Option<DateTime<Utc>>,
    /// The tick kept for later, if any.
    pub buffered_tick: Option<DateTime<Utc>>,
    /// Ticks this pass counted as skipped.
    pub skipped: i64,
    /// When a pass must look again; `None` when no tick is left (past its
    /// end, or a calendar the host cannot read).
    pub look_at: Option<DateTime<Utc>>,
    /// The next tick, for operators.
    pub next_tick: Option<DateTime<Utc>>,
    /// Why a tick could not be enqueued, or the calendar not read.
    pub error: Option<String>,
    /// Whether the job type may refuse an enqueue in the database (a
    /// `raise` limit or uniqueness): its jobs are written in a savepoint.
    pub may_refuse: bool,
    /// The replaced calendars whose ticks are not all done yet.
    pub handovers: Vec<Handover>,
    /// Whether a tick asked for now was handled (enqueued or skipped).
    pub trigger_done: bool,
}

impl TickPlan {
    /// The plan, its jobs refused by the database with `reason`: the ticks
    /// are counted as skipped and the cursor still moves past them.
    pub fn refused(mut self, reason: String) -> Self {
        self.skipped += i64::try_from(self.jobs.len()).unwrap_or(i64::MAX);
        self.jobs.clear();
        self.error = Some(reason);
        self
    }

    /// The job its latest enqueued tick made, from what the write returned.
    pub fn last_job(written: &[Enqueued]) -> Option<i64> {
        written.last().map(|enqueued| match enqueued {
            Enqueued::New(id) | Enqueued::Duplicate(id) | Enqueued::Replaced(id) => *id,
        })
    }
}

/// Whether a trigger was taken, from whether the schedule is paused.
///
/// # Errors
/// [`Error::InvalidSchedule`] for a paused schedule: it ticks nothing.
pub fn triggered(paused: Option<bool>) -> Result<bool> {
    match paused {
        Some(true) => Err(Error::InvalidSchedule("the schedule is paused: resume it to run a tick".into())),
        found => Ok(found.is_some()),
    }
}

/// Whether a type's enqueue may be refused by the database.
fn may_refuse(config: &JobConfig) -> bool {
    config.concurrency.as_ref().is_some_and(|c| c.on_conflict == OnConflict::Raise)
        || config.unique.as_ref().is_some_and(|u| u.on_duplicate == OnDuplicate::Raise)
}

/// What one pass does with a due schedule at `now`: its due ticks (those a
/// host missed beyond `max_pause` only up to its `backfill`), a tick asked
/// for now, and a buffered tick whose predecessor ended, through its
/// overlap policy, in tick order; and when to look again.
pub fn plan(due: &DueSchedule, now: DateTime<Utc>, max_pause: TimeDelta, limits: &EnqueueLimits) -> TickPlan {
    let schedule = &due.schedule;
    let mut plan = TickPlan {
        job: schedule.job.clone(),
        key: schedule.key.clone(),
        jobs: Vec::new(),
        last_tick: due.last_tick,
        buffered_tick: due.buffered_tick,
        skipped: 0,
        look_at: None,
        next_tick: None,
        error: None,
        may_refuse: due.config.as_ref().is_some_and(may_refuse),
        handovers: due.handovers.clone(),
        trigger_done: false,
    };
    let Some(config) = &due.config else {
        plan.error = Some(format!("the job type {:?} has a stored configuration this host cannot read", schedule.job));
        plan.look_at = Some(now + UNREADABLE_RECHECK);
        return plan;
    };
    let calendar = match Calendar::new(&schedule.calendar_config()) {
        Ok(calendar) => calendar,
        Err(reason) => {
            plan.error = Some(reason);
            return plan;
        }
    };
    let mut cursor = due.last_tick.unwrap_or(due.since).max(due.since);
    if let Some(starts) = schedule.starts_at {
        cursor = cursor.max(starts - TimeDelta::milliseconds(1));
    }
    let recent = due.passed_at.is_some_and(|at| now - at <= max_pause);
    let watching_since = due.looked_at.filter(|_| recent);
    let mut ticks = Vec::new();
    for handover in &due.handovers {
        let old = ScheduleConfig {
            cron: handover.cron.clone(),
            time_zone: handover.time_zone.clone(),
            ..schedule.calendar_config()
        };
        // A calendar that was ticking can be read; one that cannot gives up its last ticks.
        if let Ok(old) = Calendar::new(&old) {
            let from = due.last_tick.unwrap_or(handover.from).max(handover.from);
            ticks.extend(due_ticks(&old, from, watching_since, now.min(handover.until), schedule.backfill));
        }
    }
    plan.handovers.retain(|handover| handover.until > now);
    ticks.extend(due_ticks(&calendar, cursor, watching_since, now, schedule.backfill));
    let ticks: Vec<_> = ticks.into_iter().filter(|tick| schedule.ends_at.is_none_or(|end| *tick <= end)).collect();
    if let Some(last) = ticks.last() {
        plan.last_tick = Some(*last);
    }

    let mut live = due.last_job_live;
    let mut emit = Vec::new();
    if schedule.overlap == Overlap::BufferOne
        && !live
        && let Some(buffered) = plan.buffered_tick.take()
    {
        emit.push(buffered);
        live = true;
    }
    let mut candidates = ticks;
    candidates.extend(due.triggered_at);
    plan.trigger_done = due.triggered_at.is_some();
    for tick in candidates {
        match schedule.overlap {
            Overlap::Allow => emit.push(tick),
            _ if !live => {
                emit.push(tick);
                live = true;
            }
            Overlap::BufferOne if plan.buffered_tick.is_none() => plan.buffered_tick = Some(tick),
            _ => plan.skipped += 1,
        }
    }
    for tick in emit {
        match prepare_keyed_tick(schedule, config, tick, limits) {
            Ok(job) => plan.jobs.push(job),
            Err(error) => {
                plan.skipped += 1;
                plan.error = Some(error.to_string());
            }
        }
    }

    let from = now.max(plan.last_tick.unwrap_or(cursor)).max(cursor);
    plan.next_tick = calendar.next_after(from).filter(|next| schedule.ends_at.is_none_or(|end| *next <= end));
    plan.look_at = plan.next_tick;
    if plan.buffered_tick.is_some() {
        let recheck = now + BUFFER_RECHECK;
        plan.look_at = Some(plan.look_at.map_or(recheck, |at| at.min(recheck)));
    }
    plan
}

/// The job of one tick: the schedule's payload with `_tick` and
/// `_schedule` added, due after the tick's jitter, through the enqueue rules.
///
/// # Errors
/// What [`prepare`] refuses.
pub fn prepare_keyed_tick(
    schedule: &KeyedSchedule,
    config: &JobConfig,
    tick: DateTime<Utc>,
    limits: &EnqueueLimits,
) -> Result<PreparedJob> {
    let mut payload = schedule.payload.clone();
    payload.insert(TICK_FIELD.to_string(), serde_json::Value::String(tick_text(&tick)));
    payload.insert(KEY_FIELD.to_string(), serde_json::Value::String(schedule.key.clone()));
    let mut params = EnqueueParams::new(schedule.job.clone(), serde_json::Value::Object(payload));
    let jitter = jitter_ms(&schedule.job, &schedule.key, tick, schedule.jitter_ms);
    if jitter > 0 {
        params.run_at = Some(tick + TimeDelta::milliseconds(i64::try_from(jitter).unwrap_or(0)));
    }
    prepare(params, config, limits)
}

/// A tick's jitter: a hash of the type, key and tick within `window_ms`,
/// so every host (and every retry of a pass) picks the same delay, and the
/// schedules of one calendar spread over the window.
pub fn jitter_ms(job: &str, key: &str, tick: DateTime<Utc>, window_ms: u64) -> u64 {
    if window_ms == 0 {
        return 0;
    }
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let text = format!("{job}\u{0}{key}\u{0}{}", tick.timestamp_millis());
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash % (window_ms + 1)
}

/// The most ticks one backfill enqueues.
pub const MAX_BACKFILL_TICKS: usize = 1_000;

/// The ticks of `schedule`'s calendar from `from` to `to` (both included),
/// oldest first: a backfill's (each enqueued once, whatever the overlap
/// policy: they were asked for).
///
/// # Errors
/// [`Error::InvalidSchedule`]: a range that is not in the past, or holds
/// more than [`MAX_BACKFILL_TICKS`] ticks.
pub fn backfill_ticks(
    schedule: &KeyedSchedule,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<DateTime<Utc>>> {
    let invalid = |reason: String| Err(Error::InvalidSchedule(reason));
    if to < from {
        return invalid("backfill: the range ends before it starts".into());
    }
    if to > now {
        return invalid("backfill: the range must be in the past (its ticks from now on are the schedule's)".into());
    }
    let calendar = Calendar::new(&schedule.calendar_config()).map_err(Error::InvalidSchedule)?;
    let mut ticks = Vec::new();
    let mut next = calendar.next_after(from - TimeDelta::milliseconds(1));
    while let Some(tick) = next.filter(|tick| *tick <= to) {
        if ticks.len() == MAX_BACKFILL_TICKS {
            return invalid(format!("backfill: the range holds more than {MAX_BACKFILL_TICKS} ticks: narrow it"));
        }
        ticks.push(tick);
        next = calendar.next_after(tick);
    }
    Ok(ticks)
}

/// What a backfill did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Backfilled {
    /// Each tick enqueued, with its job.
    pub enqueued: Vec<BackfilledTick>,
    /// Ticks of the range a job of this schedule already has (live or
    /// archived): not enqueued again.
    pub already: usize,
}

impl Backfilled {
    /// What a backfill did: each tick written with what became of its job,
    /// and how many were there already.
    pub fn of(written: Vec<(DateTime<Utc>, Enqueued)>, already: usize) -> Self {
        let enqueued = written
            .into_iter()
            .map(|(tick, enqueued)| BackfilledTick {
                tick,
                id: TickPlan::last_job(std::slice::from_ref(&enqueued)).unwrap_or_default(),
            })
            .collect();
        Backfilled { enqueued, already }
    }
}

/// One tick a backfill enqueued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackfilledTick {
    /// The tick.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub tick: DateTime<Utc>,
    /// Its job (or the job holding its unique key).
    pub id: i64,
}

/// What one pass over the keyed schedules did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyedPass {
    /// Schedules it looked at.
    pub looked: usize,
    /// Jobs it wrote (new, or a unique key found held).
    pub enqueued: usize,
    /// Ticks it counted as skipped.
    pub skipped: i64,
    /// Whether it took as many schedules as it could: more may be due.
    pub full: bool,
    /// The clock it read ticks by; no later than its scan's snapshot.
    pub now: Option<DateTime<Utc>>,
    /// The earliest time any schedule of a served type is due, as the pass
    /// left them.
    pub next_look: Option<DateTime<Utc>>,
}

impl KeyedPass {
    /// What a pass that wrote `plans` by the clock `now` did.
    pub fn of(plans: &[TickPlan], now: DateTime<Utc>, full: bool) -> Self {
        KeyedPass {
            looked: plans.len(),
            enqueued: plans.iter().map(|p| p.jobs.len()).sum(),
            skipped: plans.iter().map(|p| p.skipped).sum(),
            full,
            now: Some(now),
            next_look: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Backoff;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    fn config() -> JobConfig {
        JobConfig {
            name: "report".into(),
            queue: "default".into(),
            priority: 0,
            max_attempts: 3,
            backoff: Backoff { base_ms: 1, cap_ms: 2 },
            timeout_ms: 1000,
            memory_limit_bytes: 1 << 20,
            concurrency: None,
            unique: None,
            schedule: None,
            outbound: Vec::new(),
            rate_limit: None,
            on_events: Vec::new(),
        }
    }

    fn due(overlap: Overlap, last_tick: &str, live: bool) -> DueSchedule {
        DueSchedule {
            schedule: KeyedSchedule { overlap, ..KeyedSchedule::new("report", "acme", "*/10 * * * * *") },
            config: Some(config()),
            since: at("2026-01-01T00:00:00Z"),
            last_tick: Some(at(last_tick)),
            last_job: Some(7),
            last_job_live: live,
            buffered_tick: None,
            triggered_at: None,
            looked_at: Some(at("2026-01-01T00:00:00Z")),
            passed_at: Some(at("2026-01-01T00:00:30Z")),
            handovers: Vec::new(),
        }
    }

    const NOW: &str = "2026-01-01T00:00:35Z";

    fn planned(due: &DueSchedule) -> TickPlan {
        plan(due, at(NOW), TimeDelta::seconds(60), &EnqueueLimits::default())
    }

    fn ticks(plan: &TickPlan) -> Vec<String> {
        plan.jobs.iter().map(|job| job.payload[TICK_FIELD].as_str().unwrap().to_string()).collect()
    }

    #[test]
    fn allow_enqueues_every_due_tick_with_its_key() {
        let plan = planned(&due(Overlap::Allow, "2026-01-01T00:00:00Z", true));
        assert_eq!(ticks(&plan), ["2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z", "2026-01-01T00:00:30Z"]);
        assert_eq!(plan.jobs[0].payload[KEY_FIELD], "acme");
        assert_eq!(plan.last_tick, Some(at("2026-01-01T00:00:30Z")));
        assert_eq!(plan.next_tick, Some(at("2026-01-01T00:00:40Z")));
        assert_eq!(plan.look_at, plan.next_tick);
    }

    #[test]
    fn skip_enqueues_nothing_while_the_previous_job_lives_and_one_after() {
        let plan = planned(&due(Overlap::Skip, "2026-01-01T00:00:20Z", true));
        assert!(plan.jobs.is_empty());
        assert_eq!((plan.skipped, plan.last_tick), (1, Some(at("2026-01-01T00:00:30Z"))));
        let plan = planned(&due(Overlap::Skip, "2026-01-01T00:00:00Z", false));
        assert_eq!(ticks(&plan), ["2026-01-01T00:00:10Z"]);
        assert_eq!(plan.skipped, 2, "the later ticks overlap the first one's job");
    }

    #[test]
    fn buffer_one_keeps_one_tick_and_enqueues_it_once_the_job_before_ends() {
        let plan = planned(&due(Overlap::BufferOne, "2026-01-01T00:00:00Z", true));
        assert!(plan.jobs.is_empty());
        assert_eq!(plan.buffered_tick, Some(at("2026-01-01T00:00:10Z")));
        assert_eq!(plan.skipped, 2);
        assert_eq!(plan.look_at, Some(at(NOW) + BUFFER_RECHECK), "it looks again soon");

        let mut later = due(Overlap::BufferOne, "2026-01-01T00:00:30Z", false);
        later.buffered_tick = Some(at("2026-01-01T00:00:10Z"));
        let plan = planned(&later);
        assert_eq!(ticks(&plan), ["2026-01-01T00:00:10Z"]);
        assert_eq!(plan.buffered_tick, None);
    }

    #[test]
    fn a_tick_asked_for_now_follows_the_policy() {
        let mut asked = due(Overlap::Skip, "2026-01-01T00:00:30Z", false);
        asked.triggered_at = Some(at("2026-01-01T00:00:33Z"));
        let plan = planned(&asked);
        assert_eq!((ticks(&plan), plan.trigger_done), (vec!["2026-01-01T00:00:33Z".to_string()], true));
        asked.schedule.time_zone = "Mars/Olympus".into();
        assert!(!planned(&asked).trigger_done, "kept for when the calendar can be read");
        asked.schedule.time_zone = "UTC".into();
        asked.last_job_live = true;
        let plan = planned(&asked);
        assert_eq!((plan.jobs.len(), plan.skipped), (0, 1));
    }

    #[test]
    fn a_changed_calendar_hands_over_without_losing_or_doubling_a_tick() {
        // Every 10 s until 00:00:25, then every 15 s: the old calendar's
        // 00:00:20 was due and not yet enqueued when the change came.
        let mut changed = due(Overlap::Allow, "2026-01-01T00:00:10Z", false);
        changed.schedule.cron = "*/15 * * * * *".into();
        changed.since = at("2026-01-01T00:00:25Z");
        changed.handovers = vec![Handover {
            cron: "*/10 * * * * *".into(),
            time_zone: "UTC".into(),
            from: at("2026-01-01T00:00:10Z"),
            until: at("2026-01-01T00:00:25Z"),
        }];
        let plan = planned(&changed);
        assert_eq!(ticks(&plan), ["2026-01-01T00:00:20Z", "2026-01-01T00:00:30Z"]);
        assert!(plan.handovers.is_empty(), "done");
        // Two changes before a pass: every calendar's ticks in its own span.
        changed.handovers = vec![
            Handover {
                cron: "*/10 * * * * *".into(),
                time_zone: "UTC".into(),
                from: at("2026-01-01T00:00:10Z"),
                until: at("2026-01-01T00:00:17Z"),
            },
            Handover {
                cron: "*/4 * * * * *".into(),
                time_zone: "UTC".into(),
                from: at("2026-01-01T00:00:17Z"),
                until: at("2026-01-01T00:00:25Z"),
            },
        ];
        assert_eq!(
            ticks(&planned(&changed)),
            ["2026-01-01T00:00:20Z", "2026-01-01T00:00:24Z", "2026-01-01T00:00:30Z"],
            "the middle calendar's ticks too"
        );
        assert_eq!(plan.next_tick, Some(at("2026-01-01T00:00:45Z")));
    }

    #[test]
    fn no_tick_before_the_start_or_after_the_end() {
        let mut bounded = due(Overlap::Allow, "2026-01-01T00:00:00Z", false);
        bounded.schedule.starts_at = Some(at("2026-01-01T00:00:15Z"));
        bounded.schedule.ends_at = Some(at("2026-01-01T00:00:25Z"));
        let plan = planned(&bounded);
        assert_eq!(ticks(&plan), ["2026-01-01T00:00:20Z"]);
        assert_eq!((plan.next_tick, plan.look_at), (None, None), "past its end it is never due again");
    }

    #[test]
    fn a_calendar_the_host_cannot_read_is_reported_and_never_due() {
        let mut bad = due(Overlap::Allow, "2026-01-01T00:00:00Z", false);
        bad.schedule.time_zone = "Mars/Olympus".into();
        let plan = planned(&bad);
        assert!(plan.error.unwrap().contains("Mars/Olympus"));
        assert_eq!((plan.jobs.len(), plan.look_at), (0, None));
    }

    #[test]
    fn only_a_recent_pass_vouches_for_late_ticks() {
        // The fleet's record is old: only the latest tick (the backfill) of those due.
        let mut stale = due(Overlap::Allow, "2026-01-01T00:00:00Z", false);
        stale.passed_at = Some(at("2025-12-31T00:00:00Z"));
        assert_eq!(ticks(&planned(&stale)), ["2026-01-01T00:00:30Z"]);
        // A recent pass vouches only up to where it did: a schedule another
        // transaction held keeps its late ticks.
        let mut held = due(Overlap::Allow, "2026-01-01T00:00:00Z", false);
        held.looked_at = Some(at("2026-01-01T00:00:09Z"));
        assert_eq!(ticks(&planned(&held)).len(), 3);
        held.schedule.backfill = 0;
        held.looked_at = Some(at("2026-01-01T00:00:15Z"));
        assert_eq!(ticks(&planned(&held)), ["2026-01-01T00:00:20Z", "2026-01-01T00:00:30Z"]);
    }

    #[test]
    fn a_type_whose_configuration_cannot_be_read_waits_and_says_so() {
        let mut unreadable = due(Overlap::Allow, "2026-01-01T00:00:00Z", false);
        unreadable.config = None;
        let plan = planned(&unreadable);
        assert!(plan.jobs.is_empty() && plan.error.unwrap().contains("cannot read"));
        assert_eq!((plan.last_tick, plan.look_at), (unreadable.last_tick, Some(at(NOW) + UNREADABLE_RECHECK)));
    }

    #[test]
    fn jitter_is_fixed_per_tick_within_its_window_and_spreads_keys() {
        let tick = at("2026-01-05T09:00:00Z");
        assert_eq!(jitter_ms("report", "acme", tick, 0), 0);
        let a = jitter_ms("report", "acme", tick, 60_000);
        assert_eq!(a, jitter_ms("report", "acme", tick, 60_000));
        assert!(a <= 60_000);
        let spread: std::collections::BTreeSet<_> =
            (0..100).map(|n| jitter_ms("report", &format!("customer-{n}"), tick, 60_000) / 6_000).collect();
        assert!(spread.len() >= 8, "100 keys fall in most tenths of the window: {spread:?}");
        let mut jittered = due(Overlap::Allow, "2026-01-01T00:00:20Z", false);
        jittered.schedule.jitter_ms = 5_000;
        let job = &planned(&jittered).jobs[0];
        let offset = job.run_at.map(|run_at| (run_at - at("2026-01-01T00:00:30Z")).num_milliseconds());
        assert_eq!(
            offset.unwrap_or(0),
            i64::try_from(jitter_ms("report", "acme", at("2026-01-01T00:00:30Z"), 5_000)).unwrap()
        );
    }

    #[test]
    fn a_backfill_takes_each_tick_of_a_past_range_bounded() {
        let hourly = KeyedSchedule::new("report", "acme", "0 * * * *");
        let now = at("2026-03-02T00:00:00Z");
        let ticks = backfill_ticks(&hourly, at("2026-03-01T09:00:00Z"), at("2026-03-01T12:00:00Z"), now).unwrap();
        assert_eq!(ticks.len(), 4, "both ends included: {ticks:?}");
        let refused = |from, to| match backfill_ticks(&hourly, at(from), at(to), now) {
            Err(Error::InvalidSchedule(reason)) => reason,
            other => panic!("{other:?}"),
        };
        assert!(refused("2026-03-01T12:00:00Z", "2026-03-01T09:00:00Z").contains("ends before"));
        assert!(refused("2026-03-01T12:00:00Z", "2026-03-03T09:00:00Z").contains("in the past"));
        assert!(refused("2025-01-01T00:00:00Z", "2026-03-01T00:00:00Z").contains("more than 1000"));
    }

    #[test]
    fn a_write_is_checked_field_by_field() {
        let field_of = |schedule: KeyedSchedule| match schedule.check() {
            Err(Error::InvalidSchedule(reason)) => reason.split(':').next().unwrap().to_string(),
            other => panic!("{other:?}"),
        };
        let good = KeyedSchedule::new("report", "acme", "0 9 * * MON");
        assert!(good.check().is_ok());
        assert_eq!(field_of(KeyedSchedule { key: String::new(), ..good.clone() }), "key");
        assert_eq!(field_of(KeyedSchedule { cron: "0 99 * * *".into(), ..good.clone() }), "cron");
        assert_eq!(field_of(KeyedSchedule { time_zone: "Europe/Atlantis".into(), ..good.clone() }), "time_zone");
        let mut payload = serde_json::Map::new();
        payload.insert(KEY_FIELD.into(), serde_json::json!("x"));
        assert_eq!(field_of(KeyedSchedule { payload, ..good.clone() }), "payload");
        let mut payload = serde_json::Map::new();
        payload.insert(TICK_FIELD.into(), serde_json::json!("x"));
        assert_eq!(field_of(KeyedSchedule { payload, ..good.clone() }), "payload");
        assert_eq!(field_of(KeyedSchedule { jitter_ms: MAX_JITTER_MS + 1, ..good.clone() }), "jitter");
        assert_eq!(field_of(KeyedSchedule { backfill: MAX_BACKFILL + 1, ..good.clone() }), "backfill");
        let starts_at = Some(at("2026-02-01T00:00:00Z"));
        assert_eq!(field_of(KeyedSchedule { starts_at, ends_at: starts_at, ..good.clone() }), "ends_at");
        assert_eq!(field_of(KeyedSchedule { note: "a\0b".into(), ..good.clone() }), "note");
        let mut payload = serde_json::Map::new();
        payload.insert("name".into(), serde_json::json!("a\0b"));
        assert_eq!(field_of(KeyedSchedule { payload, ..good }), "payload");
    }

    /// What `jobhost.schedule_upsert` refuses, every writer refuses: the
    /// parser alone would take a nickname or a seventh field (the year).
    #[test]
    fn a_cron_is_five_fields_or_six_as_sql_takes_it() {
        for cron in ["@daily", "@hourly", "0 9 * * MON 2027", "0 0 9 * * MON 2027", "0 9 * *"] {
            let schedule = KeyedSchedule::new("report", "acme", cron);
            assert!(matches!(schedule.check(), Err(Error::InvalidSchedule(r)) if r.starts_with("cron:")), "{cron}");
        }
        for cron in ["0 9 * * MON", "*/10 0 9 * * MON-FRI", "0 9 L * ?", "0 9 * * 1#2"] {
            assert!(KeyedSchedule::new("report", "acme", cron).check().is_ok(), "{cron}");
        }
    }

    #[test]
    fn a_payload_is_measured_as_the_database_measures_it() {
        let mut schedule = KeyedSchedule::new("report", "acme", "0 9 * * MON");
        schedule.payload.insert("a".into(), serde_json::json!(1));
        schedule.payload.insert("b".into(), serde_json::json!(2));
        // `{"a": 1, "b": 2}` is 16 bytes as jsonb text, 13 compact.
        assert!(check_payload_size(&schedule, 16).is_ok());
        assert!(
            matches!(check_payload_size(&schedule, 15), Err(Error::InvalidSchedule(r)) if r.starts_with("payload:"))
        );
    }
}
