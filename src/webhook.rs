//! Inbound webhooks: a request to `/hooks/NAME` becomes an event once its
//! signature checks out (docs/events.md, "Webhooks in"). This module judges
//! a delivery (its signature, its timestamp, the id a replay shares) in the
//! styles providers sign with; it holds no state and reads no database.
//!
//! - `stripe`: `Stripe-Signature: t=TIMESTAMP,v1=HEX[,v1=HEX]`, HMAC-SHA256
//!   of `TIMESTAMP.BODY`; a replay shares the body's `id`.
//! - `github`: `X-Hub-Signature-256: sha256=HEX`, HMAC-SHA256 of the body;
//!   no timestamp, so a replay is known only by `X-GitHub-Delivery`.
//! - `standard` ([Standard Webhooks](https://www.standardwebhooks.com/)):
//!   `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,BASE64 ...`,
//!   HMAC-SHA256 of `ID.TIMESTAMP.BODY` under the secret's bytes (a
//!   `whsec_` prefix and base64, as the spec writes them).

use std::fmt;

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// How far a signed timestamp may be from now, by default.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

/// The longest webhook name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// A provider's way of signing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Style {
    /// Stripe's `Stripe-Signature`.
    Stripe,
    /// GitHub's `X-Hub-Signature-256`.
    Github,
    /// Standard Webhooks' `webhook-signature`.
    Standard,
}

impl Style {
    /// The name stored and given on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Style::Stripe => "stripe",
            Style::Github => "github",
            Style::Standard => "standard",
        }
    }

    /// Reads a name.
    ///
    /// # Errors
    /// Not one of the styles.
    pub fn parse(text: &str) -> Result<Style, String> {
        match text {
            "stripe" => Ok(Style::Stripe),
            "github" => Ok(Style::Github),
            "standard" => Ok(Style::Standard),
            other => Err(format!("unknown signature style {other:?}: stripe, github or standard")),
        }
    }
}

/// Checks a webhook's name: 1 to 64 letters, digits, `_`, `-` and `.`.
///
/// # Errors
/// The rule broken, in words.
pub fn check_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.chars().all(allowed) {
        return Err(format!("webhook name {name:?} must be 1 to {MAX_NAME_BYTES} letters, digits, '_', '-' or '.'"));
    }
    Ok(())
}

/// Why a delivery is refused. None of them says which part of a signature
/// was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A header the style needs is missing or malformed.
    Unsigned(&'static str),
    /// No signature matches.
    BadSignature,
    /// The signed timestamp is further from now than the tolerance.
    Stale {
        /// Seconds between the timestamp and now.
        off_by: i64,
    },
}

impl Refusal {
    /// The label counted in `/metrics`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Refusal::Unsigned(_) => "unsigned",
            Refusal::BadSignature => "bad_signature",
            Refusal::Stale { .. } => "stale",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Unsigned(what) => write!(f, "the request is not signed: {what}"),
            Refusal::BadSignature => write!(f, "no signature of the request matches"),
            Refusal::Stale { off_by } => {
                write!(f, "the signed timestamp is {off_by} s from now, more than the webhook's tolerance")
            }
        }
    }
}

/// A delivery as received: a header by its (case-insensitive) name, the
/// raw body, and the server's clock in seconds since the epoch.
pub struct Delivery<'a> {
    /// Looks a header up.
    pub header: &'a dyn Fn(&str) -> Option<String>,
    /// The body, byte for byte as sent.
    pub body: &'a [u8],
    /// Now, in seconds.
    pub now_secs: i64,
}

/// Verifies a delivery signed in `style` with `secret`, its timestamp (if
/// the style signs one) within `tolerance_secs` of now. Returns the id a
/// replay of the same delivery shares, when the style gives one.
///
/// # Errors
/// The [`Refusal`].
pub fn verify(style: Style, secret: &str, tolerance_secs: i64, delivery: &Delivery) -> Result<Option<String>, Refusal> {
    match style {
        Style::Stripe => stripe(secret, tolerance_secs, delivery),
        Style::Github => github(secret, delivery),
        Style::Standard => standard(secret, tolerance_secs, delivery),
    }
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length")
}

/// Whether any of `signatures` is the MAC of `parts` under `key`, compared
/// in constant time.
fn any_matches(key: &[u8], parts: &[&[u8]], signatures: &[Vec<u8>]) -> bool {
    let mut signed = mac(key);
    for part in parts {
        signed.update(part);
    }
    signatures.iter().any(|signature| signed.clone().verify_slice(signature).is_ok())
}

fn within(timestamp: i64, tolerance_secs: i64, now_secs: i64) -> Result<(), Refusal> {
    let off_by = (now_secs - timestamp).abs();
    if off_by > tolerance_secs {
        return Err(Refusal::Stale { off_by });
    }
    Ok(())
}

fn stripe(secret: &str, tolerance_secs: i64, delivery: &Delivery) -> Result<Option<String>, Refusal> {
    let header = (delivery.header)("stripe-signature").ok_or(Refusal::Unsigned("no Stripe-Signature header"))?;
    let mut timestamp: Option<&str> = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = Some(t),
            Some(("v1", hex)) => signatures.extend(hex::decode(hex).ok()),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(Refusal::Unsigned("a Stripe-Signature without t="))?;
    let seconds: i64 = timestamp.parse().map_err(|_| Refusal::Unsigned("a Stripe-Signature whose t= is no number"))?;
    if signatures.is_empty() {
        return Err(Refusal::Unsigned("a Stripe-Signature without v1="));
    }
    if !any_matches(secret.as_bytes(), &[timestamp.as_bytes(), b".", delivery.body], &signatures) {
        return Err(Refusal::BadSignature);
    }
    within(seconds, tolerance_secs, delivery.now_secs)?;
    let id = serde_json::from_slice::<serde_json::Value>(delivery.body)
        .ok()
        .and_then(|body| body.get("id").and_then(|id| id.as_str()).map(str::to_string));
    Ok(id)
}

fn github(secret: &str, delivery: &Delivery) -> Result<Option<String>, Refusal> {
    let header = (delivery.header)("x-hub-signature-256").ok_or(Refusal::Unsigned("no X-Hub-Signature-256 header"))?;
    let hex = header.strip_prefix("sha256=").ok_or(Refusal::Unsigned("an X-Hub-Signature-256 without sha256="))?;
    let signature = hex::decode(hex).map_err(|_| Refusal::Unsigned("an X-Hub-Signature-256 that is not hex"))?;
    if !any_matches(secret.as_bytes(), &[delivery.body], &[signature]) {
        return Err(Refusal::BadSignature);
    }
    Ok((delivery.header)("x-github-delivery"))
}

fn standard(secret: &str, tolerance_secs: i64, delivery: &Delivery) -> Result<Option<String>, Refusal> {
    let id = (delivery.header)("webhook-id").ok_or(Refusal::Unsigned("no webhook-id header"))?;
    let timestamp = (delivery.header)("webhook-timestamp").ok_or(Refusal::Unsigned("no webhook-timestamp header"))?;
    let seconds: i64 =
        timestamp.trim().parse().map_err(|_| Refusal::Unsigned("a webhook-timestamp that is no number"))?;
    let header = (delivery.header)("webhook-signature").ok_or(Refusal::Unsigned("no webhook-signature header"))?;
    let base64 = base64::engine::general_purpose::STANDARD;
    let signatures: Vec<Vec<u8>> = header
        .split_whitespace()
        .filter_map(|part| part.strip_prefix("v1,"))
        .filter_map(|signature| base64.decode(signature).ok())
        .collect();
    if signatures.is_empty() {
        return Err(Refusal::Unsigned("a webhook-signature without a v1 signature"));
    }
    // The spec's secrets are `whsec_` and base64; one that is not is its own bytes.
    let key = base64.decode(secret.strip_prefix("whsec_").unwrap_or(secret)).unwrap_or_else(|_| secret.into());
    let signed = [id.as_bytes(), b".", timestamp.trim().as_bytes(), b".", delivery.body];
    if !any_matches(&key, &signed, &signatures) {
        return Err(Refusal::BadSignature);
    }
    within(seconds, tolerance_secs, delivery.now_secs)?;
    Ok(Some(id))
}

/// Signs `body` as `style` would, for tests and for operators checking a
/// setup: the headers to send, as (name, value).
pub fn sign(style: Style, secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Vec<(String, String)> {
    let hex_of = |parts: &[&[u8]], key: &[u8]| {
        let mut signed = mac(key);
        for part in parts {
            signed.update(part);
        }
        hex::encode(signed.finalize().into_bytes())
    };
    let t = timestamp.to_string();
    match style {
        Style::Stripe => {
            let signature = hex_of(&[t.as_bytes(), b".", body], secret.as_bytes());
            vec![("Stripe-Signature".into(), format!("t={t},v1={signature}"))]
        }
        Style::Github => vec![
            ("X-Hub-Signature-256".into(), format!("sha256={}", hex_of(&[body], secret.as_bytes()))),
            ("X-GitHub-Delivery".into(), id.into()),
        ],
        Style::Standard => {
            let base64 = base64::engine::general_purpose::STANDARD;
            let key = base64.decode(secret.strip_prefix("whsec_").unwrap_or(secret)).unwrap_or_else(|_| secret.into());
            let mut signed = mac(&key);
            for part in [id.as_bytes(), b".", t.as_bytes(), b".", body] {
                signed.update(part);
            }
            let signature = base64.encode(signed.finalize().into_bytes());
            vec![
                ("webhook-id".into(), id.into()),
                ("webhook-timestamp".into(), t),
                ("webhook-signature".into(), format!("v1,{signature}")),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deliver<'a>(
        headers: &'a [(&'a str, &'a str)],
        body: &'a [u8],
        now_secs: i64,
    ) -> (Vec<(String, String)>, &'a [u8], i64) {
        (headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.to_string())).collect(), body, now_secs)
    }

    fn judge(
        style: Style,
        secret: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        now: i64,
    ) -> Result<Option<String>, Refusal> {
        let (headers, body, now_secs) = deliver(headers, body, now);
        let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        verify(style, secret, DEFAULT_TOLERANCE_SECS, &Delivery { header: &header, body, now_secs })
    }

    /// GitHub's documented example (docs.github.com, "Validating webhook deliveries").
    #[test]
    fn githubs_example_verifies() {
        let headers = [
            ("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"),
            ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ];
        let id = judge(Style::Github, "It's a Secret to Everybody", &headers, b"Hello, World!", 0).unwrap();
        assert_eq!(id.as_deref(), Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"));
        let wrong = judge(Style::Github, "It's a Secret to Everybody", &headers, b"Hello, World?", 0);
        assert_eq!(wrong, Err(Refusal::BadSignature));
    }

    /// The Standard Webhooks specification's example, at its own instant.
    #[test]
    fn the_standard_webhooks_example_verifies_and_is_stale_later() {
        let headers = [
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265330"),
            ("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
        ];
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        let id = judge(Style::Standard, secret, &headers, body, 1_614_265_330).unwrap();
        assert_eq!(id.as_deref(), Some("msg_p5jXN8AQM9LWM0D4loKWxJek"));
        assert_eq!(
            judge(Style::Standard, secret, &headers, body, 1_614_265_330 + 301),
            Err(Refusal::Stale { off_by: 301 })
        );
        assert_eq!(judge(Style::Standard, "whsec_AAAA", &headers, body, 1_614_265_330), Err(Refusal::BadSignature));
    }

    #[test]
    fn a_stripe_signature_made_here_verifies_and_each_refusal_is_told_apart() {
        let body = br#"{"id": "evt_1", "type": "payment_intent.succeeded"}"#;
        let signed = sign(Style::Stripe, "whsec_test", "", 1_700_000_000, body);
        let headers: Vec<(&str, &str)> = signed.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let id = judge(Style::Stripe, "whsec_test", &headers, body, 1_700_000_010).unwrap();
        assert_eq!(id.as_deref(), Some("evt_1"), "a replay shares the event's id");
        assert_eq!(judge(Style::Stripe, "whsec_other", &headers, body, 1_700_000_010), Err(Refusal::BadSignature));
        assert!(matches!(
            judge(Style::Stripe, "whsec_test", &headers, body, 1_700_001_000),
            Err(Refusal::Stale { .. })
        ));
        assert!(matches!(judge(Style::Stripe, "whsec_test", &[], body, 0), Err(Refusal::Unsigned(_))));
        let forged = [("Stripe-Signature", "t=1700000000,v1=00")];
        assert_eq!(judge(Style::Stripe, "whsec_test", &forged, body, 1_700_000_000), Err(Refusal::BadSignature));
    }

    #[test]
    fn signing_here_agrees_with_verifying_in_every_style() {
        for style in [Style::Stripe, Style::Github, Style::Standard] {
            let body = br#"{"id": "x"}"#;
            let signed = sign(style, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_1", 100, body);
            let headers: Vec<(&str, &str)> = signed.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            assert!(judge(style, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &headers, body, 100).is_ok(), "{style:?}");
        }
    }
}
