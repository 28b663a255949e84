//! `jobhost grant`, `revoke` and `grants`: the operator's side of outbound
//! HTTP, stored in the database so every host obeys it at its next run.

use std::process::ExitCode;

use chrono::SecondsFormat;
use clap::Args;

use super::operator::open_existing;
use super::{DbArgs, fail};
use crate::outbound::OriginPattern;
use crate::store::grant::{GrantTimeouts, NewGrant};

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
    /// How long name lookup, connect and TLS may take together (e.g. 5s)
    /// [default: 10s].
    #[arg(long, value_parser = parse_timeout)]
    connect_timeout: Option<u64>,
    /// How long the response's head may take once the request is sent (e.g.
    /// 2m) [default: 30s].
    #[arg(long, value_parser = parse_timeout)]
    first_byte_timeout: Option<u64>,
    /// How long the response body may pause between two pieces (e.g. 1m)
    /// [default: 30s].
    #[arg(long, value_parser = parse_timeout)]
    between_bytes_timeout: Option<u64>,
    /// Where else the secrets may be swapped in besides header values,
    /// comma-separated: query (percent-encoded), body (the request then goes
    /// out chunked).
    #[arg(long, value_delimiter = ',', value_parser = crate::outbound::substitute::place_name)]
    secret_in: Vec<String>,
    /// The headers the secrets may be swapped into, comma-separated (e.g.
    /// authorization) [default: any header]: a value never goes into a
    /// header the server is known to echo.
    #[arg(long, value_delimiter = ',', value_parser = crate::outbound::substitute::header_name)]
    secret_header: Vec<String>,
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

/// A step timeout in milliseconds, from `1500ms`, `5s` or `2m`: at least a
/// millisecond, at most an hour.
fn parse_timeout(text: &str) -> Result<u64, String> {
    let duration = humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration like 30s: {e}"))?;
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || ms > GrantTimeouts::MAX_MS {
        return Err(format!("{text:?} is not between 1ms and 1h"));
    }
    Ok(ms)
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
        timeouts: GrantTimeouts {
            connect_ms: args.connect_timeout,
            first_byte_ms: args.first_byte_timeout,
            between_bytes_ms: args.between_bytes_timeout,
        },
        secrets_in: args.secret_in,
        secret_headers: args.secret_header,
    };
    match store.grant_set(&new).await {
        Ok(replaced) => {
            let verb = if replaced { "changed" } else { "granted" };
            println!("{verb}: {} may reach {origin} from its next run", args.job_type);
            let key = crate::outbound::secrets::SecretKey::from_environment().ok().flatten();
            for problem in secret_problems(&store, &new.secrets, key.as_ref()).await {
                eprintln!(
                    "warning: {problem}: every run of {} waits (retried, saying why) until this host can open it",
                    args.job_type
                );
            }
            ExitCode::SUCCESS
        }
        Err(error) => fail(error),
    }
}

/// What stops a host from opening the `names` a grant lets requests
/// carry: a secret not set, or one sealed under another key than `key`
/// (the key in this environment, when there is one).
async fn secret_problems(
    store: &crate::store::Store,
    names: &[String],
    key: Option<&crate::outbound::secrets::SecretKey>,
) -> Vec<String> {
    if names.is_empty() {
        return Vec::new();
    }
    let sealed = match store.secrets_sealed(names).await {
        Ok(sealed) => sealed,
        Err(error) => return vec![format!("cannot read the secrets to check them: {error}")],
    };
    names
        .iter()
        .filter_map(|name| match sealed.iter().find(|(n, _)| n == name) {
            None => Some(format!("secret {name} is not set (`jobhost secret set {name}`)")),
            Some((_, sealed)) => key.filter(|key| key.fingerprint() != sealed.key_id).map(|key| {
                format!(
                    "secret {name} is sealed with key {}, not this environment's key {}",
                    sealed.key_id,
                    key.fingerprint()
                )
            }),
        })
        .collect()
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
    let key = crate::outbound::secrets::SecretKey::from_environment().ok().flatten();
    for grant in &grants {
        let problems = secret_problems(&store, &grant.secrets, key.as_ref()).await;
        if args.json {
            let mut document = serde_json::to_value(grant).unwrap_or_default();
            document["secret_problems"] = serde_json::json!(problems);
            println!("{document}");
            continue;
        }
        let methods =
            if grant.methods.is_empty() { "any declared method".to_string() } else { grant.methods.join(",") };
        let mut facts = vec![methods];
        if !grant.secrets.is_empty() {
            facts.push(format!("secrets {}", grant.secrets.join(",")));
        }
        if !grant.secrets_in.is_empty() {
            facts.push(format!("secrets also in the {}", grant.secrets_in.join(" and ")));
        }
        if !grant.secret_headers.is_empty() {
            facts.push(format!("secrets in headers {} only", grant.secret_headers.join(",")));
        }
        if grant.private {
            facts.push("private addresses allowed".into());
        }
        if grant.idempotency_key {
            facts.push("Idempotency-Key".into());
        }
        facts.extend(describe_timeouts(grant.timeouts));
        // Within 80 columns: what does not fit goes on the next line.
        let head = format!("{} {}:", grant.job_type, grant.origin);
        // A head too long for its first fact beside it stands on its own
        // line (cut only past 80 columns), the facts on the next ones.
        let lines = if head.chars().count() + 1 + facts[0].chars().count() <= 80 {
            crate::text::wrap_list(&head, &facts, 80)
        } else {
            let mut lines = vec![crate::text::clip(&head, 80)];
            lines.extend(crate::text::wrap_list("  ", &facts, 80));
            lines
        };
        for line in lines {
            println!("{}", crate::text::clip(&line, 80));
        }
        println!("  granted {}", grant.granted_at.to_rfc3339_opts(SecondsFormat::Secs, true));
        for problem in &problems {
            println!("{}", crate::text::clip(&format!("  ! {problem}"), 80));
            println!("    its runs wait until a host can open it");
        }
    }
    super::say_if_none(grants.len(), args.json, "no grants: runs may send no HTTP requests (see docs/outbound.md)");
    ExitCode::SUCCESS
}

/// The steps a grant times differently from the defaults, for its line:
/// one item, or none.
fn describe_timeouts(timeouts: GrantTimeouts) -> Option<String> {
    let steps = [
        ("connect", timeouts.connect_ms),
        ("first byte", timeouts.first_byte_ms),
        ("between bytes", timeouts.between_bytes_ms),
    ];
    let set: Vec<String> = steps
        .iter()
        .filter_map(|(step, ms)| {
            let duration = std::time::Duration::from_millis((*ms)?);
            Some(format!("{step} {}", humantime::format_duration(duration)))
        })
        .collect();
    if set.is_empty() { None } else { Some(format!("timeouts: {}", set.join(", "))) }
}
