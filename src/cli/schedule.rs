//! The `schedule` commands: schedules made at run time, one per job type
//! and key (docs/schedules.md, "Schedules made at run time"), added,
//! changed, paused, resumed, removed and ticked now from the command line.

use std::process::ExitCode;

use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Args, Subcommand};

use super::operator::{open, open_existing};
use super::{DbArgs, fail, fail_store};
use crate::store::ScheduleStatus;
use crate::store::keyed_schedule::{KeyedSchedule, KeyedScheduleStatus, Overlap};
use crate::text::clip;

/// The width tables are laid out for.
const WIDTH: usize = 80;

/// What to do with a keyed schedule.
#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Add a schedule for a job type and key; refused when one exists
    /// (`set` replaces it).
    Add(Write),
    /// Add or replace the schedule of a job type and key.
    Set(Write),
    /// Pause a schedule: it ticks nothing until resumed, and its ticks
    /// meanwhile are not made up.
    Pause {
        /// The job type.
        job: String,
        /// The schedule's key.
        key: String,
        /// Why, for the next operator.
        #[arg(long)]
        note: Option<String>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Resume a paused schedule from its next tick.
    Resume {
        /// The job type.
        job: String,
        /// The schedule's key.
        key: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Remove a schedule: no tick after this.
    Remove {
        /// The job type.
        job: String,
        /// The schedule's key.
        key: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Tick a schedule once now, under its overlap policy (the next pass of
    /// any host enqueues it, within a second).
    Trigger {
        /// The job type.
        job: String,
        /// The schedule's key.
        key: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Enqueue the ticks of a past range, each once (a tick a job of the
    /// schedule already has is not enqueued again), whatever the overlap
    /// policy; at most 1,000 ticks.
    Backfill {
        /// The job type.
        job: String,
        /// The schedule's key.
        key: String,
        /// The range's first instant (RFC 3339), included.
        #[arg(long)]
        from: DateTime<Utc>,
        /// The range's last instant (RFC 3339), included; not after now.
        #[arg(long)]
        to: DateTime<Utc>,
        /// One JSON object: the ticks enqueued with their jobs, and how many were there already.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List the schedules made at run time (`jobhost schedules` lists the
    /// declared ones too).
    List {
        /// Only this job type's.
        #[arg(long)]
        job: Option<String>,
        /// One JSON object per schedule, per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// One schedule, every field.
    Show {
        /// The job type.
        job: String,
        /// The schedule's key.
        key: String,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// A schedule as `add` and `set` take it.
#[derive(Debug, Args)]
pub struct Write {
    /// The job type each tick enqueues.
    job: String,
    /// The schedule's key among the type's: a customer, an account.
    key: String,
    /// A cron expression: five fields, or six with seconds first.
    #[arg(long)]
    cron: String,
    /// The IANA zone the expression is read in.
    #[arg(long, default_value = "UTC")]
    zone: String,
    /// Each job's payload, a JSON object (the host adds `_tick` and `_schedule`).
    #[arg(long, default_value = "{}")]
    payload: String,
    /// While the previous tick's job has not ended: allow, skip or buffer-one.
    #[arg(long, default_value = "allow")]
    overlap: String,
    /// Spread each tick's start over this window (`30s`, `5m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    jitter: Option<std::time::Duration>,
    /// How many ticks missed while no host looked are enqueued late.
    #[arg(long, default_value_t = 1)]
    backfill: u32,
    /// No tick before this time (RFC 3339).
    #[arg(long)]
    starts: Option<DateTime<Utc>>,
    /// No tick after this time (RFC 3339).
    #[arg(long)]
    ends: Option<DateTime<Utc>>,
    /// Write it paused.
    #[arg(long)]
    paused: bool,
    /// A note, shown with it.
    #[arg(long, default_value = "")]
    note: String,
    #[command(flatten)]
    db: DbArgs,
}

impl Write {
    fn schedule(&self) -> Result<KeyedSchedule, String> {
        let payload = match serde_json::from_str::<serde_json::Value>(&self.payload) {
            Ok(serde_json::Value::Object(payload)) => payload,
            Ok(_) => return Err("invalid schedule: payload: must be a JSON object".into()),
            Err(error) => return Err(format!("invalid schedule: payload: not JSON: {error}")),
        };
        Ok(KeyedSchedule {
            time_zone: self.zone.clone(),
            payload,
            overlap: Overlap::parse(&self.overlap).map_err(|reason| format!("invalid schedule: {reason}"))?,
            jitter_ms: self.jitter.map_or(0, |jitter| u64::try_from(jitter.as_millis()).unwrap_or(u64::MAX)),
            backfill: self.backfill,
            starts_at: self.starts,
            ends_at: self.ends,
            paused: self.paused,
            note: self.note.clone(),
            ..KeyedSchedule::new(&self.job, &self.key, &self.cron)
        })
    }
}

pub async fn run(action: ScheduleAction) -> ExitCode {
    match action {
        ScheduleAction::Add(write) => upsert(&write, true).await,
        ScheduleAction::Set(write) => upsert(&write, false).await,
        ScheduleAction::Pause { job, key, note, db } => pause(&job, &key, true, note.as_deref(), &db).await,
        ScheduleAction::Resume { job, key, db } => pause(&job, &key, false, None, &db).await,
        ScheduleAction::Remove { job, key, db } => remove(&job, &key, &db).await,
        ScheduleAction::Trigger { job, key, db } => trigger(&job, &key, &db).await,
        ScheduleAction::Backfill { job, key, from, to, json, db } => backfill(&job, &key, from, to, json, &db).await,
        ScheduleAction::List { job, json, db } => list(job.as_deref(), json, &db).await,
        ScheduleAction::Show { job, key, json, db } => show(&job, &key, json, &db).await,
    }
}

async fn upsert(write: &Write, only_new: bool) -> ExitCode {
    let schedule = match write.schedule() {
        Ok(schedule) => schedule,
        Err(reason) => return fail(reason),
    };
    let store = match open(&write.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    if only_new {
        match store.keyed_schedules(Some(&schedule.job), Some(&schedule.key)).await {
            Ok(found) if !found.is_empty() => {
                return fail(format!(
                    "{} {:?} has a schedule already: `jobhost schedule set` replaces it",
                    schedule.job, schedule.key
                ));
            }
            Ok(_) => {}
            Err(error) => return fail(error),
        }
    }
    match store.keyed_schedule_upsert(&schedule).await {
        Ok(created) => {
            let was = if created { "added" } else { "replaced" };
            println!(
                "schedule {} {:?} {was}: {:?} in {}, overlap {}",
                schedule.job,
                schedule.key,
                schedule.cron,
                schedule.time_zone,
                schedule.overlap.as_str()
            );
            ExitCode::SUCCESS
        }
        Err(error) => fail_store(error),
    }
}

/// The answer to a command on one schedule: done, or there is none.
fn done_or_missing(done: crate::store::Result<bool>, job: &str, key: &str, what: &str) -> ExitCode {
    match done {
        Ok(true) => {
            println!("schedule {job} {key:?} {what}");
            ExitCode::SUCCESS
        }
        Ok(false) => fail(format!("there is no schedule {job} {key:?} (`jobhost schedule list` lists them)")),
        Err(error) => fail(error),
    }
}

async fn pause(job: &str, key: &str, paused: bool, note: Option<&str>, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let what = if paused { "paused" } else { "resumed" };
    done_or_missing(store.keyed_schedule_pause(job, key, paused, note).await, job, key, what)
}

async fn remove(job: &str, key: &str, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    done_or_missing(store.keyed_schedule_remove(job, key).await, job, key, "removed")
}

async fn trigger(job: &str, key: &str, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let what = "triggered: the next pass enqueues its tick";
    done_or_missing(store.keyed_schedule_trigger(job, key).await, job, key, what)
}

async fn backfill(job: &str, key: &str, from: DateTime<Utc>, to: DateTime<Utc>, json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.keyed_schedule_backfill(job, key, from, to).await {
        Ok(Some(done)) if json => {
            println!("{}", serde_json::to_string(&done).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(Some(done)) => {
            let ids: Vec<String> = done.enqueued.iter().map(|tick| tick.id.to_string()).collect();
            let jobs = if ids.is_empty() { String::new() } else { format!(" (jobs {})", ids.join(", ")) };
            println!(
                "schedule {job} {key:?}: {} ticks enqueued{}, {} there already",
                done.enqueued.len(),
                clip(&jobs, WIDTH),
                done.already
            );
            ExitCode::SUCCESS
        }
        Ok(None) => fail(format!("there is no schedule {job} {key:?} (`jobhost schedule list` lists them)")),
        Err(error) => fail_store(error),
    }
}

async fn list(job: Option<&str>, json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let schedules = match store.keyed_schedules(job, None).await {
        Ok(schedules) => schedules,
        Err(error) => return fail(error),
    };
    print_keyed(&schedules, json);
    super::say_if_none(
        schedules.len(),
        json,
        "no schedules made at run time: `jobhost schedule add JOB KEY --cron ...` adds one (see docs/schedules.md)",
    );
    ExitCode::SUCCESS
}

/// `jobhost schedules`: the declared schedules, then those made at run time.
pub async fn schedules(json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let listing = match store.schedule_list(None).await {
        Ok(listing) => listing,
        Err(error) => return fail(error),
    };
    for state in &listing.schedules {
        let status = ScheduleStatus::new(state, listing.now);
        if json {
            println!("{}", serde_json::to_string(&status).unwrap_or_default());
            continue;
        }
        // The times on a line of their own, so they line up; the rest
        // wraps to fit 80 columns (a long type name or zone).
        let served = if status.served { "served" } else { "not served (no ticks)" };
        let head = format!("{} {:?}", status.job, status.cron);
        let rest = format!("in {}, backfill {}, {served}", status.time_zone, status.backfill);
        if head.chars().count() + 1 + rest.chars().count() <= 80 {
            println!("{head} {rest}");
        } else {
            println!("{}", crate::text::clip(&head, 80));
            println!("{}", crate::text::clip(&format!("  {rest}"), 80));
        }
        let time = |t: Option<DateTime<Utc>>| t.map_or("none".into(), |t| t.to_rfc3339_opts(SecondsFormat::Secs, true));
        println!("  last tick {:<20}  next tick {}", time(status.last_tick), time(status.next_tick));
    }
    let keyed = match store.keyed_schedules(None, None).await {
        Ok(keyed) => keyed,
        Err(error) => return fail(error),
    };
    print_keyed(&keyed, json);
    super::say_if_none(
        listing.schedules.len() + keyed.len(),
        json,
        "no schedules: no registered job type declares one, and none was made at run time (see docs/schedules.md)",
    );
    ExitCode::SUCCESS
}

/// Prints keyed schedules, as JSON lines or as [`keyed_lines`].
pub fn print_keyed(schedules: &[KeyedScheduleStatus], json: bool) {
    for status in schedules {
        if json {
            println!("{}", serde_json::to_string(status).unwrap_or_default());
        } else {
            for line in keyed_lines(status) {
                println!("{line}");
            }
        }
    }
}

async fn show(job: &str, key: &str, json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.keyed_schedules(Some(job), Some(key)).await {
        Ok(found) => match found.first() {
            Some(status) if json => {
                println!("{}", serde_json::to_string_pretty(status).unwrap_or_default());
                ExitCode::SUCCESS
            }
            Some(status) => {
                for line in keyed_lines(status) {
                    println!("{line}");
                }
                let payload = serde_json::to_string(&status.schedule.payload).unwrap_or_default();
                println!("{}", clip(&format!("  payload {payload}"), WIDTH));
                let bounds =
                    format!("  starts {}  ends {}", time(status.schedule.starts_at), time(status.schedule.ends_at));
                println!("{bounds}");
                println!("  since {}  updated {}", time(Some(status.since)), time(Some(status.updated_at)));
                ExitCode::SUCCESS
            }
            None => fail(format!("there is no schedule {job} {key:?} (`jobhost schedule list` lists them)")),
        },
        Err(error) => fail(error),
    }
}

fn time(time: Option<DateTime<Utc>>) -> String {
    time.map_or("none".into(), |t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
}

/// A keyed schedule in lines of at most 80 columns: its type, key and
/// calendar; its last and next tick; its state when not plainly running.
pub fn keyed_lines(status: &KeyedScheduleStatus) -> Vec<String> {
    let s = &status.schedule;
    let mut policy = format!("in {}, {}", s.time_zone, s.overlap.as_str().replace('_', "-"));
    if s.jitter_ms > 0 {
        policy.push_str(&format!(
            ", jitter {}",
            humantime::format_duration(std::time::Duration::from_millis(s.jitter_ms))
        ));
    }
    let whole = format!("{} {:?} {:?} {policy}", s.job, s.key, s.cron);
    let mut lines = if whole.chars().count() <= WIDTH {
        vec![whole]
    } else {
        // The key is what gives: the calendar keeps a line of its own.
        let calendar = format!("  {:?} {policy}", s.cron);
        let mut lines = vec![clip(&format!("{} {:?}", s.job, s.key), WIDTH)];
        match calendar.split_once(", ") {
            Some((when, how)) if calendar.chars().count() > WIDTH => {
                lines.push(clip(when, WIDTH));
                lines.push(clip(&format!("  {how}"), WIDTH));
            }
            _ => lines.push(clip(&calendar, WIDTH)),
        }
        lines
    };
    let job = status.last_job.map_or(String::new(), |id| format!(" (job {id})"));
    let next = if s.paused { "paused".to_string() } else { time(status.next_tick) };
    let last = format!("  last tick {}{job}", time(status.last_tick));
    let next = format!("next tick {next}");
    if last.chars().count() + 2 + next.chars().count() <= WIDTH {
        lines.push(format!("{last}  {next}"));
    } else {
        lines.push(last);
        lines.push(format!("  {next}"));
    }
    let mut notes = Vec::new();
    if s.paused && !s.note.is_empty() {
        notes.push(format!("note {:?}", s.note));
    }
    if status.skipped > 0 {
        notes.push(format!("{} skipped", status.skipped));
    }
    if let Some(tick) = status.buffered_tick {
        notes.push(format!("buffered {}", time(Some(tick))));
    }
    if status.triggered_at.is_some() {
        notes.push("triggered, not yet enqueued".into());
    }
    if let Some(error) = &status.error {
        notes.push(format!("error: {error}"));
    }
    lines.extend(notes.iter().map(|note| clip(&format!("  {note}"), WIDTH)));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_schedule_with_long_names_fits_80_columns() {
        let at = |text: &str| DateTime::parse_from_rfc3339(text).unwrap().to_utc();
        let schedule = KeyedSchedule {
            time_zone: "America/Argentina/ComodRivadavia".into(),
            overlap: Overlap::BufferOne,
            jitter_ms: 90_000,
            paused: true,
            note: "the customer asked us to hold their reports until the migration is over, see ticket 4471".into(),
            ..KeyedSchedule::new(
                "weekly_customer_report",
                "customer:4f1d2c3b-9a8e-4b7c-8d6e-5f4a3b2c1d0e/region:eu-central-1",
                "0 0 9 * * MON-FRI",
            )
        };
        let status = KeyedScheduleStatus {
            schedule,
            since: at("2026-12-01T00:00:00Z"),
            last_tick: Some(at("2026-12-07T08:00:00Z")),
            last_job: Some(1_234_567_890),
            buffered_tick: Some(at("2026-12-07T09:00:00Z")),
            skipped: 12,
            next_tick: Some(at("2026-12-08T08:00:00Z")),
            error: Some("payload of job \"weekly_customer_report\" is 2000000 bytes of JSON, more than allowed".into()),
            triggered_at: None,
            created_at: at("2026-12-01T00:00:00Z"),
            updated_at: at("2026-12-07T00:00:00Z"),
        };
        let lines = keyed_lines(&status);
        assert!(lines.iter().all(|line| line.chars().count() <= WIDTH), "{lines:#?}");
        assert!(lines[0].starts_with("weekly_customer_report \"customer:"));
        assert!(
            lines.iter().any(|line| line.contains("\"0 0 9 * * MON-FRI\" in America")),
            "the calendar is kept: {lines:#?}"
        );
        assert!(lines.iter().any(|line| line.contains("buffer-one, jitter 1m 30s")), "{lines:#?}");
        assert!(lines.iter().any(|line| line.contains("(job 1234567890)")), "{lines:#?}");
        assert!(lines.iter().any(|line| line.ends_with("next tick paused")), "{lines:#?}");
        let running = KeyedScheduleStatus {
            schedule: KeyedSchedule { paused: false, ..status.schedule.clone() },
            next_tick: Some(at("2026-12-08T08:00:00Z")),
            ..status.clone()
        };
        let running = keyed_lines(&running);
        assert!(running.iter().all(|line| line.chars().count() <= WIDTH), "{running:#?}");
        assert!(running.iter().any(|line| line == "  next tick 2026-12-08T08:00:00Z"), "its own line: {running:#?}");
        assert!(lines.iter().any(|line| line.contains("note \"the customer asked")), "{lines:#?}");
        assert!(lines.iter().any(|line| line == "  12 skipped"), "{lines:#?}");
        assert!(lines.iter().any(|line| line.starts_with("  error: payload of job")), "{lines:#?}");
    }
}
