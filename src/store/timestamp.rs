//! How times are written in the JSON operators read (`jobs --json`, `job`):
//! RFC 3339 in UTC with exactly six fractional digits
//! (`2026-11-30T23:59:59.123456Z`), whichever backend stored them, so every
//! timestamp has one width and sorts as text.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serializer;

/// A time as the fixed-width text.
pub fn text(time: &DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Serializes a time as [`text`].
pub fn serialize<S: Serializer>(time: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&text(time))
}

/// Serializes a time that may be missing as [`text`] or `null`.
pub fn serialize_option<S: Serializer>(time: &Option<DateTime<Utc>>, serializer: S) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => serializer.serialize_str(&text(time)),
        None => serializer.serialize_none(),
    }
}

/// Serializes a job's error entries with each entry's `at` as [`text`]:
/// PostgreSQL stores `now()` in its own JSON spelling (`+00:00`, trailing
/// zeros dropped), SQLite in this one.
pub fn serialize_errors<S: Serializer>(errors: &serde_json::Value, serializer: S) -> Result<S::Ok, S::Error> {
    let mut errors = errors.clone();
    if let Some(entries) = errors.as_array_mut() {
        for at in entries.iter_mut().filter_map(|entry| entry.get_mut("at")) {
            if let Some(time) = at.as_str().and_then(|t| DateTime::parse_from_rfc3339(t).ok()) {
                *at = serde_json::Value::String(text(&time.with_timezone(&Utc)));
            }
        }
    }
    serde::Serialize::serialize(&errors, serializer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_has_six_fractional_digits_in_utc() {
        let whole = DateTime::parse_from_rfc3339("2026-11-30T23:59:59+00:00").unwrap().with_timezone(&Utc);
        assert_eq!(text(&whole), "2026-11-30T23:59:59.000000Z");
        let errors = serde_json::json!([{"at": "2026-11-30T23:59:59.12+01:00", "error": "e"}, {"error": "no time"}]);
        let written = serialize_errors(&errors, serde_json::value::Serializer).unwrap();
        assert_eq!(written[0]["at"], "2026-11-30T22:59:59.120000Z");
        assert_eq!(written[1], serde_json::json!({"error": "no time"}));
    }
}
