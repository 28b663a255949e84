//! `jobhost audit`: the audit trail, newest first, filtered by when, who
//! and what (docs/audit.md).

use std::process::ExitCode;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use clap::Args;

use super::operator::open_existing;
use super::{DbArgs, fail};
use crate::store::audit::{Filter, MAX_LIST};

/// Which rows to show.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only rows of this long ago or later, like `1h` or `7days`.
    #[arg(long, value_parser = super::parse_duration)]
    since: Option<Duration>,
    /// Only changes by this actor: a token's name, `user@host`, a database role.
    #[arg(long)]
    who: Option<String>,
    /// Only this action (`job.cancel`), or a family of them ending in a dot (`secret.`).
    #[arg(long)]
    what: Option<String>,
    /// Only rows whose object contains this (`job 42`, `queue mail`).
    #[arg(long)]
    object: Option<String>,
    /// At most this many rows.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=MAX_LIST))]
    limit: i64,
    /// One JSON object per row, one per line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    db: DbArgs,
}

pub async fn run(args: AuditArgs) -> ExitCode {
    let store = match open_existing(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let since = match args.since.map(chrono::Duration::from_std).transpose() {
        Ok(since) => since.map(|ago| Utc::now() - ago),
        Err(_) => return fail("--since is too long"),
    };
    let filter =
        Filter { since, who: args.who, action: args.what, object: args.object, before_id: None, limit: args.limit };
    let rows = match store.audit_list(&filter).await {
        Ok(rows) => rows,
        Err(error) => return fail(error),
    };
    for row in &rows {
        if args.json {
            println!("{}", serde_json::to_string(row).unwrap_or_default());
            continue;
        }
        // Within 80 columns: when, who and through what; then what, on
        // what, and how it ended; then where from, when known.
        let at = row.at.to_rfc3339_opts(SecondsFormat::Secs, true);
        let times = if row.count > 1 { format!(" ×{}", row.count) } else { String::new() };
        println!("{}", crate::text::clip(&format!("{at} {} via {}{times}", row.who, row.via), 80));
        println!("  {}", crate::text::clip(&format!("{} {} · {}", row.action, row.object, row.outcome), 78));
        if let Some(address) = &row.address {
            let agent = row.user_agent.as_deref().map(|ua| format!(" · {ua}")).unwrap_or_default();
            println!("  {}", crate::text::clip(&format!("from {address}{agent}"), 78));
        }
    }
    super::say_if_none(rows.len(), args.json, "no changes recorded that match (see docs/audit.md)");
    ExitCode::SUCCESS
}
