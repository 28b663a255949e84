//! Outbound HTTP from handlers: which origins a run may reach (its
//! component's declared rules and the operator's grants, both), and which
//! addresses those origins may resolve to. See docs/outbound.md.

pub mod address;
pub mod budget;
pub mod hooks;
pub mod origin;
pub mod policy;
pub mod pool;
pub mod redact;
pub mod run;
pub mod secrets;
pub mod send;
pub mod shared_read;
pub mod substitute;

pub use origin::{Origin, OriginPattern};
pub use policy::{Allowed, GrantRule, Policy, Refusal, Rule};

/// A method name, upper case: a token of letters (`GET`, `POST`, `PURGE`).
///
/// # Errors
/// Anything else, with the reason.
pub fn method_name(text: &str) -> Result<String, String> {
    let method = text.trim().to_ascii_uppercase();
    if method.is_empty() || method.len() > 32 || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("{text:?} is not an HTTP method like GET or POST"));
    }
    Ok(method)
}

/// A name for a run's environment: upper-case letters, digits and `_`,
/// not first a digit.
///
/// # Errors
/// Anything else, with the reason.
pub fn environment_name(text: &str) -> Result<String, String> {
    let ok = text.len() <= 128
        && text.bytes().next().is_some_and(|b| b.is_ascii_uppercase() || b == b'_')
        && text.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if !ok {
        return Err(format!("{text:?} is not a variable name: upper-case letters, digits and _, not first a digit"));
    }
    Ok(text.to_string())
}

/// A secret's name, as the guest reads it from its environment: as
/// [`environment_name`].
///
/// # Errors
/// Anything else, with the reason.
pub fn secret_name(text: &str) -> Result<String, String> {
    environment_name(text)
        .map_err(|_| format!("{text:?} is not a secret name: upper-case letters, digits and _, not first a digit"))
}
