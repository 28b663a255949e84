//! The enqueue rules, decided once for every backend and every enqueuer
//! (the CLI, the Rust client, a completing run's children, a guest's
//! `enqueue` call): a job type's defaults applied, the payload and the
//! overrides checked, the concurrency key rendered. A backend only writes
//! the [`PreparedJob`]s this module hands it (`Backend::jobs_write`).

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::job::{EnqueueParams, Enqueued};
use super::{Backend, Error, Result};
use crate::types::{ChildJob, JobConfig, OnDuplicate, UniqueStrategy};

/// Enqueues `jobs`, all or none: reads their types' configurations,
/// prepares each, and has the backend write them in one transaction.
/// Returns what became of each, in input order.
///
/// # Errors
/// An unregistered type, what [`prepare`] refuses, a duplicate of a type
/// whose `on_duplicate` is `raise`, or the database failing.
pub(crate) async fn enqueue(backend: &(impl Backend + ?Sized), jobs: &[EnqueueParams]) -> Result<Vec<Enqueued>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    // Read before the write transaction, as the SQL enqueue reads them in a
    // statement of its own: a registration committing in between orders the
    // enqueue before it (the job keeps the configuration it was prepared
    // with), which is what an enqueue a moment earlier would have done.
    let configs = backend.configs_read(&job_names(jobs.iter().map(|j| j.job.as_str()))).await?;
    let prepared = jobs
        .iter()
        .map(|job| prepare_registered(job.clone(), &configs, backend.limits()))
        .collect::<Result<Vec<_>>>()?;
    backend.jobs_write(prepared).await
}

/// An enqueue with the job type's defaults applied and every check passed,
/// ready for any backend to insert.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedJob {
    /// The job type.
    pub job: String,
    /// The queue.
    pub queue: String,
    /// The priority.
    pub priority: i16,
    /// The payload object.
    pub payload: serde_json::Value,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// An absolute due time, if the enqueuer gave one.
    pub run_at: Option<DateTime<Utc>>,
    /// A delay from the enqueue's commit, in milliseconds (0 for none).
    pub delay_ms: i64,
    /// The rendered concurrency key, for a limited job type.
    pub concurrency_key: Option<String>,
    /// The rendered uniqueness key and its rules, for a unique job type.
    pub unique: Option<PreparedUnique>,
    /// The rendered rate key and its limit, for a rate-limited job type.
    pub rate: Option<PreparedRate>,
    /// The job that enqueued it.
    pub parent_id: Option<i64>,
    /// The batch it joins as a member.
    pub batch_id: Option<i64>,
    /// Added by a running member of that batch, which may add to it even
    /// when it is closed: the batch cannot finish while its member runs.
    pub batch_by_member: bool,
    /// The W3C trace context its run joins, canonical.
    pub traceparent: Option<String>,
}

/// A rate-limited job's key, as its backend plans it (docs/rate-limits.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedRate {
    /// The rendered key.
    pub key: String,
    /// Its type's limit.
    pub limit: crate::store::rate::Limit,
}

/// A unique job's claim, as its backend takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedUnique {
    /// The rendered key.
    pub key: String,
    /// Claimed while a run holds it (`while_executing`), not from enqueue.
    pub while_executing: bool,
    /// What a duplicate of an `until_executed` claim does.
    pub on_duplicate: OnDuplicate,
}

/// What one enqueue may carry, applied by every enqueue through a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnqueueLimits {
    /// The largest payload, as JSON text, in bytes.
    pub max_payload_bytes: usize,
}

impl Default for EnqueueLimits {
    fn default() -> Self {
        EnqueueLimits { max_payload_bytes: crate::types::DEFAULT_MAX_PAYLOAD_BYTES }
    }
}

/// The length of a JSON document's text, without keeping the text.
pub fn json_len(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a Value to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Applies the job type's configuration to an enqueue and checks it.
///
/// # Errors
/// The payload is not a JSON object or is larger than `limits` allow, an
/// override is invalid, or the concurrency or rate key cannot be rendered
/// from the payload.
pub fn prepare(params: EnqueueParams, config: &JobConfig, limits: &EnqueueLimits) -> Result<PreparedJob> {
    if !params.payload.is_object() {
        return Err(Error::PayloadNotObject { job: params.job.clone(), kind: json_kind(&params.payload) });
    }
    let bytes = json_len(&params.payload);
    if bytes > limits.max_payload_bytes {
        return Err(Error::PayloadTooLarge { job: params.job.clone(), bytes, max: limits.max_payload_bytes });
    }
    let queue = params.queue.clone().unwrap_or_else(|| config.queue.clone());
    crate::types::check_name(&queue).map_err(|reason| Error::InvalidEnqueue(format!("queue {reason}")))?;
    if params.run_at.is_some() && params.delay_ms.is_some() {
        return Err(Error::InvalidEnqueue("give a delay or a time to run at, not both".into()));
    }
    let traceparent = match &params.traceparent {
        None => None,
        Some(text) => Some(crate::telemetry::context::canonical(text).map_err(Error::InvalidEnqueue)?),
    };
    check_due(params.delay_ms, params.run_at)?;
    let delay_ms =
        i64::try_from(params.delay_ms.unwrap_or(0)).map_err(|_| Error::InvalidEnqueue("delay is too long".into()))?;
    let concurrency_key = match &config.concurrency {
        None => None,
        Some(limit) => Some(
            limit
                .key
                .render(&params.payload)
                .map_err(|e| Error::InvalidEnqueue(format!("job {:?}: {e}", params.job)))?,
        ),
    };
    // The rate key is rendered again at each start (it is not stored), so a
    // payload that cannot render it is refused here, not found out later.
    let rate = match &config.rate_limit {
        None => None,
        Some(rate) => Some(PreparedRate {
            key: rate
                .key
                .render(&params.payload)
                .map_err(|e| Error::InvalidEnqueue(format!("job {:?}: rate {e}", params.job)))?,
            limit: crate::store::rate::Limit {
                limit: rate.limit,
                period_ms: i64::try_from(rate.period_ms).unwrap_or(i64::MAX),
            },
        }),
    };
    let unique = match &config.unique {
        None => None,
        Some(unique) => Some(PreparedUnique {
            key: unique
                .key
                .render(&params.payload)
                .map_err(|e| Error::InvalidEnqueue(format!("job {:?}: unique {e}", params.job)))?,
            while_executing: unique.strategy == UniqueStrategy::WhileExecuting,
            // A child is written with its parent's result, which cannot be
            // refused after the run: its duplicate is skipped instead.
            on_duplicate: match (unique.on_duplicate, params.parent_id) {
                (OnDuplicate::Raise, Some(_)) => OnDuplicate::Skip,
                (chosen, _) => chosen,
            },
        }),
    };
    Ok(PreparedJob {
        job: params.job,
        queue,
        priority: params.priority.unwrap_or(config.priority),
        payload: params.payload,
        max_attempts: i32::try_from(config.max_attempts).unwrap_or(i32::MAX),
        run_at: params.run_at,
        delay_ms,
        concurrency_key,
        unique,
        rate,
        parent_id: params.parent_id,
        batch_id: params.batch_id,
        batch_by_member: false,
        traceparent,
    })
}

/// [`prepare`] against the registered configuration of its type in `configs`.
///
/// # Errors
/// An unregistered type, or what [`prepare`] refuses.
pub fn prepare_registered(params: EnqueueParams, configs: &Configs, limits: &EnqueueLimits) -> Result<PreparedJob> {
    let config = configs.get(&params.job).ok_or_else(|| Error::UnknownJobType(params.job.clone()))?;
    prepare(params, config, limits)
}

/// A child a run asks to enqueue, prepared as its parent's completion
/// will write it: the one set of child rules, applied both when the guest
/// calls `enqueue` (so it learns of a refusal at the call) and when the
/// completion is planned.
///
/// # Errors
/// What [`prepare`] refuses.
pub fn prepare_child(
    parent_id: i64,
    child: ChildJob,
    config: &JobConfig,
    limits: &EnqueueLimits,
) -> Result<PreparedJob> {
    prepare(EnqueueParams::child(parent_id, child), config, limits)
}

/// Two jobs of one enqueue with one unique key, where the type says
/// `raise`: no stored job holds the key, so there is no id to name.
pub(crate) fn in_batch_duplicate(job: &str, key: &str) -> Error {
    Error::InvalidEnqueue(format!("job {job:?}: two jobs of this enqueue have the unique key {key:?}"))
}

/// Distinct job type names, sorted: what one configuration read asks for.
pub fn job_names<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut names: Vec<String> = names.map(str::to_string).collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The configurations `names` asks for, as `enqueue` reads them.
pub type Configs = HashMap<String, JobConfig>;

/// The furthest ahead an enqueue may schedule a job, as a delay or a time:
/// further is a mistake, not a plan (and past what every backend's
/// timestamps can hold). The same for every path a job comes in by.
pub const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);

/// Refuses a delay or a time to run at beyond [`MAX_DELAY`].
fn check_due(delay_ms: Option<u64>, run_at: Option<DateTime<Utc>>) -> Result<()> {
    if let Some(delay_ms) = delay_ms.filter(|ms| u128::from(*ms) > MAX_DELAY.as_millis()) {
        let delay = humantime::format_duration(std::time::Duration::from_millis(delay_ms));
        return Err(Error::InvalidEnqueue(format!(
            "delay must be at most 100 years (e.g. 30s, 5m, 2days), got {delay}"
        )));
    }
    let latest = Utc::now() + chrono::Duration::from_std(MAX_DELAY).unwrap_or(chrono::TimeDelta::MAX);
    if let Some(at) = run_at.filter(|at| *at > latest) {
        return Err(Error::InvalidEnqueue(format!(
            "the time to run at must be within 100 years, got {}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )));
    }
    Ok(())
}

/// What a JSON value is, for an error: `a string`, `an array`, ...
pub fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
pub(crate) mod prepare_tests {
    use super::*;
    use crate::types::{Backoff, ConcurrencyConfig, JobConfig, OnConflict};
    use serde_json::json;

    /// `mail`, limited on `acct:{account}`.
    pub(crate) fn config() -> JobConfig {
        JobConfig {
            name: "mail".into(),
            queue: "default".into(),
            priority: 3,
            max_attempts: 7,
            backoff: Backoff { base_ms: 1, cap_ms: 2 },
            timeout_ms: 1000,
            memory_limit_bytes: 1 << 20,
            concurrency: Some(ConcurrencyConfig {
                limit: 1,
                key: crate::template::KeyTemplate::parse("acct:{account}").unwrap(),
                duration_secs: 10,
                on_conflict: OnConflict::Block,
            }),
            unique: None,
            schedule: None,
            outbound: Vec::new(),
            rate_limit: None,
            on_events: Vec::new(),
        }
    }

    #[test]
    fn applies_defaults_and_renders_the_key() {
        let prepared =
            prepare(EnqueueParams::new("mail", json!({"account": 9})), &config(), &EnqueueLimits::default()).unwrap();
        assert_eq!((prepared.queue.as_str(), prepared.priority, prepared.max_attempts), ("default", 3, 7));
        assert_eq!(prepared.concurrency_key.as_deref(), Some("acct:9"));
    }

    #[test]
    fn refuses_payloads_that_are_not_objects() {
        // A double-encoded payload is a string: refused, never stored (guarantee 8).
        let encoded = json!(json!({"account": 9}).to_string());
        let error = prepare(EnqueueParams::new("mail", encoded), &config(), &EnqueueLimits::default()).unwrap_err();
        assert!(error.to_string().contains("must be a JSON object, got a string"), "{error}");
    }

    #[test]
    fn refuses_a_payload_without_the_key_field() {
        let error = prepare(EnqueueParams::new("mail", json!({})), &config(), &EnqueueLimits::default()).unwrap_err();
        assert!(error.to_string().contains("account"), "{error}");
    }

    #[test]
    fn refuses_bad_overrides() {
        let bad_queue =
            EnqueueParams { queue: Some("Bad Queue".into()), ..EnqueueParams::new("mail", json!({"account": 1})) };
        assert!(prepare(bad_queue, &config(), &EnqueueLimits::default()).is_err());
        let both = EnqueueParams {
            run_at: Some(Utc::now()),
            delay_ms: Some(5),
            ..EnqueueParams::new("mail", json!({"account": 1}))
        };
        assert!(prepare(both, &config(), &EnqueueLimits::default()).is_err());
    }

    #[test]
    fn refuses_a_due_time_beyond_a_hundred_years_on_every_path() {
        let job = |delay_ms: Option<u64>, run_at: Option<DateTime<Utc>>| EnqueueParams {
            delay_ms,
            run_at,
            ..EnqueueParams::new("mail", json!({"account": 1}))
        };
        let year_ms = 365 * 86_400_000u64;
        let prepared = prepare(job(Some(99 * year_ms), None), &config(), &EnqueueLimits::default()).unwrap();
        assert_eq!(prepared.delay_ms, 99 * year_ms as i64);
        for far in [101 * year_ms, 500_000 * year_ms, u64::MAX] {
            let error = prepare(job(Some(far), None), &config(), &EnqueueLimits::default()).unwrap_err();
            assert!(error.to_string().contains("delay must be at most 100 years (e.g. 30s"), "{error}");
        }
        let later = Utc::now() + chrono::Duration::days(200 * 365);
        let error = prepare(job(None, Some(later)), &config(), &EnqueueLimits::default()).unwrap_err();
        assert!(error.to_string().contains("the time to run at must be within 100 years"), "{error}");
        assert!(prepare(job(None, Some(Utc::now())), &config(), &EnqueueLimits::default()).is_ok());
    }
}
