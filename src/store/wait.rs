//! Durable waits and events: a workflow step that waits, besides its
//! dependencies, for a time or for an event, and the events that end such
//! waits. A wait is *armed* when the step's dependencies have all ended
//! (at once for a step with none); it then ends exactly once (guarantee
//! 17): by its time, by a matching event, or by its timeout, whichever
//! comes first, in the transaction that records that end, and that same
//! transaction releases the step (with the event's payload under `_event`).
//!
//! The vocabulary, and the rules decided once for both backends: what a
//! declared wait becomes when its workflow is created (its match rendered
//! from the step's payload), and how an event's payload is compared with
//! it. PostgreSQL applies them in `jobhost.workflow_waits_arm`,
//! `jobhost.workflow_waits_end` and `jobhost.send_event`
//! (src/store/postgres/functions/); SQLite in `sqlite::wait`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Error, Result};
use crate::step::IfFailed;
pub use crate::step::{EVENT_KEY, MAX_EVENT_KEY_BYTES, MAX_WAIT_MS, Wait, check_event_key};
use crate::template::KeyTemplate;

/// A declared wait, checked, with its match rendered: what is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedWait {
    /// The event key waited for; none for a sleep.
    pub key: Option<String>,
    /// Fields the event's payload must hold, as text.
    #[serde(rename = "match")]
    pub matching: BTreeMap<String, String>,
    /// A sleep's length after the dependencies end.
    pub sleep_ms: Option<i64>,
    /// A sleep's end.
    pub until: Option<DateTime<Utc>>,
    /// An event wait's length once armed.
    pub timeout_ms: Option<i64>,
    /// What a timed-out event wait does to its step.
    pub on_timeout: IfFailed,
    /// How far back an event wait looks when it is armed.
    pub lookback_ms: i64,
    /// The match's templates, when a field they name is not in the step's
    /// payload: rendered when the wait is armed, from its payload and its
    /// dependencies' outputs ([`render_later`]); `matching` is empty until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_later: Option<BTreeMap<String, String>>,
}

/// The default policy of an event wait that times out: the step fails,
/// naming the wait (a step that was to act on a confirmation must not act
/// without one unless its workflow says so).
pub const DEFAULT_ON_TIMEOUT: IfFailed = IfFailed::Fail;

/// Checks `wait` and renders its match from the step's `payload`. A
/// template naming a field the payload lacks is kept for the arming when
/// the step has dependencies (`after`: their outputs may hold it), and
/// refused when it has none.
///
/// # Errors
/// [`Error::InvalidWorkflow`]-ready text: the wait's shape, or a match
/// template that does not parse, or does not render for a step without
/// dependencies.
pub fn prepare(wait: &Wait, payload: &serde_json::Value, after: bool) -> std::result::Result<PreparedWait, String> {
    wait.check()?;
    let mut matching = BTreeMap::new();
    let mut match_later = None;
    for (field, template) in &wait.matching {
        let parsed = KeyTemplate::parse(template).map_err(|e| format!("match field {field:?}: {e}"))?;
        match parsed.render(payload) {
            Ok(text) => {
                matching.insert(field.clone(), text);
            }
            Err(crate::template::RenderError::Missing { .. }) if after => match_later = Some(wait.matching.clone()),
            Err(e) => return Err(format!("match field {field:?}: {e}")),
        }
    }
    if match_later.is_some() {
        matching.clear();
    }
    let ms = |v: Option<u64>| v.map(|ms| i64::try_from(ms).unwrap_or(i64::MAX));
    Ok(PreparedWait {
        key: wait.event.clone(),
        matching,
        sleep_ms: ms(wait.sleep_ms),
        until: wait.until,
        timeout_ms: ms(wait.timeout_ms),
        on_timeout: wait.on_timeout.unwrap_or(DEFAULT_ON_TIMEOUT),
        lookback_ms: ms(wait.lookback_ms).unwrap_or(0),
        match_later,
    })
}

/// Renders a match kept for the arming ([`PreparedWait::match_later`])
/// from the step's `payload` and its dependencies' `outputs` (in the order
/// they were declared): each field from the payload when it has it, else
/// from the first output that has it. `None` when a field is in none of
/// them: the wait then ends `unmatched` and fails its step.
pub fn render_later(
    templates: &BTreeMap<String, String>,
    payload: &serde_json::Value,
    outputs: &[serde_json::Value],
) -> Option<BTreeMap<String, String>> {
    let mut source = serde_json::Map::new();
    for object in outputs.iter().rev().chain(std::iter::once(payload)).filter_map(serde_json::Value::as_object) {
        source.extend(object.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let source = serde_json::Value::Object(source);
    templates
        .iter()
        .map(|(field, template)| {
            let text = KeyTemplate::parse(template).ok()?.render(&source).ok()?;
            Some((field.clone(), text))
        })
        .collect()
}

/// Whether an event's payload holds every field of a wait's match, each
/// as the same text (`->>` on PostgreSQL: strings as themselves, numbers
/// in their canonical form, booleans as `true`/`false`).
pub fn matches(matching: &BTreeMap<String, String>, payload: &serde_json::Value) -> bool {
    matching.iter().all(|(field, want)| field_text(payload, field).is_some_and(|have| &have == want))
}

/// A match of exactly one field as the text `["field","value"]`, which
/// SQLite stores beside the match and looks waits up by ([`probes`]).
pub fn match_one(matching: &BTreeMap<String, String>) -> Option<String> {
    let mut fields = matching.iter();
    match (fields.next(), fields.next()) {
        (Some((field, value)), None) => serde_json::to_string(&[field, value]).ok(),
        _ => None,
    }
}

/// The one-field matches an event's payload holds, as [`match_one`] writes
/// them: the waits to look up by.
pub fn probes(payload: &serde_json::Value) -> Vec<String> {
    let Some(object) = payload.as_object() else {
        return Vec::new();
    };
    object
        .keys()
        .filter_map(|field| field_text(payload, field).and_then(|text| serde_json::to_string(&[field, &text]).ok()))
        .collect()
}

fn field_text(payload: &serde_json::Value, field: &str) -> Option<String> {
    match payload.as_object()?.get(field)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        serde_json::Value::Number(n) => crate::template::number_text(n.as_str()).ok(),
        serde_json::Value::Null | serde_json::Value::Array(_) | serde_json::Value::Object(_) => None,
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitEnd {
    /// Its event came.
    Event,
    /// Its sleep ran out.
    Time,
    /// Its event did not come in time.
    Timeout,
    /// It was not waited for: a dependency did not complete and the
    /// step's policy ends it, or its workflow was cancelled.
    Skipped,
    /// Its match, kept for the arming, named a field neither the step's
    /// payload nor its dependencies' outputs hold: the step fails.
    Unmatched,
}

impl WaitEnd {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitEnd::Event => "event",
            WaitEnd::Time => "time",
            WaitEnd::Timeout => "timeout",
            WaitEnd::Skipped => "skipped",
            WaitEnd::Unmatched => "unmatched",
        }
    }

    /// Reads a stored name.
    pub fn decode(text: &str) -> Result<WaitEnd> {
        Ok(match text {
            "event" => WaitEnd::Event,
            "time" => WaitEnd::Time,
            "timeout" => WaitEnd::Timeout,
            "skipped" => WaitEnd::Skipped,
            "unmatched" => WaitEnd::Unmatched,
            other => return Err(Error::Decode(format!("unknown wait end {other:?}"))),
        })
    }
}

/// A step's wait as operators see it (read back as the stored row's JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepWait {
    /// The event key waited for; none for a sleep.
    pub key: Option<String>,
    /// The fields an event must hold.
    #[serde(rename = "match", default)]
    pub matching: BTreeMap<String, String>,
    /// When it was armed (its dependencies had ended); none before.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub armed_at: Option<DateTime<Utc>>,
    /// When its sleep ends, or its event wait times out.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub due_at: Option<DateTime<Utc>>,
    /// What a timeout does.
    pub on_timeout: IfFailed,
    /// How it ended, once it has.
    pub ended_by: Option<WaitEnd>,
    /// The event that ended it.
    pub event_id: Option<i64>,
    /// The match's templates, until the wait is armed and renders them
    /// from its payload and its dependencies' outputs; none otherwise.
    #[serde(default)]
    pub match_later: Option<BTreeMap<String, String>>,
}

impl StepWait {
    /// This wait with the values it matches left out (the field names
    /// kept): they come from a step's payload or its dependencies' outputs.
    pub fn without_values(&self) -> StepWait {
        let blank = |fields: &BTreeMap<String, String>| fields.keys().map(|f| (f.clone(), "…".to_string())).collect();
        StepWait { matching: blank(&self.matching), match_later: self.match_later.as_ref().map(blank), ..self.clone() }
    }

    /// One line for people: `event order.confirmed {order_id=42}, 2h 3m left (then fail)`.
    pub fn describe(&self, now: DateTime<Utc>) -> String {
        let matching = self.match_later.as_ref().unwrap_or(&self.matching);
        let mut text = match &self.key {
            Some(key) if matching.is_empty() => format!("event {key}"),
            Some(key) => {
                let fields: Vec<String> = matching.iter().map(|(f, v)| format!("{f}={v}")).collect();
                format!("event {key} {{{}}}", fields.join(", "))
            }
            None => "sleep".to_string(),
        };
        match (self.ended_by, self.armed_at, self.due_at) {
            (Some(end), _, _) => {
                text.push_str(&format!(", ended by {}", end.as_str()));
                if let Some(id) = self.event_id {
                    text.push_str(&format!(" {id}"));
                }
            }
            (None, None, _) => text.push_str(", after its dependencies"),
            (None, Some(_), Some(due)) => {
                let left = coarse((due - now).num_seconds().max(0));
                match self.key {
                    Some(_) => text.push_str(&format!(", {left} left, then {}", self.on_timeout.as_str())),
                    None => text.push_str(&format!(" until {}, {left} left", due.format("%Y-%m-%d %H:%M:%S UTC"))),
                }
            }
            (None, Some(_), None) => {}
        }
        text
    }
}

/// A span of time in its two largest units: `2d 23h`, `5m 3s`, `12s`.
fn coarse(seconds: i64) -> String {
    let units = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")];
    let mut parts = Vec::new();
    let mut rest = seconds;
    for (size, unit) in units {
        if rest >= size || (parts.is_empty() && size == 1) {
            parts.push(format!("{}{unit}", rest / size));
            rest %= size;
        } else if !parts.is_empty() {
            break;
        }
        if parts.len() == 2 {
            break;
        }
    }
    parts.join(" ")
}

/// An event as sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SentEvent {
    /// Its id.
    pub id: i64,
    /// Waits it ended (each released its step).
    pub released: i64,
    /// Whether an event with the same idempotency key had been sent
    /// before: then nothing new was stored or released, and `id` is that
    /// event's.
    pub duplicate: bool,
    /// The jobs it enqueued for the types subscribed to its key (the first
    /// event's, for a duplicate).
    pub jobs: Vec<TriggeredJob>,
}

/// A job an event enqueued for a type subscribed to its key, or why that
/// type's enqueue was refused (its payload, a `raise` limit): the event is
/// sent either way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggeredJob {
    /// The job type.
    pub job: String,
    /// The job's id: a new job, or the one holding its uniqueness key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    /// Why none was enqueued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An event as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredEvent {
    /// Its id.
    pub id: i64,
    /// Its key.
    pub key: String,
    /// Its payload.
    pub payload: serde_json::Value,
    /// Where it came from: `sql`, `api`, `cli`.
    pub source: String,
    /// When it was sent.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub sent_at: DateTime<Utc>,
    /// Waits it ended.
    pub released: i64,
    /// The jobs it enqueued for the types subscribed to its key.
    pub jobs: Vec<TriggeredJob>,
}

/// An event's row as both backends list it, its time in the backend's own
/// form (`T`): id, key, payload, source, sent at, waits released, jobs.
pub type EventRow<T> =
    (i64, String, sqlx::types::Json<serde_json::Value>, String, T, i64, sqlx::types::Json<Vec<TriggeredJob>>);

/// The event a listed row holds, its time read by `time`.
pub fn stored_event<T>(row: EventRow<T>, time: impl Fn(T) -> DateTime<Utc>) -> StoredEvent {
    let (id, key, payload, source, sent_at, released, jobs) = row;
    StoredEvent { id, key, payload: payload.0, source, sent_at: time(sent_at), released, jobs: jobs.0 }
}

/// Checks an event before it is sent: its payload at most `max_bytes` of
/// JSON, the job payload limit (PostgreSQL's function checks it again as
/// `jsonb` text, against the database's `jobhost.max_payload_bytes`).
///
/// # Errors
/// [`Error::InvalidEvent`]: a bad key, a payload that is not an object, or
/// one too large.
pub fn check_event(key: &str, payload: &serde_json::Value, max_bytes: usize) -> Result<()> {
    check_event_key(key).map_err(Error::InvalidEvent)?;
    if !payload.is_object() {
        return Err(Error::InvalidEvent("an event's payload must be a JSON object".into()));
    }
    if holds_nul(payload) {
        return Err(Error::InvalidEvent(
            "an event's payload holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store".into(),
        ));
    }
    let bytes = jsonb_text_len(payload);
    if bytes > max_bytes {
        return Err(Error::InvalidEvent(format!(
            "an event's payload is {bytes} bytes of JSON, more than the most accepted, {max_bytes}"
        )));
    }
    Ok(())
}

/// Whether any string of `value`, a key or a value, holds a NUL.
pub(crate) fn holds_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(text) => text.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(fields) => fields.iter().any(|(key, value)| key.contains('\0') || holds_nul(value)),
        _ => false,
    }
}

/// The length of `value` as PostgreSQL measures a payload, its `jsonb`
/// text: a space after each `:` and `,`, so a run's event is refused at
/// its call, not by its completion's transaction.
pub fn jsonb_text_len(value: &serde_json::Value) -> usize {
    let separators = |n: usize| 2 * n.saturating_sub(1);
    match value {
        serde_json::Value::Array(items) => {
            2 + items.iter().map(jsonb_text_len).sum::<usize>() + separators(items.len())
        }
        serde_json::Value::Object(fields) => {
            let each: usize = fields
                .iter()
                .map(|(key, value)| serde_json::Value::from(key.as_str()).to_string().len() + 2 + jsonb_text_len(value))
                .sum();
            2 + each + separators(fields.len())
        }
        scalar => scalar.to_string().len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_match_is_rendered_from_the_steps_payload_and_compared_as_text() {
        let wait: Wait = serde_json::from_value(
            json!({"event": "order.confirmed", "match": {"order_id": "{order}", "kind": "card"}}),
        )
        .unwrap();
        let prepared = prepare(&wait, &json!({"order": 42}), false).unwrap();
        assert_eq!(prepared.matching["order_id"], "42");
        assert_eq!(prepared.on_timeout, IfFailed::Fail);
        assert!(matches(&prepared.matching, &json!({"order_id": 42, "kind": "card", "extra": true})));
        assert!(matches(&prepared.matching, &json!({"order_id": "42", "kind": "card"})));
        assert!(!matches(&prepared.matching, &json!({"order_id": 43, "kind": "card"})));
        assert!(!matches(&prepared.matching, &json!({"kind": "card"})));
        assert!(!matches(&prepared.matching, &json!([1])));
    }

    #[test]
    fn an_events_probes_find_the_one_field_matches_it_holds() {
        let one: BTreeMap<String, String> = [("order_id".to_string(), "42".to_string())].into();
        let two: BTreeMap<String, String> = [("a".to_string(), "1".to_string()), ("b".into(), "2".into())].into();
        let probes = probes(&json!({"order_id": 42, "kind": "card", "nested": {"x": 1}}));
        assert!(probes.contains(&match_one(&one).unwrap()));
        assert_eq!(probes.len(), 2, "scalars only: {probes:?}");
        assert_eq!(match_one(&two), None, "several fields are checked one by one");
        assert_eq!(match_one(&BTreeMap::new()), None);
    }

    #[test]
    fn a_match_field_the_payload_lacks_is_refused_without_dependencies_and_kept_for_the_arming_with_them() {
        let wait: Wait = serde_json::from_value(json!({"event": "k", "match": {"id": "{missing}"}})).unwrap();
        let error = prepare(&wait, &json!({}), false).unwrap_err();
        assert!(error.contains("missing"), "{error}");
        let wait: Wait =
            serde_json::from_value(json!({"event": "k", "match": {"id": "{order}", "kind": "{kind}"}})).unwrap();
        let kept = prepare(&wait, &json!({"kind": "card"}), true).unwrap();
        assert!(kept.matching.is_empty(), "nothing rendered until the arming");
        let templates = kept.match_later.unwrap();
        // The payload first, then the dependencies' outputs in their order.
        let outputs = [json!({"order": 7, "kind": "cash"}), json!({"order": 8}), json!("not an object")];
        let rendered = render_later(&templates, &json!({"kind": "card"}), &outputs).unwrap();
        assert_eq!(rendered, BTreeMap::from([("id".into(), "7".into()), ("kind".into(), "card".into())]));
        assert_eq!(render_later(&templates, &json!({"kind": "card"}), &[json!({"other": 1})]), None);
        let bad: Wait = serde_json::from_value(json!({"event": "k", "match": {"id": "{unclosed"}})).unwrap();
        assert!(prepare(&bad, &json!({}), true).is_err(), "a template that does not parse is refused at once");
    }

    #[test]
    fn a_wait_has_one_kind_and_event_options_go_with_an_event() {
        let bad = [
            json!({}),
            json!({"event": "k", "sleep": "1s"}),
            json!({"sleep": "1s", "timeout": "1s"}),
            json!({"until": "2026-01-01T00:00:00Z", "match": {"a": "b"}}),
            json!({"event": ""}),
            json!({"event": "a\nb"}),
        ];
        for wait in bad {
            let wait: Wait = serde_json::from_value(wait.clone()).unwrap();
            assert!(wait.check().is_err(), "{wait:?}");
        }
        let good: Wait =
            serde_json::from_value(json!({"event": "k", "timeout": "3d", "on_timeout": "run", "lookback": "10m"}))
                .unwrap();
        assert_eq!(good.timeout_ms, Some(3 * 86_400_000));
        assert_eq!(good.lookback_ms, Some(600_000));
        good.check().unwrap();
    }

    #[test]
    fn time_left_reads_in_its_two_largest_units() {
        assert_eq!(coarse(3 * 86_400 - 1), "2d 23h");
        assert_eq!(coarse(303), "5m 3s");
        assert_eq!(coarse(3_600), "1h");
        assert_eq!(coarse(12), "12s");
        assert_eq!(coarse(0), "0s");
    }

    #[test]
    fn an_event_must_be_an_object_under_a_good_key() {
        check_event("order.confirmed", &json!({"id": 1}), 100).unwrap();
        assert!(check_event("order.confirmed", &json!([1]), 100).is_err());
        assert!(check_event("", &json!({}), 100).is_err());
        assert!(check_event("k", &json!({"a": "x".repeat(100)}), 100).is_err());
        assert!(check_event("k", &json!({"a": "nul\u{0}"}), 100).is_err());
        assert!(check_event("k", &json!({"list": [{"a\u{0}": 1}]}), 100).is_err());
        // Measured as jsonb text, as PostgreSQL's function does.
        let payload = json!({"a": 1, "b": [1, 2], "c": {"d": "x"}});
        assert_eq!(jsonb_text_len(&payload), r#"{"a": 1, "b": [1, 2], "c": {"d": "x"}}"#.len());
        assert!(check_event("k", &payload, jsonb_text_len(&payload)).is_ok());
        assert!(check_event("k", &payload, payload.to_string().len()).is_err());
    }
}
