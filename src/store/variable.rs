//! Plain variables of a job type (`jobhost var set TYPE NAME VALUE`): given
//! to its runs as environment variables, in clear. What must stay hidden is
//! a secret instead ([`crate::store::secret`]), which a run sees only as a
//! placeholder.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// One variable of one job type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeVariable {
    /// The job type whose runs see it.
    pub job_type: String,
    /// Its name in the run's environment.
    pub name: String,
    /// Its value, in clear.
    pub value: String,
    /// When it was last set.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub updated_at: DateTime<Utc>,
}

/// The most bytes a variable's value may have: the environment is copied
/// into every run.
pub const MAX_VALUE_BYTES: usize = 16 << 10;

/// The most variables one job type may have.
pub const MAX_PER_TYPE: usize = 256;
