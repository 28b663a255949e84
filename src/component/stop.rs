//! A signal that tells one run to stop, with the reason it was told.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

/// Stops a run from outside: graceful shutdown past its grace period, or a
/// lease the host could not renew. Clones share the signal; the first reason
/// given wins.
#[derive(Debug, Clone, Default)]
pub struct StopSignal {
    token: CancellationToken,
    reason: Arc<OnceLock<String>>,
}

impl StopSignal {
    /// A signal that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal; later reasons are ignored.
    pub fn stop(&self, reason: impl Into<String>) {
        let _ = self.reason.set(reason.into());
        self.token.cancel();
    }

    /// Whether the signal has fired.
    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The reason the signal fired with, once it has.
    pub fn reason(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }

    /// Resolves when the signal fires.
    pub async fn stopped(&self) {
        self.token.cancelled().await
    }
}
