//! The job types registered anywhere in the fleet, so a guest's `enqueue` of
//! an unknown type returns an error to the guest at once. Refreshed from the
//! database every heartbeat; a type this host has loaded is always known.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::component::{JobTypeCheck, Registry};
use crate::store::Store;

/// The fleet's job type names, as last read.
#[derive(Clone, Default)]
pub struct KnownJobTypes {
    names: Arc<RwLock<HashSet<String>>>,
}

impl KnownJobTypes {
    /// Rereads the names; on failure the previous set stays.
    pub async fn refresh(&self, store: &dyn Store) {
        match store.job_types_names().await {
            Ok(names) => *self.names.write().unwrap_or_else(|p| p.into_inner()) = names.into_iter().collect(),
            Err(error) => tracing::warn!(%error, "cannot read the fleet's job types"),
        }
    }

    /// A check for the sandbox: registered in the fleet, or loaded here.
    pub fn check(&self, registry: Arc<Registry>) -> JobTypeCheck {
        let names = self.names.clone();
        Arc::new(move |job: &str| {
            registry.get(job).is_some() || names.read().unwrap_or_else(|p| p.into_inner()).contains(job)
        })
    }

    /// Refreshes every `interval` until `shutdown`.
    pub async fn refresh_loop(self, store: Arc<dyn Store>, interval: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(interval);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => self.refresh(store.as_ref()).await,
            }
        }
    }
}
