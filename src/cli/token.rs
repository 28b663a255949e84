//! `jobhost token`: named access tokens with roles, for the HTTP API and
//! the dashboard. A token's value is printed once, when it is made; the
//! database keeps only its digest.

use std::process::ExitCode;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use clap::Subcommand;
use sha2::{Digest, Sha256};

use super::operator::open_existing;
use super::{DbArgs, fail};
use crate::store::token::{self, Created, MAX_QUEUES, NewToken, Role};

/// What to do with named tokens.
#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Make a token and print its value, once: give it as
    /// `Authorization: Bearer VALUE`, or sign in to the dashboard with it.
    Create {
        /// Its name, shown in lists and the audit trail.
        #[arg(value_parser = name_of)]
        name: String,
        /// What it may do: read, operate, deploy or admin (each holds the ones before it).
        #[arg(long, value_parser = role_of)]
        role: Role,
        /// The only queues whose jobs an operate token may change,
        /// comma-separated: it may not then act on what spans queues
        /// (workflows, events, schedules, batches).
        #[arg(long, value_delimiter = ',', num_args = 1..)]
        queues: Option<Vec<String>>,
        /// Show it payloads, outputs and logs (an admin always sees them).
        #[arg(long)]
        payloads: bool,
        /// How long it works, like `90d` or `12h`; without it, until revoked.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires: Option<Duration>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Every token, revoked and expired ones too; never a value.
    List {
        /// One JSON object per token, one per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Revoke a token: every server refuses it, and ends its dashboard
    /// sessions, from its next request. Its name may then be given again.
    Revoke {
        /// The token's name.
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

fn name_of(text: &str) -> Result<String, String> {
    token::check_name(text).map(|()| text.to_string())
}

fn role_of(text: &str) -> Result<Role, String> {
    Role::parse(text).ok_or_else(|| format!("{text:?} is no role: read, operate, deploy or admin"))
}

pub async fn run(action: TokenAction) -> ExitCode {
    match action {
        TokenAction::Create { name, role, queues, payloads, expires, db } => {
            create(name, role, queues, payloads, expires, &db).await
        }
        TokenAction::List { json, db } => list(json, &db).await,
        TokenAction::Revoke { name, db } => revoke(&name, &db).await,
    }
}

async fn create(
    name: String,
    role: Role,
    queues: Option<Vec<String>>,
    payloads: bool,
    expires: Option<Duration>,
    db: &DbArgs,
) -> ExitCode {
    let queues = queues.map(|queues| queues.iter().map(|q| q.trim().to_string()).collect::<Vec<_>>());
    if let Some(queues) = &queues {
        if queues.len() > MAX_QUEUES || queues.iter().any(String::is_empty) {
            return fail(format!("--queues names 1 to {MAX_QUEUES} queues, none of them empty"));
        }
        // What a deploy or admin token does (a component, a schedule) spans
        // every queue, so a limit to some would be a promise not kept.
        if role > Role::Operate {
            return fail(format!("--queues limits an operate token; a {role} token acts on every queue"));
        }
    }
    let expires_at = match expires.map(chrono::Duration::from_std) {
        None => None,
        Some(Ok(after)) if after > chrono::Duration::zero() => Utc::now().checked_add_signed(after),
        Some(_) => return fail("--expires must be a duration like 90d, and more than none"),
    };
    if expires.is_some() && expires_at.is_none() {
        return fail("--expires is too far ahead");
    }
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random numbers");
    let value = format!("jh_{}", hex::encode(bytes));
    let token = NewToken {
        name: name.clone(),
        digest: hex::encode(Sha256::digest(value.as_bytes())),
        role,
        queues,
        payloads,
        expires_at,
        created_by: crate::store::audit::os_user_at_host(),
    };
    match store.token_create(&token).await {
        Ok(Created::Made) => {
            eprintln!("made token {name} ({role}); its value follows, shown this once:");
            println!("{value}");
            ExitCode::SUCCESS
        }
        Ok(Created::NameTaken) => {
            fail(format!("a live token is named {name}: `jobhost token revoke {name}` first, or pick another name"))
        }
        Err(error) => fail(error),
    }
}

async fn list(json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let tokens = match store.tokens().await {
        Ok(tokens) => tokens,
        Err(error) => return fail(error),
    };
    let now = Utc::now();
    let day = |t: chrono::DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Secs, true);
    for token in &tokens {
        if json {
            println!("{}", serde_json::to_string(token).unwrap_or_default());
            continue;
        }
        let state = match (token.revoked_at, token.expires_at) {
            (Some(at), _) => format!("revoked {}", day(at)),
            (None, Some(at)) if at <= now => format!("expired {}", day(at)),
            (None, Some(at)) => format!("expires {}", day(at)),
            (None, None) => "live".to_string(),
        };
        let queues = token.queues.as_ref().map_or("every queue".to_string(), |q| format!("queues {}", q.join(",")));
        let payloads = if token.payloads { ", payloads" } else { "" };
        // Within 80 columns: the name and what it may do, then how it stands.
        println!("{}", crate::text::clip(&format!("{} {}{payloads} · {queues}", token.name, token.role), 80));
        let used = token.last_used_at.map_or("never used".to_string(), |at| format!("used {}", day(at)));
        println!("  {state} · {used} · by {}", crate::text::clip(&token.created_by, 30));
    }
    super::say_if_none(
        tokens.len(),
        json,
        "no tokens: `jobhost token create NAME --role read|operate|deploy|admin` makes one (see docs/http.md)",
    );
    ExitCode::SUCCESS
}

async fn revoke(name: &str, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.token_revoke(name).await {
        Ok(true) => {
            println!("revoked: {name} is refused from its next request, and its sessions are ended");
            ExitCode::SUCCESS
        }
        Ok(false) => fail(format!("no live token is named {name} (see `jobhost token list`)")),
        Err(error) => fail(error),
    }
}
