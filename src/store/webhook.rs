//! Inbound webhooks as stored: a name served at `/hooks/NAME`, the event
//! key its verified requests are sent under (a template of the body's
//! fields), the signature style and the secret (by name) it is checked
//! with, and how old a signed timestamp may be. Verifying a request is
//! `crate::webhook`'s; turning it into an event is the HTTP handler's.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Error, Result};
use crate::template::KeyTemplate;
use crate::webhook::{Style, check_name};

/// One inbound webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Webhook {
    /// Its name: served at `/hooks/NAME`.
    pub name: String,
    /// The event key template, over the body's fields.
    pub event_key: String,
    /// How its provider signs.
    pub style: Style,
    /// The secret its signatures are made with, by name.
    pub secret: String,
    /// How far from now a signed timestamp may be, in seconds.
    pub tolerance_secs: i64,
    /// When it was added.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub created_at: DateTime<Utc>,
}

/// Checks a webhook before it is stored.
///
/// # Errors
/// [`Error::InvalidEvent`] naming the problem: a bad name, a key template
/// that does not parse, an empty secret name, a tolerance that is not
/// positive.
pub fn check(webhook: &Webhook) -> Result<()> {
    let invalid = |reason: String| Err(Error::InvalidEvent(format!("webhook {:?}: {reason}", webhook.name)));
    if let Err(reason) = check_name(&webhook.name) {
        return invalid(reason);
    }
    if let Err(error) = KeyTemplate::parse(&webhook.event_key) {
        return invalid(format!("its event key {:?}: {error}", webhook.event_key));
    }
    if webhook.secret.is_empty() {
        return invalid("it needs a secret's name".into());
    }
    if webhook.tolerance_secs <= 0 {
        return invalid("its tolerance must be positive".into());
    }
    Ok(())
}

/// Decodes a stored style.
///
/// # Errors
/// [`Error::Decode`] for a style this build does not know.
pub fn style_of(text: &str) -> Result<Style> {
    Style::parse(text).map_err(Error::Decode)
}
