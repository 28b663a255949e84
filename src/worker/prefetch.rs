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

/// Shared by the fetch loop, which asks how many to lease, and the runs,
/// which report how long they took and how long they waited.
#[derive(Clone)]
pub struct Prefetch {
    state: Arc<Mutex<State>>,
    /// Wakes a fetch loop that found no room: a run ended or a waiting job started.
    changed: Arc<Notify>,
    /// The most jobs leased ahead of free run slots.
    most: usize,
    /// How long a prefetched job may wait for a run slot.
    wait: Duration,
    concurrency: usize,
}

struct State {
    /// A moving average of recent runs' durations; zero before the first.
    mean_run: Duration,
    /// Leased jobs waiting here for a run slot.
    waiting: usize,
}

impl Prefetch {
    /// Up to `most` jobs ahead of `concurrency` run slots, each to start within `wait`.
    pub fn new(most: usize, wait: Duration, concurrency: usize) -> Self {
        let state = State { mean_run: Duration::ZERO, waiting: 0 };
        Prefetch { state: Arc::new(Mutex::new(state)), changed: Arc::new(Notify::new()), most, wait, concurrency }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain arithmetic on two fields cannot panic midway.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How long a leased job may wait here for a run slot before it is handed back.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// How many jobs to lease now, with `free_slots` fetch slots and
    /// `free_runs` run slots free: one per run slot no waiting job will
    /// take, plus as many ahead as would start within `wait` at the recent
    /// pace (a job `n` places back waits about `n / concurrency` runs).
    pub fn fetch_limit(&self, free_slots: usize, free_runs: usize) -> usize {
        let state = self.lock();
        let ahead = if state.mean_run.is_zero() {
            self.most
        } else {
            let runs_within_wait = self.wait.as_secs_f64() / state.mean_run.as_secs_f64();
            ((runs_within_wait * self.concurrency as f64) as usize).min(self.most)
        };
        (free_runs + ahead).saturating_sub(state.waiting).min(free_slots)
    }

    /// A leased job starts waiting for a run slot.
    pub fn waiting(&self) {
        self.lock().waiting += 1;
    }

    /// A job stopped waiting: it started, or was handed back.
    pub fn waited(&self) {
        let mut state = self.lock();
        state.waiting = state.waiting.saturating_sub(1);
        drop(state);
        self.changed.notify_one();
    }

    /// A run took `elapsed`.
    pub fn run_ended(&self, elapsed: Duration) {
        let mut state = self.lock();
        state.mean_run = if state.mean_run.is_zero() { elapsed } else { (state.mean_run * 7 + elapsed) / 8 };
        drop(state);
        self.changed.notify_one();
    }

    /// A job waited the whole `wait` without a slot: runs here are too long
    /// to prefetch for, whatever the average said, until shorter runs bring
    /// it back down.
    pub fn handed_back(&self) {
        let mut state = self.lock();
        state.mean_run = state.mean_run.max(self.wait * 2);
    }

    /// Resolves when a run ends or a waiting job starts.
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
        assert_eq!(prefetch.fetch_limit(6, 2), 6, "before any run: the configured prefetch");
        prefetch.run_ended(Duration::from_millis(5));
        assert_eq!(prefetch.fetch_limit(6, 0), 4, "5 ms runs: every prefetched job starts within a second");
        prefetch.run_ended(Duration::from_secs(25));
        assert_eq!(prefetch.fetch_limit(6, 0), 0, "runs of seconds: nothing waits behind them");
        assert_eq!(prefetch.fetch_limit(6, 1), 1, "a free run slot is still filled");
    }

    #[test]
    fn waiting_jobs_count_against_the_room() {
        let prefetch = Prefetch::new(4, WAIT, 2);
        prefetch.run_ended(Duration::from_millis(400));
        assert_eq!(prefetch.fetch_limit(6, 0), 4, "two runs of 400 ms per slot fit in a second");
        prefetch.waiting();
        prefetch.waiting();
        prefetch.waiting();
        assert_eq!(prefetch.fetch_limit(6, 0), 1);
        prefetch.waited();
        assert_eq!(prefetch.fetch_limit(6, 0), 2);
    }

    #[test]
    fn a_handed_back_job_stops_prefetching_until_runs_are_short_again() {
        let prefetch = Prefetch::new(1, WAIT, 1);
        assert_eq!(prefetch.fetch_limit(2, 0), 1, "nothing is known yet");
        prefetch.handed_back();
        assert_eq!(prefetch.fetch_limit(2, 0), 0, "a job waited a whole second: no more prefetching");
        for _ in 0..40 {
            prefetch.run_ended(Duration::from_millis(1));
        }
        assert_eq!(prefetch.fetch_limit(2, 0), 1, "short runs bring it back");
    }
}
