//! `jobhost secret`: the values outbound requests may carry, sealed with
//! the hosts' key before they reach the database.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use chrono::SecondsFormat;
use clap::{Args, Subcommand};

use super::operator::open_existing;
use super::{DbArgs, fail};
use crate::outbound::secrets::{KEY_FILE_VARIABLE, KEY_VARIABLE, MAX_SECRET_BYTES, SecretKey};

/// What to do with secrets.
#[derive(Debug, Subcommand)]
pub enum SecretAction {
    /// Seal a value under the hosts' key (JOBHOST_SECRET_KEY or
    /// JOBHOST_SECRET_KEY_FILE) and store it; read from stdin unless
    /// --from-env or --from-file says otherwise.
    Set(SetArgs),
    /// Every secret's name, key and dates; never a value.
    List {
        /// One JSON object per secret, one per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Remove a secret; runs that need it refuse to start until it is set again.
    Delete {
        /// The secret's name.
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Print a new random key (64 hex digits) for JOBHOST_SECRET_KEY.
    NewKey,
}

/// `jobhost secret set`.
#[derive(Debug, Args)]
pub struct SetArgs {
    /// The secret's name, as the guest reads it from its environment.
    #[arg(value_parser = crate::outbound::secret_name)]
    name: String,
    /// Read the value from this environment variable.
    #[arg(long, conflicts_with = "from_file")]
    from_env: Option<String>,
    /// Read the value from this file (one trailing newline is dropped).
    #[arg(long)]
    from_file: Option<PathBuf>,
    #[command(flatten)]
    db: DbArgs,
}

pub async fn run(action: SecretAction) -> ExitCode {
    match action {
        SecretAction::Set(args) => set(args).await,
        SecretAction::List { json, db } => list(json, &db).await,
        SecretAction::Delete { name, db } => delete(&name, &db).await,
        SecretAction::NewKey => match SecretKey::generate() {
            Ok(key) => {
                println!("{}", key.to_hex());
                ExitCode::SUCCESS
            }
            Err(error) => fail(error),
        },
    }
}

/// The value to seal, from where the arguments say.
fn read_value(args: &SetArgs) -> Result<String, String> {
    let mut value = if let Some(variable) = &args.from_env {
        std::env::var(variable).map_err(|_| format!("the environment variable {variable} is not set"))?
    } else if let Some(path) = &args.from_file {
        std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?
    } else {
        let mut text = String::new();
        std::io::stdin()
            .take(MAX_SECRET_BYTES as u64 + 2)
            .read_to_string(&mut text)
            .map_err(|e| format!("stdin: {e}"))?;
        text
    };
    if args.from_env.is_none() {
        if value.ends_with('\n') {
            value.pop();
        }
        if value.ends_with('\r') {
            value.pop();
        }
    }
    if value.is_empty() {
        return Err("the value is empty".into());
    }
    if value.len() > MAX_SECRET_BYTES {
        return Err(format!("the value is longer than {MAX_SECRET_BYTES} bytes"));
    }
    Ok(value)
}

async fn set(args: SetArgs) -> ExitCode {
    let key = match SecretKey::from_environment() {
        Ok(Some(key)) => key,
        Ok(None) => {
            return fail(format!(
                "no key to seal with: set {KEY_VARIABLE} or {KEY_FILE_VARIABLE} to the hosts' key \
                 (`jobhost secret new-key` makes one)"
            ));
        }
        Err(error) => return fail(error),
    };
    let value = match read_value(&args) {
        Ok(value) => value,
        Err(error) => return fail(error),
    };
    let sealed = match key.seal(&args.name, &value) {
        Ok(sealed) => sealed,
        Err(error) => return fail(error),
    };
    let store = match open_existing(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.secret_set(&args.name, &sealed).await {
        Ok(replaced) => {
            let verb = if replaced { "replaced" } else { "set" };
            println!("{verb} {} (sealed with key {})", args.name, key.fingerprint());
            ExitCode::SUCCESS
        }
        Err(error) => fail(error),
    }
}

async fn list(json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let secrets = match store.secrets_list().await {
        Ok(secrets) => secrets,
        Err(error) => return fail(error),
    };
    for secret in &secrets {
        if json {
            println!("{}", serde_json::to_string(secret).unwrap_or_default());
        } else {
            let updated = secret.updated_at.to_rfc3339_opts(SecondsFormat::Secs, true);
            println!("{}  key {}  updated {updated}", secret.name, secret.key_id);
        }
    }
    super::say_if_none(secrets.len(), json, "no secrets: `jobhost secret set NAME` seals one (see docs/outbound.md)");
    ExitCode::SUCCESS
}

async fn delete(name: &str, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.secret_delete(name).await {
        Ok(true) => {
            println!("deleted {name}");
            ExitCode::SUCCESS
        }
        Ok(false) => fail(format!("no secret {name} (see `jobhost secret list`)")),
        Err(error) => fail(error),
    }
}
