//! The dashboard's signed-in sessions, in the database so that every
//! server of a fleet accepts them and a sign-out anywhere ends them
//! everywhere. The store knows a session only by its id's digest.

use std::time::Duration;

/// How long a session lasts: unused for `idle`, or in all `absolute`,
/// whichever ends first, by the database's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLifetime {
    /// The longest a session may go unused.
    pub idle: Duration,
    /// The longest a session lasts, however it is used.
    pub absolute: Duration,
}

impl Default for SessionLifetime {
    fn default() -> Self {
        SessionLifetime { idle: Duration::from_secs(8 * 3600), absolute: Duration::from_secs(7 * 24 * 3600) }
    }
}

/// A session's use is recorded when the last record is older than this: a
/// page that refreshes every two seconds writes once a minute, not thirty
/// times.
pub const TOUCH_EVERY_SECS: f64 = 60.0;

/// The named token a session signs in with: its name, and its value's
/// digest, so that a token revoked and made again under the name between
/// the check and the session's start signs no one in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedInWith {
    /// The token's name.
    pub name: String,
    /// The SHA-256 digest of its value, in hex.
    pub digest: String,
}

/// A session the store knows and has not expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedIn {
    /// The named token it signed in with, still live; `None` for the
    /// server's own token.
    pub token: Option<super::token::TokenHolder>,
}
