//! Ticks every second (`* * * * * *`, UTC), catching up with the latest
//! three ticks missed while no host ran, and reports the tick its job was
//! enqueued for and when it started, so tests can check from outside that
//! every tick ran once and none before its time.

use jobhost_guest::{JobConfig, JobContext, JobError, Schedule};

struct Ticker;

impl jobhost_guest::Guest for Ticker {
    fn describe() -> JobConfig {
        JobConfig {
            schedule: Some(Schedule {
                cron: "* * * * * *".to_string(),
                time_zone: None,
                payload: Some(r#"{"source": "ticker"}"#.to_string()),
                backfill: Some(3),
            }),
            ..JobConfig::named("ticker")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let output = serde_json::json!({
            "tick": payload["_tick"],
            "source": payload["source"],
            "started_ms": jobhost_guest::now_ms(),
        });
        Ok(Some(output.to_string()))
    }
}

jobhost_guest::export!(Ticker);
