//! Other processes' commits, seen as they happen: every commit in WAL mode
//! appends to the `-wal` file beside the database, and the file system
//! reports the write. This stands in for PostgreSQL's `NOTIFY`, so a host
//! sharing the file with an enqueuing process starts a new job at once
//! instead of at its next poll.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::Notify;

use super::SqliteStore;

/// Wakes `wake` whenever the write-ahead log of the database at `path` is
/// written. Returns the watcher, which stops when dropped, or `None` where
/// the file system cannot report writes (the caller then polls).
pub fn watch(path: &Path, wake: Arc<Notify>) -> Option<RecommendedWatcher> {
    let path = std::fs::canonicalize(path).ok()?;
    let dir = path.parent()?.to_path_buf();
    let mut wal = path.file_name()?.to_os_string();
    wal.push("-wal");
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        let written = matches!(event.kind, EventKind::Modify(_) | EventKind::Create(_));
        if written && event.paths.iter().any(|p| p.file_name() == Some(wal.as_os_str())) {
            // One stored permit at most: a burst of commits wakes the fetch loop once.
            wake.notify_one();
        }
    });
    // The directory, not the file: the log is deleted and created again when
    // the last connection to the database closes and another opens.
    let mut watcher = match watcher {
        Ok(watcher) => watcher,
        Err(error) => {
            tracing::debug!(%error, "cannot watch the database's log; polling for commits");
            return None;
        }
    };
    if let Err(error) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::debug!(%error, dir = %dir.display(), "cannot watch the database's directory; polling for commits");
        return None;
    }
    Some(watcher)
}

/// `seen_version` before the first look.
pub(super) const UNSEEN: i64 = i64::MIN;

/// After a wake-up, how long an idle host looks for the commit it
/// announced: the log is written, and reported, before the commit ends.
const CLOSE_LOOK: Duration = Duration::from_millis(50);

/// How often it looks meanwhile: every 100 µs for the first few
/// milliseconds, where a commit's sync usually ends, then every millisecond.
fn close_look_every(since_wake: Duration) -> Duration {
    if since_wake < Duration::from_millis(5) { Duration::from_micros(100) } else { Duration::from_millis(1) }
}

/// How often an idle host checks whether another process committed, in
/// case the file system did not report the write.
const WATCH_INTERVAL: Duration = Duration::from_millis(100);

impl SqliteStore {
    /// Whether any connection (another process's, or this one's writer)
    /// committed since the last look; true when the look fails, so the caller
    /// goes and checks.
    pub(super) async fn committed_since_last_look(&self) -> bool {
        match sqlx::query_scalar::<_, i64>("PRAGMA data_version").fetch_one(&self.watch).await {
            Ok(version) => {
                let seen = self.seen_version.swap(version, Ordering::Relaxed);
                seen != UNSEEN && seen != version
            }
            Err(_) => true,
        }
    }

    /// The file's data version as the watching connection sees it now, or
    /// [`UNSEEN`] when it cannot be read. A waiter reads it before it looks
    /// at what it waits for, so a commit between the look and the wait is
    /// not missed.
    pub(super) async fn data_version(&self) -> i64 {
        sqlx::query_scalar::<_, i64>("PRAGMA data_version").fetch_one(&self.watch).await.unwrap_or(UNSEEN)
    }

    /// Waits for a commit by any connection since `seen`, the data version
    /// the caller last saw (updated here), until `deadline`: false when the
    /// deadline came first. Woken like an idle host: by the file system's
    /// report of a write to the log, with a look every [`WATCH_INTERVAL`]
    /// where it reports nothing.
    pub(super) async fn wait_for_commit(&self, seen: &mut i64, deadline: tokio::time::Instant) -> bool {
        let version = || async { sqlx::query_scalar::<_, i64>("PRAGMA data_version").fetch_one(&self.watch).await };
        if *seen == UNSEEN {
            *seen = version().await.unwrap_or(UNSEEN);
        }
        let mut woken_at = None;
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return false;
            }
            let every = match woken_at {
                Some(woken) if now < woken + CLOSE_LOOK => close_look_every(now - woken),
                _ => WATCH_INTERVAL,
            };
            tokio::select! {
                () = self.logged.notified() => woken_at = Some(tokio::time::Instant::now()),
                () = crate::timer::sleep(every.min(deadline - now)) => {}
            }
            match version().await {
                Ok(now_seen) if now_seen == *seen => {}
                Ok(now_seen) => {
                    *seen = now_seen;
                    return true;
                }
                Err(_) => return true,
            }
        }
    }

    /// Waits until jobs may be available: this process made some so, or
    /// another process committed; or until `timeout`.
    pub(super) async fn wait_available(&self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut woken_at = None;
        if self.seen_version.load(Ordering::Relaxed) == UNSEEN {
            self.committed_since_last_look().await;
        }
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return;
            }
            let every = match woken_at {
                Some(woken) if now < woken + CLOSE_LOOK => close_look_every(now - woken),
                _ => WATCH_INTERVAL,
            };
            tokio::select! {
                () = self.wake.notified() => return,
                () = self.logged.notified() => woken_at = Some(tokio::time::Instant::now()),
                () = crate::timer::sleep(every.min(deadline - now)) => {}
            }
            if self.committed_since_last_look().await {
                return;
            }
        }
    }
}
