//! The job filter as the API's query string, the dashboard's filter form
//! and the bulk actions' bodies spell it: every field text, so that each
//! bad one is named in the error rather than rejected wholesale.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::store::{JobFilter, JobState};

/// The most jobs one page lists.
pub const MAX_PAGE: i64 = 500;

/// The most jobs one bulk retry or cancel applies to; the caller repeats
/// it while `more` says so.
pub const MAX_BULK: i64 = 10_000;

/// A job filter as sent. Empty fields are absent (an HTML form sends
/// them); in a JSON body a number may be given as a number.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobQuery {
    /// A state name.
    #[serde(default, deserialize_with = "text")]
    pub state: Option<String>,
    /// A job type.
    #[serde(default, deserialize_with = "text")]
    pub job: Option<String>,
    /// A queue.
    #[serde(default, deserialize_with = "text")]
    pub queue: Option<String>,
    /// A rendered concurrency key.
    #[serde(default, deserialize_with = "text")]
    pub key: Option<String>,
    /// A batch id.
    #[serde(default, deserialize_with = "text")]
    pub batch: Option<String>,
    /// Enqueued at or after this time (RFC 3339).
    #[serde(default, deserialize_with = "text")]
    pub since: Option<String>,
    /// Enqueued before this time (RFC 3339).
    #[serde(default, deserialize_with = "text")]
    pub until: Option<String>,
    /// The cursor: ids below this one.
    #[serde(default, deserialize_with = "text")]
    pub before: Option<String>,
    /// At most this many.
    #[serde(default, deserialize_with = "text")]
    pub limit: Option<String>,
}

/// A field given as text, or as a JSON number (kept as written).
fn text<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    use serde::de::Error;
    match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(text) => Ok(Some(text)),
        serde_json::Value::Number(number) => Ok(Some(number.to_string())),
        other => Err(D::Error::custom(format!("expected text or a number, got {other}"))),
    }
}

/// A field's text, unless the form left it empty.
fn given(field: &Option<String>) -> Option<&str> {
    field.as_deref().map(str::trim).filter(|text| !text.is_empty())
}

fn number(field: &Option<String>, name: &str) -> Result<Option<i64>, String> {
    given(field)
        .map(|text| text.parse::<i64>().map_err(|_| format!("{name} must be a whole number, got {text:?}")))
        .transpose()
}

fn time(field: &Option<String>, name: &str) -> Result<Option<DateTime<Utc>>, String> {
    given(field)
        .map(|text| {
            DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| format!("{name} must be an RFC 3339 time like 2026-12-01T09:00:00Z ({e}), got {text:?}"))
        })
        .transpose()
}

impl JobQuery {
    /// The store's filter, with `limit` between 1 and `max` (`default`
    /// when absent).
    ///
    /// # Errors
    /// The first field that does not read, named.
    pub fn filter(&self, default: i64, max: i64) -> Result<JobFilter, String> {
        let state = given(&self.state)
            .map(|name| {
                JobState::parse(name).ok_or_else(|| {
                    let names: Vec<_> = JobState::ALL.iter().map(|s| s.as_str()).collect();
                    format!("state must be one of {}, got {name:?}", names.join(", "))
                })
            })
            .transpose()?;
        let limit = number(&self.limit, "limit")?.unwrap_or(default);
        if !(1..=max).contains(&limit) {
            return Err(format!("limit must be between 1 and {max}, got {limit}"));
        }
        Ok(JobFilter {
            state,
            job: given(&self.job).map(str::to_string),
            queue: given(&self.queue).map(str::to_string),
            concurrency_key: given(&self.key).map(str::to_string),
            batch_id: number(&self.batch, "batch")?,
            enqueued_since: time(&self.since, "since")?,
            enqueued_before: time(&self.until, "until")?,
            before_id: number(&self.before, "before")?,
            limit,
        })
    }

    /// The fields that choose jobs (all but the cursor and the limit)
    /// that are given, by name.
    pub fn narrowing(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("state", &self.state),
            ("job", &self.job),
            ("queue", &self.queue),
            ("key", &self.key),
            ("batch", &self.batch),
            ("since", &self.since),
            ("until", &self.until),
        ]
        .into_iter()
        .filter_map(|(name, field)| given(field).map(|value| (name, value)))
    }

    /// Whether it narrows by more than the page: a bulk action over every
    /// job is refused, so one slip cannot cancel a whole database.
    pub fn narrows(&self) -> bool {
        self.narrowing().next().is_some()
    }

    /// The query string that selects the same jobs (the cursor and limit
    /// left out), for links.
    pub fn to_query_string(&self) -> String {
        self.narrowing().map(|(name, value)| format!("{name}={}", encode(value))).collect::<Vec<_>>().join("&")
    }
}

/// Percent-encodes a query value.
pub fn encode(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => encoded.push(byte as char),
            _ => encoded.push_str(&format!("%{byte:02X}")),
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> JobQuery {
        let text: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
        serde_urlencoded_like(&text.join("&"))
    }

    /// Reads a query string the way axum's `Query` does.
    fn serde_urlencoded_like(text: &str) -> JobQuery {
        let uri: axum::http::Uri = format!("/?{text}").parse().unwrap();
        axum::extract::Query::<JobQuery>::try_from_uri(&uri).unwrap().0
    }

    #[test]
    fn every_field_reads() {
        let filter = query(&[
            ("state", "failed"),
            ("job", "mail"),
            ("queue", "q"),
            ("key", "user:1"),
            ("batch", "7"),
            ("since", "2026-12-01T09:00:00Z"),
            ("until", "2026-12-01T10:00:00+01:00"),
            ("before", "99"),
            ("limit", "20"),
        ])
        .filter(50, MAX_PAGE)
        .unwrap();
        assert_eq!(filter.state, Some(JobState::Failed));
        assert_eq!(filter.concurrency_key.as_deref(), Some("user:1"));
        assert_eq!(filter.batch_id, Some(7));
        assert_eq!(filter.enqueued_before.unwrap().to_rfc3339(), "2026-12-01T09:00:00+00:00");
        assert_eq!((filter.before_id, filter.limit), (Some(99), 20));
    }

    #[test]
    fn empty_fields_are_absent_and_the_limit_defaults() {
        let filter = query(&[("state", ""), ("job", " ")]).filter(50, MAX_PAGE).unwrap();
        assert_eq!(filter, JobFilter { limit: 50, ..JobFilter::default() });
        assert!(!query(&[("state", "")]).narrows());
    }

    #[test]
    fn a_bad_field_is_named() {
        let bad = |pairs: &[(&str, &str)]| query(pairs).filter(50, MAX_PAGE).unwrap_err();
        assert!(bad(&[("state", "done")]).starts_with("state must be one of scheduled"));
        assert!(bad(&[("batch", "x")]).contains("batch must be a whole number"));
        assert!(bad(&[("since", "yesterday")]).contains("since must be an RFC 3339 time"));
        assert!(bad(&[("limit", "0")]).contains("limit must be between 1 and 500"));
        assert!(bad(&[("limit", "501")]).contains("got 501"));
    }

    #[test]
    fn the_query_string_selects_the_same_jobs() {
        let original = query(&[("state", "failed"), ("key", "a b&c"), ("before", "5")]);
        let again = serde_urlencoded_like(&original.to_query_string());
        assert_eq!(again.filter(50, MAX_PAGE).unwrap().concurrency_key.as_deref(), Some("a b&c"));
        assert_eq!(again.before, None);
    }
}
