//! The operator's side of outbound HTTP: which origins each job type's runs
//! may reach, granted fleet-wide through the database (`jobhost grant`).
//! A grant allows nothing by itself; a request also needs a rule the
//! component declares (docs/outbound.md). The patterns are checked before
//! they are stored; the store keeps them as text.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// One grant: `job_type`'s runs may send requests to `origin`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutboundGrant {
    /// The job type the grant is for.
    pub job_type: String,
    /// The origin pattern, in its printed form (`https://*.example.com`).
    pub origin: String,
    /// The methods allowed, upper case; empty allows every method the
    /// component declares.
    pub methods: Vec<String>,
    /// The secrets requests to the origin may carry, by name.
    pub secrets: Vec<String>,
    /// Whether the origin's names may resolve to private addresses (a
    /// service on the host's own network, named by the operator).
    pub private: bool,
    /// Whether requests to the origin carry an `Idempotency-Key` header,
    /// stable across the attempts of one job.
    pub idempotency_key: bool,
    /// Step timeouts replacing the host's defaults for requests it allows.
    pub timeouts: GrantTimeouts,
    /// Where besides header values its secrets may be swapped in:
    /// `query`, `body`.
    pub secrets_in: Vec<String>,
    /// The headers its secrets may be swapped into, lower case; empty:
    /// any header.
    pub secret_headers: Vec<String>,
    /// When it was granted, or last changed.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub granted_at: DateTime<Utc>,
}

/// A grant to store, replacing one for the same type and origin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewGrant {
    /// The job type.
    pub job_type: String,
    /// The origin pattern, printed ([`crate::outbound::OriginPattern`]).
    pub origin: String,
    /// Upper-case methods; empty allows every declared method.
    pub methods: Vec<String>,
    /// Secret names.
    pub secrets: Vec<String>,
    /// Whether names may resolve to private addresses.
    pub private: bool,
    /// Whether requests carry an `Idempotency-Key` header.
    pub idempotency_key: bool,
    /// Step timeouts replacing the host's defaults.
    pub timeouts: GrantTimeouts,
    /// Where besides header values its secrets may be swapped in.
    pub secrets_in: Vec<String>,
    /// The headers its secrets may be swapped into, lower case; empty: any.
    pub secret_headers: Vec<String>,
}

/// A grant's own step timeouts, in milliseconds; each one not set keeps the
/// host's default (docs/outbound.md, "Bounds"). A guest's request options
/// may still lower them, never raise them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GrantTimeouts {
    /// Name lookup, TCP connect and TLS handshake together.
    pub connect_ms: Option<u64>,
    /// From the request sent to the response's head.
    pub first_byte_ms: Option<u64>,
    /// Between two pieces of the response body.
    pub between_bytes_ms: Option<u64>,
}

impl GrantTimeouts {
    /// The longest a grant may set a step to: a run's own timeout bounds
    /// every request anyway; this keeps a typo from meaning a year.
    pub const MAX_MS: u64 = 3_600_000;

    /// Each step the longer of the two, where either sets it: what two
    /// grants matching one request allow together.
    pub fn widest(self, other: GrantTimeouts) -> GrantTimeouts {
        let max = |a: Option<u64>, b: Option<u64>| a.max(b);
        GrantTimeouts {
            connect_ms: max(self.connect_ms, other.connect_ms),
            first_byte_ms: max(self.first_byte_ms, other.first_byte_ms),
            between_bytes_ms: max(self.between_bytes_ms, other.between_bytes_ms),
        }
    }

    /// Whether no step is set.
    pub fn is_empty(&self) -> bool {
        *self == GrantTimeouts::default()
    }
}
