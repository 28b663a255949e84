//! What a writer says of a schedule made at run time (docs/schedules.md,
//! "Schedules made at run time"): its fields, and the changes a running
//! job makes to schedules, held until the job completes. Data only, so a
//! run's effects (`types::RunEffects`) can carry them; the checks and the
//! ticking are `store::keyed_schedule`'s.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a tick does while the job of the schedule's previous tick has not
/// ended (waits, runs, or waits to retry).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Enqueue it anyway.
    #[default]
    Allow,
    /// Enqueue nothing; the tick is counted as skipped.
    Skip,
    /// Keep it, one at most, and enqueue it when that job ends; a further
    /// tick meanwhile is counted as skipped.
    BufferOne,
}

impl Overlap {
    /// The stored and shown name.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
        }
    }

    /// A policy by name (`buffer-one` as well as `buffer_one`).
    ///
    /// # Errors
    /// An unknown name, listing the known ones.
    pub fn parse(name: &str) -> std::result::Result<Self, String> {
        match name {
            "allow" => Ok(Overlap::Allow),
            "skip" => Ok(Overlap::Skip),
            "buffer_one" | "buffer-one" => Ok(Overlap::BufferOne),
            other => Err(format!("overlap {other:?} is not one of allow, skip, buffer-one")),
        }
    }
}

/// A schedule as its writer gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyedSchedule {
    /// The job type each tick enqueues.
    pub job: String,
    /// Names the schedule among its type's (a customer, an account).
    pub key: String,
    /// A cron expression: five fields, or six with seconds first.
    pub cron: String,
    /// The IANA zone the expression is read in.
    #[serde(default = "utc")]
    pub time_zone: String,
    /// Each job's payload before the host adds `_tick` and `_schedule`.
    #[serde(default)]
    pub payload: serde_json::Map<String, serde_json::Value>,
    /// What a tick does while the previous tick's job has not ended.
    #[serde(default)]
    pub overlap: Overlap,
    /// Each tick's job is due up to this long after the tick, by an amount
    /// fixed for the tick (the same on every host).
    #[serde(default)]
    pub jitter_ms: u64,
    /// How many ticks missed while no host looked are enqueued late.
    #[serde(default = "one")]
    pub backfill: u32,
    /// No tick before this.
    #[serde(default, serialize_with = "crate::store::timestamp::serialize_option")]
    pub starts_at: Option<DateTime<Utc>>,
    /// No tick after this.
    #[serde(default, serialize_with = "crate::store::timestamp::serialize_option")]
    pub ends_at: Option<DateTime<Utc>>,
    /// A paused schedule ticks nothing; its ticks meanwhile are not made up.
    #[serde(default)]
    pub paused: bool,
    /// Why it is paused, for the next operator.
    #[serde(default)]
    pub note: String,
}

fn utc() -> String {
    "UTC".into()
}

fn one() -> u32 {
    1
}

impl KeyedSchedule {
    /// A schedule with the defaults: UTC, an empty payload, overlap allowed,
    /// no jitter, one catch-up tick, running.
    pub fn new(job: impl Into<String>, key: impl Into<String>, cron: impl Into<String>) -> Self {
        KeyedSchedule {
            job: job.into(),
            key: key.into(),
            cron: cron.into(),
            time_zone: utc(),
            payload: serde_json::Map::new(),
            overlap: Overlap::Allow,
            jitter_ms: 0,
            backfill: 1,
            starts_at: None,
            ends_at: None,
            paused: false,
            note: String::new(),
        }
    }

    /// The pause a write sets: none when it is neither paused nor noted, so
    /// a write that rewrites a schedule keeps an operator's pause and note
    /// (a resume is its own command).
    pub fn pause_written(&self) -> Option<(bool, &str)> {
        (self.paused || !self.note.is_empty()).then_some((self.paused, self.note.as_str()))
    }
}

/// A change a running job makes to a keyed schedule (the WIT `schedules`
/// interface), written in the transaction that completes the job: a run
/// that fails or is lost changes no schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "change")]
pub enum ScheduleChange {
    /// Creates or replaces the schedule (an upsert; an operator's pause stands).
    Set(KeyedSchedule),
    /// Pauses it, with a note when given.
    Pause {
        /// Its job type.
        job: String,
        /// Its key.
        key: String,
        /// Why, for the next operator.
        note: Option<String>,
    },
    /// Resumes it from now.
    Resume {
        /// Its job type.
        job: String,
        /// Its key.
        key: String,
    },
    /// Removes it: no tick after the completion commits.
    Remove {
        /// Its job type.
        job: String,
        /// Its key.
        key: String,
    },
}

impl ScheduleChange {
    /// The schedule it changes: its job type and key.
    pub fn schedule(&self) -> (String, String) {
        let (job, key) = match self {
            ScheduleChange::Set(schedule) => (&schedule.job, &schedule.key),
            ScheduleChange::Pause { job, key, .. }
            | ScheduleChange::Resume { job, key }
            | ScheduleChange::Remove { job, key } => (job, key),
        };
        (job.clone(), key.clone())
    }

    /// The job type of the schedule it changes.
    pub fn job(&self) -> &str {
        match self {
            ScheduleChange::Set(schedule) => &schedule.job,
            ScheduleChange::Pause { job, .. }
            | ScheduleChange::Resume { job, .. }
            | ScheduleChange::Remove { job, .. } => job,
        }
    }
}
