//! Other processes' commits, seen as they happen: every commit in WAL mode
//! appends to the `-wal` file beside the database, and the file system
//! reports the write. This stands in for PostgreSQL's `NOTIFY`, so a host
//! sharing the file with an enqueuing process starts a new job at once
//! instead of at its next poll.

use std::path::Path;
use std::sync::Arc;

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::Notify;

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
