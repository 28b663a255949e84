//! Turns what a component's `describe()` returned into a [`JobConfig`]:
//! defaults filled in, every field checked, and errors that name the field.

use crate::component::bindings::wit;
use crate::config::RuntimeConfig;
use crate::outbound::{self, OriginPattern};
use crate::template::KeyTemplate;
use crate::types::{
    Backoff, ConcurrencyConfig, JobConfig, OnConflict, OnDuplicate, OutboundRule, RateLimitConfig, ScheduleConfig,
    UniqueConfig, UniqueStrategy,
};

/// Attempts a job gets when its component does not say.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 20;
/// Backoff when its component does not say: 1 s doubling up to 1 h.
pub const DEFAULT_BACKOFF: Backoff = Backoff { base_ms: 1_000, cap_ms: 3_600_000 };
/// The queue when its component does not say.
pub const DEFAULT_QUEUE: &str = "default";

/// A field of a component's configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct InvalidConfig {
    /// The WIT field, as written in `job-config`.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn invalid<T>(field: &'static str, reason: impl Into<String>) -> Result<T, InvalidConfig> {
    Err(InvalidConfig { field, reason: reason.into() })
}

/// The largest count or duration a configuration may declare: the WIT's
/// `u32` fields are stored in 32-bit signed columns (attempts, limits,
/// leases), and a value a column cannot hold would be accepted here and
/// then fail every statement that touches the job type's rows.
pub const MAX_CONFIG_VALUE: u32 = i32::MAX as u32;

fn at_most_max(field: &'static str, value: u32) -> Result<u32, InvalidConfig> {
    if value > MAX_CONFIG_VALUE {
        return invalid(field, format!("{value} exceeds the largest value the host stores, {MAX_CONFIG_VALUE}"));
    }
    Ok(value)
}

pub use crate::types::check_name;

/// Validates a component's declared configuration and fills in defaults.
///
/// # Errors
/// The first field that cannot be used, with the reason.
pub fn validate(declared: wit::JobConfig, runtime: &RuntimeConfig) -> Result<JobConfig, InvalidConfig> {
    check_name(&declared.name).or_else(|reason| invalid("name", reason))?;
    let queue = declared.queue.unwrap_or_else(|| DEFAULT_QUEUE.to_string());
    check_name(&queue).or_else(|reason| invalid("queue", reason))?;

    let max_attempts = at_most_max("max-attempts", declared.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS))?;
    if max_attempts == 0 {
        return invalid("max-attempts", "must be at least 1");
    }

    let backoff = match declared.backoff {
        None => DEFAULT_BACKOFF,
        Some(b) if b.cap_ms < b.base_ms => {
            return invalid("backoff", format!("cap-ms {} is below base-ms {}", b.cap_ms, b.base_ms));
        }
        Some(b) => Backoff { base_ms: b.base_ms.into(), cap_ms: b.cap_ms.into() },
    };

    let timeout_ms = match declared.timeout_ms {
        None => runtime.default_timeout.as_millis() as u64,
        Some(0) => return invalid("timeout-ms", "must be at least 1"),
        Some(ms) => at_most_max("timeout-ms", ms)?.into(),
    };

    let memory_limit_bytes = declared.memory_limit_bytes.unwrap_or(runtime.default_memory_limit_bytes);
    if memory_limit_bytes < 1 << 16 {
        return invalid("memory-limit-bytes", "must be at least one 64 KiB page");
    }
    if memory_limit_bytes > runtime.max_memory_limit_bytes {
        return invalid(
            "memory-limit-bytes",
            format!("{memory_limit_bytes} exceeds this host's maximum of {}", runtime.max_memory_limit_bytes),
        );
    }

    let concurrency = declared.concurrency.map(|c| concurrency(c, &declared.name, runtime)).transpose()?;

    let unique = match declared.unique {
        None => None,
        Some(u) => Some(UniqueConfig {
            key: KeyTemplate::parse(&u.key).or_else(|e| invalid("unique.key", e.to_string()))?,
            strategy: match u.strategy {
                wit::UniqueStrategy::UntilExecuted => UniqueStrategy::UntilExecuted,
                wit::UniqueStrategy::WhileExecuting => UniqueStrategy::WhileExecuting,
            },
            on_duplicate: match u.on_duplicate {
                None | Some(wit::OnDuplicate::Skip) => OnDuplicate::Skip,
                Some(wit::OnDuplicate::Replace) => OnDuplicate::Replace,
                Some(wit::OnDuplicate::Raise) => OnDuplicate::Raise,
            },
        }),
    };

    let rate_limit = declared.rate_limit.map(|r| rate_limit(r, &declared.name)).transpose()?;
    let schedule = declared.schedule.map(schedule).transpose()?;
    if let Some(schedule) = &schedule {
        let keys = concurrency
            .iter()
            .map(|c| (&c.key, "concurrency"))
            .chain(unique.iter().map(|u| (&u.key, "unique")))
            .chain(rate_limit.iter().map(|r| (&r.key, "rate")));
        for (key, which) in keys {
            ticks_render_key(schedule, key, which)?;
        }
    }

    let outbound = declared.outbound.unwrap_or_default();
    if outbound.len() > MAX_OUTBOUND_RULES {
        return invalid("outbound", format!("at most {MAX_OUTBOUND_RULES} rules"));
    }
    let outbound = outbound.into_iter().map(outbound_rule).collect::<Result<Vec<_>, _>>()?;
    let on_events = on_events(declared.on_events.unwrap_or_default())?;

    Ok(JobConfig {
        name: declared.name,
        queue,
        priority: declared.priority.unwrap_or(0),
        max_attempts,
        backoff,
        timeout_ms,
        memory_limit_bytes,
        concurrency,
        unique,
        schedule,
        outbound,
        rate_limit,
        on_events,
    })
}

/// The most event keys one job type subscribes to.
pub const MAX_EVENT_SUBSCRIPTIONS: usize = 32;

/// The event keys a type is enqueued for: each a valid event key, at most
/// [`MAX_EVENT_SUBSCRIPTIONS`], sorted and each once (a key named twice
/// would still enqueue one job per event).
fn on_events(keys: Vec<String>) -> Result<Vec<String>, InvalidConfig> {
    if keys.len() > MAX_EVENT_SUBSCRIPTIONS {
        return invalid("on-events", format!("at most {MAX_EVENT_SUBSCRIPTIONS} event keys"));
    }
    let mut keys = keys;
    for key in &keys {
        crate::step::check_event_key(key).or_else(|reason| invalid("on-events", reason))?;
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// The longest window a rate limit may declare: a week.
const MAX_RATE_PERIOD_MS: u64 = 7 * 24 * 3600 * 1000;

fn rate_limit(declared: wit::RateLimit, job_name: &str) -> Result<RateLimitConfig, InvalidConfig> {
    // The window holds up to `limit` start times per key, so the limit is
    // bounded far below the columns' range: a million starts per window.
    if declared.limit == 0 || declared.limit > 1_000_000 {
        return invalid("rate-limit.limit", "must be 1 to 1,000,000");
    }
    if declared.period_ms == 0 || declared.period_ms > MAX_RATE_PERIOD_MS {
        return invalid("rate-limit.period-ms", format!("must be 1 to {MAX_RATE_PERIOD_MS} (a week)"));
    }
    let key = match declared.key {
        None => KeyTemplate::constant(job_name),
        Some(source) => KeyTemplate::parse(&source).or_else(|e| invalid("rate-limit.key", e.to_string()))?,
    };
    Ok(RateLimitConfig { limit: declared.limit, period_ms: declared.period_ms, key })
}

/// The most outbound rules one job type may declare.
const MAX_OUTBOUND_RULES: usize = 64;

/// A declared outbound rule with its pattern, methods and secret names checked.
fn outbound_rule(rule: wit::OutboundRule) -> Result<OutboundRule, InvalidConfig> {
    let origin: OriginPattern = rule.origin.parse().or_else(|e: String| invalid("outbound.origin", e))?;
    let methods = rule.methods.iter().map(|m| outbound::method_name(m)).collect::<Result<Vec<_>, _>>();
    let secrets = rule.secrets.iter().map(|s| outbound::secret_name(s)).collect::<Result<Vec<_>, _>>();
    Ok(OutboundRule {
        origin: origin.to_string(),
        methods: methods.or_else(|e| invalid("outbound.methods", e))?,
        secrets: secrets.or_else(|e| invalid("outbound.secrets", e))?,
    })
}

fn concurrency(
    declared: wit::Concurrency,
    job_name: &str,
    runtime: &RuntimeConfig,
) -> Result<ConcurrencyConfig, InvalidConfig> {
    if at_most_max("concurrency.limit", declared.limit)? == 0 {
        return invalid("concurrency.limit", "must be at least 1");
    }
    if at_most_max("concurrency.duration-secs", declared.duration_secs)? == 0 {
        return invalid("concurrency.duration-secs", "must be at least 1");
    }
    let key = match declared.key {
        None => KeyTemplate::constant(job_name),
        Some(source) => KeyTemplate::parse(&source).or_else(|e| invalid("concurrency.key", e.to_string()))?,
    };
    Ok(ConcurrencyConfig {
        limit: declared.limit,
        key,
        // A lease shorter than two heartbeats would expire under a healthy
        // holder after one late renewal (guarantee 6).
        duration_secs: declared.duration_secs.max(runtime.min_lease_secs()),
        on_conflict: match declared.on_conflict {
            wit::OnConflict::Block => OnConflict::Block,
            wit::OnConflict::Discard => OnConflict::Discard,
            wit::OnConflict::Raise => OnConflict::Raise,
        },
    })
}

fn schedule(declared: wit::Schedule) -> Result<ScheduleConfig, InvalidConfig> {
    let payload = match declared.payload {
        None => serde_json::Map::new(),
        Some(text) => match serde_json::from_str(&text) {
            Ok(serde_json::Value::Object(object)) => object,
            Ok(_) => return invalid("schedule.payload", "must be a JSON object"),
            Err(e) => return invalid("schedule.payload", format!("not valid JSON: {e}")),
        },
    };
    let config = ScheduleConfig {
        cron: declared.cron,
        time_zone: declared.time_zone.unwrap_or_else(|| "UTC".to_string()),
        payload,
        backfill: declared.backfill.unwrap_or(1),
    };
    crate::calendar::check(&config).or_else(|reason| invalid("schedule", reason))?;
    Ok(config)
}

/// Every tick's job renders its concurrency and uniqueness keys from the
/// schedule's payload (and `_tick`): a key it cannot render would refuse
/// every tick.
fn ticks_render_key(schedule: &ScheduleConfig, key: &KeyTemplate, which: &str) -> Result<(), InvalidConfig> {
    let mut payload = schedule.payload.clone();
    payload.insert(crate::calendar::TICK_FIELD.into(), serde_json::Value::String("1970-01-01T00:00:00Z".into()));
    match key.render(&serde_json::Value::Object(payload)) {
        Ok(_) => Ok(()),
        Err(e) => invalid("schedule.payload", format!("every tick's job would be refused: its {which} key: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn declared(name: &str) -> wit::JobConfig {
        wit::JobConfig {
            name: name.into(),
            queue: None,
            priority: None,
            max_attempts: None,
            backoff: None,
            timeout_ms: None,
            memory_limit_bytes: None,
            concurrency: None,
            unique: None,
            schedule: None,
            outbound: None,
            rate_limit: None,
            on_events: None,
        }
    }

    fn rule(origin: &str, methods: &[&str], secrets: &[&str]) -> wit::OutboundRule {
        let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        wit::OutboundRule { origin: origin.into(), methods: strings(methods), secrets: strings(secrets) }
    }

    #[test]
    fn outbound_rules_are_checked_and_kept_in_printed_form() {
        let runtime = RuntimeConfig::default();
        let config = wit::JobConfig {
            outbound: Some(vec![rule("HTTPS://API.Mailgun.net:443", &["post"], &["MAILGUN_KEY"])]),
            ..declared("mail")
        };
        let rules = validate(config, &runtime).unwrap().outbound;
        assert_eq!(
            rules,
            [OutboundRule {
                origin: "https://api.mailgun.net".into(),
                methods: vec!["POST".into()],
                secrets: vec!["MAILGUN_KEY".into()]
            }]
        );
        let field =
            |r: wit::OutboundRule| validate(wit::JobConfig { outbound: Some(vec![r]), ..declared("x") }, &runtime);
        assert_eq!(field(rule("mailgun.net", &[], &[])).unwrap_err().field, "outbound.origin");
        assert_eq!(field(rule("https://a.example/x", &[], &[])).unwrap_err().field, "outbound.origin");
        assert_eq!(field(rule("https://a.example", &["G T"], &[])).unwrap_err().field, "outbound.methods");
        assert_eq!(field(rule("https://a.example", &[], &["key"])).unwrap_err().field, "outbound.secrets");
        let many = (0..65).map(|i| rule(&format!("https://h{i}.example"), &[], &[])).collect();
        let too_many = validate(wit::JobConfig { outbound: Some(many), ..declared("x") }, &runtime);
        assert_eq!(too_many.unwrap_err().field, "outbound");
    }

    fn limit(limit: u32, key: Option<&str>, duration_secs: u32) -> Option<wit::Concurrency> {
        Some(wit::Concurrency { limit, key: key.map(String::from), duration_secs, on_conflict: wit::OnConflict::Block })
    }

    #[test]
    fn fills_in_defaults() {
        let runtime = RuntimeConfig::default();
        let config = validate(declared("send-mail"), &runtime).unwrap();
        assert_eq!(config.queue, "default");
        assert_eq!(config.max_attempts, DEFAULT_MAX_ATTEMPTS);
        assert_eq!(config.backoff, DEFAULT_BACKOFF);
        assert_eq!(config.timeout(), runtime.default_timeout);
        assert_eq!(config.memory_limit_bytes, runtime.default_memory_limit_bytes);
    }

    #[test]
    fn names_the_bad_field() {
        let runtime = RuntimeConfig::default();
        let field = |c: wit::JobConfig| validate(c, &runtime).unwrap_err().field;
        assert_eq!(field(declared("Send Mail")), "name");
        assert_eq!(field(declared("")), "name");
        assert_eq!(field(wit::JobConfig { queue: Some("a/b".into()), ..declared("x") }), "queue");
        assert_eq!(field(wit::JobConfig { max_attempts: Some(0), ..declared("x") }), "max-attempts");
        assert_eq!(field(wit::JobConfig { timeout_ms: Some(0), ..declared("x") }), "timeout-ms");
        assert_eq!(
            field(wit::JobConfig { backoff: Some(wit::Backoff { base_ms: 10, cap_ms: 5 }), ..declared("x") }),
            "backoff"
        );
        assert_eq!(field(wit::JobConfig { memory_limit_bytes: Some(8 << 30), ..declared("x") }), "memory-limit-bytes");
        assert_eq!(field(wit::JobConfig { concurrency: limit(0, None, 10), ..declared("x") }), "concurrency.limit");
        assert_eq!(
            field(wit::JobConfig { concurrency: limit(1, None, 0), ..declared("x") }),
            "concurrency.duration-secs"
        );
        assert_eq!(
            field(wit::JobConfig { concurrency: limit(1, Some("{unclosed"), 10), ..declared("x") }),
            "concurrency.key"
        );
        let rate =
            |limit, period_ms, key: Option<&str>| Some(wit::RateLimit { limit, period_ms, key: key.map(Into::into) });
        assert_eq!(field(wit::JobConfig { rate_limit: rate(0, 1000, None), ..declared("x") }), "rate-limit.limit");
        assert_eq!(field(wit::JobConfig { rate_limit: rate(5, 0, None), ..declared("x") }), "rate-limit.period-ms");
        assert_eq!(
            field(wit::JobConfig { rate_limit: rate(5, 8 * 24 * 3600 * 1000, None), ..declared("x") }),
            "rate-limit.period-ms"
        );
        assert_eq!(field(wit::JobConfig { rate_limit: rate(5, 1000, Some("{a")), ..declared("x") }), "rate-limit.key");
        let keys = |keys: &[&str]| Some(keys.iter().map(|k| k.to_string()).collect::<Vec<_>>());
        assert_eq!(field(wit::JobConfig { on_events: keys(&[""]), ..declared("x") }), "on-events");
        assert_eq!(field(wit::JobConfig { on_events: keys(&["a\nb"]), ..declared("x") }), "on-events");
        let many: Vec<String> = (0..=MAX_EVENT_SUBSCRIPTIONS).map(|i| format!("k{i}")).collect();
        assert_eq!(field(wit::JobConfig { on_events: Some(many), ..declared("x") }), "on-events");
        let subscribed =
            validate(wit::JobConfig { on_events: keys(&["b", "a", "b"]), ..declared("x") }, &runtime).unwrap();
        assert_eq!(subscribed.on_events, ["a", "b"], "sorted, each key once");
        let whole = validate(wit::JobConfig { rate_limit: rate(5, 1000, None), ..declared("x") }, &runtime).unwrap();
        let whole = whole.rate_limit.unwrap();
        assert_eq!(whole.key.render(&serde_json::json!({})).unwrap(), "x", "without a key, the type as a whole");
        let ticks =
            wit::JobConfig { schedule: cron("* * * * *"), rate_limit: rate(5, 1000, Some("{k}")), ..declared("x") };
        assert_eq!(field(ticks), "schedule.payload", "a rate key the ticks' payload cannot render");
        assert_eq!(field(wit::JobConfig { schedule: cron("every day"), ..declared("x") }), "schedule");
        let payload = Some(wit::Schedule { payload: Some("[1]".into()), ..cron("* * * * *").unwrap() });
        assert_eq!(field(wit::JobConfig { schedule: payload, ..declared("x") }), "schedule.payload");
        let keyless =
            wit::JobConfig { schedule: cron("* * * * *"), concurrency: limit(1, Some("{k}"), 10), ..declared("x") };
        assert_eq!(field(keyless), "schedule.payload", "a concurrency key the ticks' payload cannot render");
        let unique = Some(wit::Uniqueness {
            key: "{k}".into(),
            strategy: wit::UniqueStrategy::UntilExecuted,
            on_duplicate: None,
        });
        let unique_keyless = wit::JobConfig { schedule: cron("* * * * *"), unique, ..declared("x") };
        assert_eq!(field(unique_keyless), "schedule.payload", "a uniqueness key the ticks' payload cannot render");
        let keyed = Some(wit::Schedule { payload: Some(r#"{"k": 1}"#.into()), ..cron("* * * * *").unwrap() });
        let tick_key =
            wit::JobConfig { schedule: cron("* * * * *"), concurrency: limit(1, Some("{_tick}"), 10), ..declared("x") };
        assert!(validate(tick_key, &runtime).is_ok(), "a key over the tick itself");
        assert!(
            validate(
                wit::JobConfig { schedule: keyed, concurrency: limit(1, Some("{k}"), 10), ..declared("x") },
                &runtime
            )
            .is_ok()
        );
    }

    /// Values that fit the WIT's `u32` but no 32-bit column are refused at
    /// load, not accepted and then failing every statement on their rows.
    #[test]
    fn refuses_values_no_column_can_hold() {
        let runtime = RuntimeConfig::default();
        let field = |c: wit::JobConfig| validate(c, &runtime).unwrap_err().field;
        let too_big = MAX_CONFIG_VALUE + 1;
        assert_eq!(field(wit::JobConfig { max_attempts: Some(too_big), ..declared("x") }), "max-attempts");
        assert_eq!(field(wit::JobConfig { timeout_ms: Some(u32::MAX), ..declared("x") }), "timeout-ms");
        assert_eq!(
            field(wit::JobConfig { concurrency: limit(too_big, None, 10), ..declared("x") }),
            "concurrency.limit"
        );
        assert_eq!(
            field(wit::JobConfig { concurrency: limit(1, None, too_big), ..declared("x") }),
            "concurrency.duration-secs"
        );
        let largest = wit::JobConfig {
            max_attempts: Some(MAX_CONFIG_VALUE),
            concurrency: limit(MAX_CONFIG_VALUE, None, MAX_CONFIG_VALUE),
            ..declared("x")
        };
        assert!(validate(largest, &runtime).is_ok());
    }

    #[test]
    fn floors_duration_at_two_heartbeats() {
        let runtime = RuntimeConfig { heartbeat_interval: Duration::from_secs(5), ..RuntimeConfig::default() };
        let config =
            validate(wit::JobConfig { concurrency: limit(2, Some("{k}"), 3), ..declared("x") }, &runtime).unwrap();
        assert_eq!(config.concurrency.unwrap().duration_secs, 10);
        let config =
            validate(wit::JobConfig { concurrency: limit(2, Some("{k}"), 60), ..declared("x") }, &runtime).unwrap();
        assert_eq!(config.concurrency.unwrap().duration_secs, 60);
    }

    #[test]
    fn a_limit_without_key_applies_to_the_job_type() {
        let config = validate(
            wit::JobConfig { concurrency: limit(1, None, 30), ..declared("report") },
            &RuntimeConfig::default(),
        )
        .unwrap();
        let key = config.concurrency.unwrap().key;
        assert_eq!(key.render(&serde_json::json!({"any": 1})).unwrap(), "report");
    }

    fn cron(expression: &str) -> Option<wit::Schedule> {
        Some(wit::Schedule { cron: expression.into(), time_zone: None, payload: None, backfill: None })
    }

    #[test]
    fn a_schedule_takes_the_defaults() {
        let config =
            validate(wit::JobConfig { schedule: cron("0 */5 * * * *"), ..declared("x") }, &RuntimeConfig::default());
        assert_eq!(config.unwrap().schedule, Some(ScheduleConfig::new("0 */5 * * * *")));
    }
}
