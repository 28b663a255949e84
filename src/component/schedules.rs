//! The `schedules` imports (WIT 0.8.0): a run creates, replaces, pauses,
//! resumes and removes schedules made at run time. Each change is checked
//! at the call with the rules every writer's schedule passes (its fields,
//! and through the [`crate::component::ChildCheck`] its type registered
//! and a tick's job accepted by the enqueue rules), then held for the
//! completion transaction, so a run that fails or is lost changes nothing.

use chrono::{DateTime, Utc};

use crate::calendar::{TICK_FIELD, tick_text};
use crate::component::bindings::{ScheduleSpec, WitOverlap, jobhost};
use crate::component::children::ChildProbe;
use crate::component::sandbox::SandboxState;
use crate::schedule_spec::{KeyedSchedule, Overlap, ScheduleChange};
use crate::store::Error;
use crate::store::keyed_schedule::{KEY_FIELD, check_key, check_note, check_payload_size};
use crate::types::{ChildJob, check_name};

/// Most schedule changes one run may make.
const SCHEDULE_CHANGE_LIMIT: usize = 1_000;

/// How the fleet's check begins its refusal of a type no host has loaded
/// (`store::Error::UnknownJobType`): that refusal is of the `job` field,
/// any other of the payload.
const UNKNOWN_TYPE: &str = "unknown job type";

impl jobhost::job::schedules::Host for SandboxState {
    async fn set(&mut self, job: String, key: String, spec: ScheduleSpec) -> wasmtime::Result<Result<(), String>> {
        Ok(self.set_schedule(job, key, spec).await)
    }

    fn pause(&mut self, job: String, key: String, note: Option<String>) -> wasmtime::Result<Result<(), String>> {
        if let Some(Err(reason)) = note.as_deref().map(check_note) {
            return Ok(Err(format!("note: {reason}")));
        }
        let held = note.as_ref().map_or(0, String::len);
        Ok(self.hold_change(|job, key| ScheduleChange::Pause { job, key, note }, job, key, held))
    }

    fn resume(&mut self, job: String, key: String) -> wasmtime::Result<Result<(), String>> {
        Ok(self.hold_change(|job, key| ScheduleChange::Resume { job, key }, job, key, 0))
    }

    fn remove(&mut self, job: String, key: String) -> wasmtime::Result<Result<(), String>> {
        Ok(self.hold_change(|job, key| ScheduleChange::Remove { job, key }, job, key, 0))
    }
}

impl SandboxState {
    /// A schedule the run creates or replaces, checked as every writer's
    /// is, then held for the completion transaction.
    async fn set_schedule(&mut self, job: String, key: String, spec: ScheduleSpec) -> Result<(), String> {
        let text = |field: &Option<String>| field.as_ref().map_or(0, String::len);
        let held = job.len() + key.len() + spec.cron.len() + text(&spec.time_zone) + text(&spec.payload);
        self.room_for_change(&job, &key, held)?;
        // Measured as text first, so a payload far past the limit is not parsed.
        let payload_bytes = text(&spec.payload);
        if payload_bytes > self.max_payload_bytes().saturating_mul(2) {
            return Err(format!(
                "payload: {payload_bytes} bytes, more than the largest accepted, {} bytes",
                self.max_payload_bytes()
            ));
        }
        let schedule = schedule_of(job, key, spec)?;
        schedule.check().map_err(|error| refusal_text(&error))?;
        check_payload_size(&schedule, self.max_payload_bytes()).map_err(|error| refusal_text(&error))?;
        if let Some(check) = self.child_check.clone() {
            // A tick's job, as the completion will check it: the type is
            // registered and the payload, with what the host adds, passes
            // the enqueue rules. Its limit's room is no concern of a write.
            let mut payload = schedule.payload.clone();
            payload.insert(TICK_FIELD.to_string(), tick_text(&Utc::now()).into());
            payload.insert(KEY_FIELD.to_string(), schedule.key.clone().into());
            let child = ChildJob {
                job: schedule.job.clone(),
                payload: serde_json::Value::Object(payload),
                queue: None,
                priority: None,
                delay_ms: None,
                batch: None,
            };
            let probe = ChildProbe { child, earlier: Default::default(), at_release: true };
            check(probe).await.map_err(|reason| match reason.starts_with(UNKNOWN_TYPE) {
                true => format!("job: {reason}"),
                false => format!("payload: {reason}"),
            })?;
        }
        // The check awaited: take the bytes now, refusing if they are gone.
        if !self.budget.try_take(held) {
            return Err(self.budget.refusal("this schedule change", held));
        }
        self.effects.schedules.push(ScheduleChange::Set(schedule));
        Ok(())
    }

    /// A pause, resume or removal, checked on the run's terms and held.
    fn hold_change(
        &mut self,
        change: impl FnOnce(String, String) -> ScheduleChange,
        job: String,
        key: String,
        extra: usize,
    ) -> Result<(), String> {
        let held = job.len() + key.len() + extra;
        self.room_for_change(&job, &key, held)?;
        if !self.budget.try_take(held) {
            return Err(self.budget.refusal("this schedule change", held));
        }
        self.effects.schedules.push(change(job, key));
        Ok(())
    }

    /// Whether the run may hold one more change of `held` bytes to the
    /// schedule of `job` and `key`, whose names are checked here.
    fn room_for_change(&self, job: &str, key: &str, held: usize) -> Result<(), String> {
        if self.effects.schedules.len() >= SCHEDULE_CHANGE_LIMIT {
            return Err(format!("a run may make at most {SCHEDULE_CHANGE_LIMIT} schedule changes"));
        }
        if held > self.budget.left() {
            return Err(self.budget.refusal("this schedule change", held));
        }
        check_name(job).map_err(|reason| format!("job: {reason}"))?;
        check_key(key).map_err(|reason| format!("key: {reason}"))
    }
}

/// The schedule a guest's spec describes, with the defaults for what it
/// leaves out; the times and the payload's JSON are checked here, the
/// rest by [`KeyedSchedule::check`].
fn schedule_of(job: String, key: String, spec: ScheduleSpec) -> Result<KeyedSchedule, String> {
    let mut schedule = KeyedSchedule::new(job, key, spec.cron);
    if let Some(zone) = spec.time_zone {
        schedule.time_zone = zone;
    }
    if let Some(text) = spec.payload {
        schedule.payload = match serde_json::from_str(&text) {
            Ok(serde_json::Value::Object(fields)) => fields,
            Ok(_) => return Err("payload: must be a JSON object".to_string()),
            Err(error) => return Err(format!("payload: is not valid JSON: {error}")),
        };
    }
    schedule.overlap = match spec.overlap.unwrap_or(WitOverlap::Allow) {
        WitOverlap::Allow => Overlap::Allow,
        WitOverlap::Skip => Overlap::Skip,
        WitOverlap::BufferOne => Overlap::BufferOne,
    };
    schedule.jitter_ms = spec.jitter_ms.unwrap_or(0);
    schedule.backfill = spec.backfill.unwrap_or(1);
    schedule.starts_at = spec.starts_at_ms.map(|ms| instant("starts_at", ms)).transpose()?;
    schedule.ends_at = spec.ends_at_ms.map(|ms| instant("ends_at", ms)).transpose()?;
    Ok(schedule)
}

/// An instant given in milliseconds since the Unix epoch.
fn instant(field: &str, ms: u64) -> Result<DateTime<Utc>, String> {
    i64::try_from(ms)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .ok_or_else(|| format!("{field}: must be a time between the years 1 and 9999"))
}

/// A refused schedule's reason, naming the field, as the guest receives it.
fn refusal_text(error: &Error) -> String {
    match error {
        Error::InvalidSchedule(reason) => reason.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cron: &str) -> ScheduleSpec {
        ScheduleSpec {
            cron: cron.to_string(),
            time_zone: None,
            payload: None,
            overlap: None,
            jitter_ms: None,
            backfill: None,
            starts_at_ms: None,
            ends_at_ms: None,
        }
    }

    #[test]
    fn a_spec_left_out_takes_the_defaults_of_every_writer() {
        let schedule = schedule_of("report".into(), "acme".into(), spec("0 9 * * 1")).unwrap();
        assert_eq!(schedule, KeyedSchedule::new("report", "acme", "0 9 * * 1"));
    }

    #[test]
    fn a_spec_is_converted_field_by_field() {
        let spec = ScheduleSpec {
            time_zone: Some("Europe/Berlin".into()),
            payload: Some(r#"{"customer": 7}"#.into()),
            overlap: Some(WitOverlap::BufferOne),
            jitter_ms: Some(500),
            backfill: Some(3),
            starts_at_ms: Some(1_800_000_000_000),
            ends_at_ms: Some(1_900_000_000_000),
            ..spec("*/5 * * * *")
        };
        let schedule = schedule_of("sync".into(), "acct-1".into(), spec).unwrap();
        assert_eq!(schedule.time_zone, "Europe/Berlin");
        assert_eq!(schedule.payload["customer"], 7);
        assert_eq!(schedule.overlap, Overlap::BufferOne);
        assert_eq!((schedule.jitter_ms, schedule.backfill), (500, 3));
        assert_eq!(schedule.starts_at.unwrap().timestamp_millis(), 1_800_000_000_000);
        assert_eq!(schedule.ends_at.unwrap().timestamp_millis(), 1_900_000_000_000);
    }

    #[test]
    fn a_payload_that_is_no_json_object_is_refused_naming_the_field() {
        let list = ScheduleSpec { payload: Some("[1]".into()), ..spec("* * * * *") };
        assert_eq!(schedule_of("a".into(), "k".into(), list).unwrap_err(), "payload: must be a JSON object");
        let broken = ScheduleSpec { payload: Some("{".into()), ..spec("* * * * *") };
        assert!(schedule_of("a".into(), "k".into(), broken).unwrap_err().starts_with("payload: is not valid JSON"));
    }

    #[test]
    fn the_fleets_refusal_of_an_unknown_type_is_told_apart_from_the_payloads() {
        assert!(Error::UnknownJobType("report".into()).to_string().starts_with(UNKNOWN_TYPE));
        let payload = Error::PayloadTooLarge { job: "report".into(), bytes: 9, max: 8 };
        assert!(!payload.to_string().starts_with(UNKNOWN_TYPE));
    }

    #[test]
    fn an_instant_past_what_a_time_holds_is_refused() {
        let far = ScheduleSpec { ends_at_ms: Some(u64::MAX), ..spec("* * * * *") };
        assert!(schedule_of("a".into(), "k".into(), far).unwrap_err().starts_with("ends_at:"));
    }
}
