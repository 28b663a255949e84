//! This host's row in the fleet: the job types it serves and the component
//! serving each. Written at every heartbeat and, at once, whenever a
//! component loads or goes, so `jobhost components` and `jobhost schedules`
//! see a change within a second rather than a heartbeat later, and a
//! scheduled type whose component went stops ticking at once instead of
//! leaving ticks no host can run.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio_util::sync::CancellationToken;

use crate::component::RegistryEvent;
use crate::store::{HostInfo, Store};

/// Writes this host's row, one write at a time, each with the row as of
/// the write: two writers (the heartbeat and a component change) can never
/// land an older picture after a newer one.
pub struct Membership {
    store: Store,
    now: Box<dyn Fn() -> HostInfo + Send + Sync>,
    writing: tokio::sync::Mutex<()>,
}

impl Membership {
    /// `now` gives this host's row as of the moment it is called.
    pub fn new(store: Store, now: impl Fn() -> HostInfo + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Membership { store, now: Box::new(now), writing: tokio::sync::Mutex::new(()) })
    }

    /// This host's row as of now.
    pub fn host(&self) -> HostInfo {
        (self.now)()
    }

    /// Writes the row, after any write in flight, giving up after
    /// `deadline` (the next write sends a fresh one).
    pub async fn write(&self, deadline: Duration) {
        let one_at_a_time = self.writing.lock().await;
        self.write_holding(one_at_a_time, deadline).await;
    }

    /// Writes the row unless a write is in flight (its row is as fresh):
    /// the heartbeat never waits behind another write, so a slow database
    /// does not delay its next lease renewal.
    pub async fn write_unless_writing(&self, deadline: Duration) {
        if let Ok(one_at_a_time) = self.writing.try_lock() {
            self.write_holding(one_at_a_time, deadline).await;
        }
    }

    async fn write_holding(&self, _one_at_a_time: tokio::sync::MutexGuard<'_, ()>, deadline: Duration) {
        let host = self.host();
        match tokio::time::timeout(deadline, self.store.host_upsert(&host)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "cannot refresh this host's fleet membership"),
            Err(_) => tracing::warn!(?deadline, "refreshing this host's fleet membership got no answer in time"),
        }
    }
}

/// Writes the row whenever the registry loads or unloads a component,
/// until `shutdown`. Changes that arrive together (a directory's rescan)
/// make one write.
pub async fn on_changes(
    membership: Arc<Membership>,
    mut changes: broadcast::Receiver<RegistryEvent>,
    deadline: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            event = changes.recv() => event,
        };
        match event {
            Ok(RegistryEvent::Rejected { .. }) => continue,
            // Missed events changed the registry too: the write reads it whole.
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return shutdown.cancelled().await,
        }
        while let Ok(_) | Err(TryRecvError::Lagged(_)) = changes.try_recv() {}
        membership.write(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostInfo {
        HostInfo {
            id: "h-1-a".into(),
            hostname: "h".into(),
            pid: 1,
            version: "test".into(),
            job_types: Vec::new(),
            digests: Default::default(),
            watcher_error: None,
            heartbeat_ms: 1_000,
        }
    }

    /// The heartbeat's write of the row is skipped, not queued, while
    /// another write of it is in flight (one a slow database holds): the
    /// heartbeat goes on to its next lease renewal at once.
    #[tokio::test]
    async fn the_heartbeats_write_is_skipped_while_another_is_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("jobhost.db").display());
        let store = crate::store::open(&url, 2).await.unwrap();
        store.schema_migrate().await.unwrap();
        let membership = Membership::new(store.clone(), host);

        let in_flight = membership.writing.lock().await;
        tokio::time::timeout(Duration::from_secs(10), membership.write_unless_writing(Duration::from_secs(60)))
            .await
            .expect("the heartbeat does not wait behind the write in flight");
        assert!(store.host_list().await.unwrap().is_empty(), "and writes nothing of its own");

        drop(in_flight);
        membership.write_unless_writing(Duration::from_secs(10)).await;
        let hosts = store.host_list().await.unwrap();
        assert_eq!(hosts.len(), 1, "with no write in flight, it writes the row");
    }
}
