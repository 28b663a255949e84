//! How values are stored: times as milliseconds since the Unix epoch (this
//! machine's clock, which every process sharing the file shares), lists as
//! JSON arrays.

use chrono::{DateTime, Utc};

/// Now, in the schema's unit.
pub(super) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// A caller's `now`, or the clock's.
pub(super) fn ms_or_now(now: Option<DateTime<Utc>>) -> i64 {
    now.map_or_else(now_ms, |t| t.timestamp_millis())
}

/// A stored time.
pub(super) fn time_of(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// A stored time as the text JSON documents (error entries) carry.
pub(super) fn iso(ms: i64) -> String {
    time_of(ms).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// A list of values as the JSON array `json_each` reads: SQLite binds no arrays.
pub(super) fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    // Serializing plain numbers and strings cannot fail.
    serde_json::to_string(items).unwrap_or_else(|_| "[]".into())
}
