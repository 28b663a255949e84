//! The `event` commands: send an event (ending the durable waits it
//! matches, each releasing its step), and list recent events.

use std::process::ExitCode;

use clap::Subcommand;

use super::operator::{open, open_existing};
use super::{DbArgs, fail, fail_store};
use crate::text::clip;

/// What to do with events.
#[derive(Debug, Subcommand)]
pub enum EventAction {
    /// Send an event: every workflow step armed to wait for KEY whose match
    /// the payload holds is released, once (docs/events.md). Prints the
    /// event's id and how many waits it ended.
    Send {
        /// The event's key, like `order.confirmed`.
        key: String,
        /// Its payload, a JSON object.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// The sender's own id for it: sending it again (after a lost
        /// reply) stores and releases nothing.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List recent events, newest first, with the waits each ended.
    List {
        /// Only this key's.
        #[arg(long)]
        key: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// One JSON object per event, per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
}

pub async fn run(action: EventAction) -> ExitCode {
    match action {
        EventAction::Send { key, payload, idempotency_key, json, db } => {
            send(&key, &payload, idempotency_key.as_deref(), json, &db).await
        }
        EventAction::List { key, limit, json, db } => list(key.as_deref(), limit, json, &db).await,
    }
}

async fn send(key: &str, payload: &str, idempotency_key: Option<&str>, json: bool, db: &DbArgs) -> ExitCode {
    let payload: serde_json::Value = match serde_json::from_str(payload) {
        Ok(payload) => payload,
        Err(error) => return fail(format!("--payload is not JSON: {error}")),
    };
    let store = match open(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.event_send(key, &payload, idempotency_key, "cli").await {
        Ok(sent) if json => {
            println!("{}", serde_json::to_string(&sent).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(sent) if sent.duplicate => {
            println!("event {} was sent before with this idempotency key: nothing sent again", sent.id);
            ExitCode::SUCCESS
        }
        Ok(sent) => {
            println!("event {}: {} waits ended{}", sent.id, sent.released, enqueued(&sent.jobs));
            for refused in sent.jobs.iter().filter(|job| job.id.is_none()) {
                let reason = refused.error.as_deref().unwrap_or("refused");
                println!("  {}: not enqueued: {reason}", refused.job);
            }
            ExitCode::SUCCESS
        }
        Err(error) => fail_store(error),
    }
}

async fn list(key: Option<&str>, limit: i64, json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let events = match store.event_list(key, limit).await {
        Ok(events) => events,
        Err(error) => return fail(error),
    };
    for event in &events {
        if json {
            println!("{}", serde_json::to_string(event).unwrap_or_default());
        } else {
            let sent = event.sent_at.format("%Y-%m-%d %H:%M:%S");
            let jobs = event.jobs.iter().filter(|job| job.id.is_some()).count();
            let line =
                format!("{:>7}  {sent}  {:>3} ended  {jobs:>3} jobs  {:<5} ", event.id, event.released, event.source);
            let room = super::batch::WIDTH.saturating_sub(line.chars().count());
            println!("{line}{}", clip(&event.key, room));
        }
    }
    super::say_if_none(events.len(), json, "no events: `jobhost event send KEY` sends one (see docs/events.md)");
    ExitCode::SUCCESS
}

/// The jobs an event enqueued for its subscribers, in words after a
/// comma; nothing when no type is subscribed to its key.
fn enqueued(jobs: &[crate::store::wait::TriggeredJob]) -> String {
    let names: Vec<String> = jobs.iter().filter_map(|job| job.id.map(|id| format!("{} {id}", job.job))).collect();
    match names.len() {
        0 if jobs.is_empty() => String::new(),
        0 => ", no job enqueued".to_string(),
        1 => format!(", 1 job enqueued ({})", names[0]),
        n => format!(", {n} jobs enqueued ({})", names.join(", ")),
    }
}
