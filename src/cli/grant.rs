//! `jobhost grant`, `revoke` and `grants`: the operator's side of outbound
//! HTTP, stored in the database so every host obeys it at its next run.

use std::process::ExitCode;

use chrono::SecondsFormat;
use clap::Args;

use super::operator::open_existing;
use super::{DbArgs, fail};
use crate::outbound::OriginPattern;
use crate::store::grant::NewGrant;

/// Let a job type's runs send requests to an origin its component declares.
#[derive(Debug, Args)]
pub struct GrantArgs {
    /// The job type.
    job_type: String,
    /// The origin pattern: `https://api.mailgun.net`, `https://*.example.com`,
    /// `http://127.0.0.1:8025`, `https://api.example.com:*`.
    #[arg(value_parser = parse_origin)]
    origin: OriginPattern,
    /// The methods allowed, comma-separated (e.g. GET,POST) [default: every
    /// method the component declares].
    #[arg(long, value_delimiter = ',', value_parser = parse_method)]
    methods: Vec<String>,
    /// A secret requests to the origin may carry; repeat for several.
    #[arg(long = "secret", value_parser = parse_secret_name)]
    secrets: Vec<String>,
    /// Let the origin's names resolve to private addresses (loopback,
    /// private, link-local): a service on the hosts' own network.
    #[arg(long)]
    private: bool,
    /// Add an Idempotency-Key header to each request, the same on every
    /// attempt of a job, so an API that honours it does a retry once.
    #[arg(long)]
    idempotency_key: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// Take a grant back; runs that start afterwards cannot reach the origin.
#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The job type.
    job_type: String,
    /// The origin pattern, as granted.
    #[arg(value_parser = parse_origin)]
    origin: OriginPattern,
    #[command(flatten)]
    db: DbArgs,
}

/// List the grants, of every job type or one.
#[derive(Debug, Args)]
pub struct GrantsArgs {
    /// Only this job type's.
    job_type: Option<String>,
    /// One JSON object per grant, one per line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    db: DbArgs,
}

fn parse_origin(text: &str) -> Result<OriginPattern, String> {
    text.parse()
}

fn parse_method(text: &str) -> Result<String, String> {
    crate::outbound::method_name(text)
}

fn parse_secret_name(text: &str) -> Result<String, String> {
    crate::outbound::secret_name(text)
}

pub async fn grant(args: GrantArgs) -> ExitCode {
    let store = match open_existing(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let origin = args.origin.to_string();
    let new = NewGrant {
        job_type: args.job_type.clone(),
        origin: origin.clone(),
        methods: args.methods,
        secrets: args.secrets,
        private: args.private,
        idempotency_key: args.idempotency_key,
    };
    match store.grant_set(&new).await {
        Ok(replaced) => {
            let verb = if replaced { "changed" } else { "granted" };
            println!("{verb}: {} may reach {origin} from its next run", args.job_type);
            ExitCode::SUCCESS
        }
        Err(error) => fail(error),
    }
}

pub async fn revoke(args: RevokeArgs) -> ExitCode {
    let store = match open_existing(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let origin = args.origin.to_string();
    match store.grant_revoke(&args.job_type, &origin).await {
        Ok(true) => {
            println!("revoked: {} may not reach {origin} from its next run", args.job_type);
            ExitCode::SUCCESS
        }
        Ok(false) => fail(format!("{} has no grant for {origin} (see `jobhost grants`)", args.job_type)),
        Err(error) => fail(error),
    }
}

pub async fn grants(args: GrantsArgs) -> ExitCode {
    let store = match open_existing(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let grants = match store.grants(args.job_type.as_deref()).await {
        Ok(grants) => grants,
        Err(error) => return fail(error),
    };
    for grant in &grants {
        if args.json {
            println!("{}", serde_json::to_string(grant).unwrap_or_default());
            continue;
        }
        let methods =
            if grant.methods.is_empty() { "any declared method".to_string() } else { grant.methods.join(",") };
        let secrets =
            if grant.secrets.is_empty() { String::new() } else { format!(", secrets {}", grant.secrets.join(",")) };
        let private = if grant.private { ", private addresses allowed" } else { "" };
        let idempotent = if grant.idempotency_key { ", Idempotency-Key" } else { "" };
        println!("{} {}: {methods}{secrets}{private}{idempotent}", grant.job_type, grant.origin);
        println!("  granted {}", grant.granted_at.to_rfc3339_opts(SecondsFormat::Secs, true));
    }
    if grants.is_empty() && !args.json {
        eprintln!("no grants: runs may send no HTTP requests (see docs/outbound.md)");
    }
    ExitCode::SUCCESS
}
