//! Sealed secrets for outbound requests. The store keeps and returns
//! sealed bytes only; sealing and opening happen in the hosts and the CLI,
//! which hold the key ([`crate::outbound::secrets`]).

use chrono::{DateTime, Utc};
use serde::Serialize;

pub use crate::outbound::secrets::Sealed;

/// What `jobhost secret list` shows of a secret: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretInfo {
    /// The secret's name.
    pub name: String,
    /// The fingerprint of the key that sealed it.
    pub key_id: String,
    /// When it was first set.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub created_at: DateTime<Utc>,
    /// When its value last changed.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub updated_at: DateTime<Utc>,
}
