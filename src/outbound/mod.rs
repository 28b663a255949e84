//! Outbound HTTP from handlers: which origins a run may reach (its
//! component's declared rules and the operator's grants, both), and which
//! addresses those origins may resolve to. See docs/outbound.md.

pub mod address;
pub mod origin;
pub mod policy;

pub use origin::{Origin, OriginPattern};
pub use policy::{Allowed, GrantRule, Policy, Refusal, Rule};
