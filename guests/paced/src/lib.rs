//! Calls a rate-limited service on behalf of a payload `tenant`: at most 5
//! runs of one tenant start per second, fleet-wide. Sleeps the payload's
//! `ms` and reports when it ran (its own clock). A payload with
//! `busy_until_ms` (ms since the epoch) stands for a service answering
//! "429, retry after ..." until then: the run returns `throttled`, so no
//! run of its tenant starts before that time.

use jobhost_guest::{Guest, JobConfig, JobContext, JobError, RateLimit, export, parse_payload, timed_sleep};

struct Paced;

impl Guest for Paced {
    fn describe() -> JobConfig {
        JobConfig {
            max_attempts: Some(3),
            rate_limit: Some(RateLimit { limit: 5, period_ms: 1000, key: Some("tenant:{tenant}".to_string()) }),
            ..JobConfig::named("paced")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = parse_payload(&payload)?;
        let now_ms = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
            .map_or(0, |since| since.as_millis() as u64);
        if let Some(busy_until) = payload.get("busy_until_ms").and_then(|b| b.as_u64())
            && busy_until > now_ms
        {
            return Err(JobError::Throttled(busy_until - now_ms));
        }
        let ms = payload.get("ms").and_then(|m| m.as_u64()).unwrap_or(0);
        Ok(Some(timed_sleep(ms).to_string()))
    }
}

export!(Paced);
