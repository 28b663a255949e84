//! A run's latest progress, shared between its guest and its host while it
//! runs: the guest's `progress(done, total)` writes it, and the host's
//! heartbeat sends each change to the database with the lease renewal, so
//! it shows before the job ends.

use std::sync::{Arc, Mutex};

/// One run's progress cell. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct LiveProgress(Arc<Mutex<Reported>>);

#[derive(Debug, Default)]
struct Reported {
    latest: Option<(u64, u64)>,
    /// Whether `latest` changed since it was last taken.
    changed: bool,
}

impl LiveProgress {
    /// A cell with nothing reported.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reported> {
        // Updates are plain assignments that cannot panic midway.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the guest's latest report.
    pub fn report(&self, done: u64, total: u64) {
        let mut reported = self.lock();
        if reported.latest != Some((done, total)) {
            reported.latest = Some((done, total));
            reported.changed = true;
        }
    }

    /// The latest report, if it changed since the last call.
    pub fn take_changed(&self) -> Option<(u64, u64)> {
        let mut reported = self.lock();
        std::mem::take(&mut reported.changed).then_some(reported.latest).flatten()
    }

    /// Marks the latest report as not sent, so the next heartbeat sends it
    /// again (the renewal carrying it was not answered).
    pub fn unsent(&self) {
        let mut reported = self.lock();
        reported.changed = reported.latest.is_some();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_taken_once_and_can_be_sent_again() {
        let progress = LiveProgress::new();
        assert_eq!(progress.take_changed(), None);
        progress.report(1, 10);
        progress.report(2, 10);
        assert_eq!(progress.take_changed(), Some((2, 10)));
        assert_eq!(progress.take_changed(), None, "nothing new");
        progress.report(2, 10);
        assert_eq!(progress.take_changed(), None, "the same report is no change");
        progress.unsent();
        assert_eq!(progress.take_changed(), Some((2, 10)));
    }
}
