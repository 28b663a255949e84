//! The `webhook` commands: inbound webhooks served at `/hooks/NAME`, each
//! verified with a secret before its request becomes an event.

use std::process::ExitCode;

use clap::Subcommand;

use super::operator::{open, open_existing};
use super::{DbArgs, fail, fail_store};
use crate::store::webhook::Webhook;
use crate::text::clip;
use crate::webhook::{DEFAULT_TOLERANCE_SECS, Style};

/// What to do with inbound webhooks.
#[derive(Debug, Subcommand)]
pub enum WebhookAction {
    /// Add (or replace) a webhook served at /hooks/NAME by `serve` and
    /// `run --http`: a request signed with the secret becomes an event whose
    /// key is the template rendered from the body's fields and whose payload
    /// is the body. Needs no token; accepts nothing unsigned.
    Add {
        /// Its name, in its path: 1 to 64 letters, digits, `_`, `-`, `.`.
        name: String,
        /// The event's key, a template of the body's top-level fields:
        /// `stripe.{type}`, `github.push`.
        #[arg(long)]
        event_key: String,
        /// The signature's algorithm (HMAC-SHA256 is the one there is).
        #[arg(long, default_value = "hmac-sha256", value_parser = ["hmac-sha256"])]
        verify: String,
        /// How the provider signs: stripe (Stripe-Signature), github
        /// (X-Hub-Signature-256) or standard (Standard Webhooks).
        #[arg(long, default_value = "standard", value_parser = ["stripe", "github", "standard"])]
        style: String,
        /// The secret the provider signs with, set with `jobhost secret set NAME`.
        #[arg(long)]
        secret: String,
        /// How far from the server's clock a signed timestamp may be.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        tolerance: std::time::Duration,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List the webhooks.
    List {
        /// One JSON object per webhook, per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Remove a webhook: its path answers 404 from then on.
    Remove {
        /// The webhook.
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

pub async fn run(action: WebhookAction) -> ExitCode {
    match action {
        WebhookAction::Add { name, event_key, verify: _, style, secret, tolerance, db } => {
            let style = match Style::parse(&style) {
                Ok(style) => style,
                Err(error) => return fail(error),
            };
            let tolerance_secs = i64::try_from(tolerance.as_secs()).unwrap_or(DEFAULT_TOLERANCE_SECS).max(1);
            let webhook = Webhook { name, event_key, style, secret, tolerance_secs, created_at: chrono::Utc::now() };
            add(&webhook, &db).await
        }
        WebhookAction::List { json, db } => list(json, &db).await,
        WebhookAction::Remove { name, db } => remove(&name, &db).await,
    }
}

async fn add(webhook: &Webhook, db: &DbArgs) -> ExitCode {
    let store = match open(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.webhook_set(webhook).await {
        Ok(replaced) => {
            let was = if replaced { "replaced" } else { "added" };
            println!(
                "webhook {} {was}: POST /hooks/{} signed {} with secret {}",
                webhook.name,
                webhook.name,
                webhook.style.as_str(),
                webhook.secret
            );
            ExitCode::SUCCESS
        }
        Err(error) => fail_store(error),
    }
}

async fn list(json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let webhooks = match store.webhook_list().await {
        Ok(webhooks) => webhooks,
        Err(error) => return fail(error),
    };
    for webhook in &webhooks {
        if json {
            println!("{}", serde_json::to_string(webhook).unwrap_or_default());
        } else {
            let line = format!(
                "{:<20} {:<8} secret {:<16} {:>4}s  ",
                clip(&webhook.name, 20),
                webhook.style.as_str(),
                clip(&webhook.secret, 16),
                webhook.tolerance_secs
            );
            let room = super::batch::WIDTH.saturating_sub(line.chars().count());
            println!("{line}{}", clip(&webhook.event_key, room));
        }
    }
    super::say_if_none(
        webhooks.len(),
        json,
        "no webhooks: `jobhost webhook add NAME ...` adds one (see docs/events.md)",
    );
    ExitCode::SUCCESS
}

async fn remove(name: &str, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.webhook_delete(name).await {
        Ok(true) => {
            println!("webhook {name} removed");
            ExitCode::SUCCESS
        }
        Ok(false) => fail(format!("there is no webhook {name:?}")),
        Err(error) => fail(error),
    }
}
