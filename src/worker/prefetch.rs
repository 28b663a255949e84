//! How many jobs to lease ahead of free run slots. A prefetched job is
//! leased, its attempt counted and its lease running while it waits on this
//! host for a run slot. For short runs that is worth it: the next fetch
//! overlaps with running jobs. For long ones it is harm: a job waits behind
//! them, holding its key's slot if it has one, while another host sits
//! idle. So a host prefetches only as many jobs as its recent runs say
//! will start within `wait`, and hands back a job that has waited longer,
//! with its attempt given back, for any host to start.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// Shared by the fetch loop and the completer, which ask how many to lease,
/// and the runs, which report how long they took.
#[derive(Clone)]
pub struct Prefetch {
    /// A moving average of recent runs' durations; zero before the first.
    mean_run: Arc<Mutex<Duration>>,
    /// Wakes a fetch loop that found no room: a run ended.
    changed: Arc<Notify>,
    /// The most jobs leased ahead of free run slots.
    most: usize,
    /// How long a prefetched job may wait for a run slot.
    wait: Duration,
    concurrency: usize,
}

impl Prefetch {
    /// Up to `most` jobs ahead of `concurrency` run slots, each to start within `wait`.
    pub fn new(most: usize, wait: Duration, concurrency: usize) -> Self {
        let mean_run = Arc::new(Mutex::new(Duration::ZERO));
        Prefetch { mean_run, changed: Arc::new(Notify::new()), most, wait, concurrency }
    }

    fn mean_run(&self) -> std::sync::MutexGuard<'_, Duration> {
        // An assignment cannot panic midway.
        self.mean_run.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How long a leased job may wait here for a run slot before it is handed back.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// How many more jobs to lease when this host holds `held` (running or
    /// waiting for a run slot): one per run slot, plus as many ahead as
    /// would start within `wait` at the recent pace (a job `n` places back
    /// waits about `n / concurrency` runs).
    pub fn room(&self, held: usize) -> usize {
        let mean_run = *self.mean_run();
        let ahead = if mean_run.is_zero() {
            self.most
        } else {
            let runs_within_wait = self.wait.as_secs_f64() / mean_run.as_secs_f64();
            ((runs_within_wait * self.concurrency as f64) as usize).min(self.most)
        };
        (self.concurrency + ahead).saturating_sub(held)
    }

    /// A run took `elapsed`.
    pub fn run_ended(&self, elapsed: Duration) {
        let mut mean_run = self.mean_run();
        *mean_run = if mean_run.is_zero() { elapsed } else { (*mean_run * 7 + elapsed) / 8 };
        drop(mean_run);
        self.changed.notify_one();
    }

    /// A job waited the whole `wait` without a slot: runs here are too long
    /// to prefetch for, whatever the average said, until shorter runs bring
    /// it back down.
    pub fn handed_back(&self) {
        let mut mean_run = self.mean_run();
        *mean_run = (*mean_run).max(self.wait * 2);
    }

    /// Resolves when a run ends.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(1);

    #[test]
    fn short_runs_prefetch_fully_and_long_ones_not_at_all() {
        let prefetch = Prefetch::new(4, WAIT, 2);
        assert_eq!(prefetch.room(0), 6, "before any run: the run slots and the configured prefetch");
        prefetch.run_ended(Duration::from_millis(5));
        assert_eq!(prefetch.room(2), 4, "5 ms runs: every prefetched job starts within a second");
        prefetch.run_ended(Duration::from_secs(25));
        assert_eq!(prefetch.room(2), 0, "runs of seconds: nothing waits behind them");
        assert_eq!(prefetch.room(1), 1, "a free run slot is still filled");
    }

    #[test]
    fn the_pace_sets_how_many_wait() {
        let prefetch = Prefetch::new(4, WAIT, 2);
        prefetch.run_ended(Duration::from_millis(400));
        assert_eq!(prefetch.room(0), 2 + 4, "two runs of 400 ms per slot fit in a second: 5, at most 4");
        prefetch.run_ended(Duration::from_millis(4000));
        assert_eq!(prefetch.room(0), 2 + 2, "a mean of 850 ms: two ahead");
        assert_eq!(prefetch.room(5), 0);
    }

    #[test]
    fn a_handed_back_job_stops_prefetching_until_runs_are_short_again() {
        let prefetch = Prefetch::new(1, WAIT, 1);
        assert_eq!(prefetch.room(1), 1, "nothing is known yet");
        prefetch.handed_back();
        assert_eq!(prefetch.room(1), 0, "a job waited a whole second: no more prefetching");
        for _ in 0..40 {
            prefetch.run_ended(Duration::from_millis(1));
        }
        assert_eq!(prefetch.room(1), 1, "short runs bring it back");
    }
}
