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
    /// When it was granted, or last changed.
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
}
