//! Rate limits (docs/rate-limits.md, guarantee 15): at most `limit` runs of
//! one key start in any window of `period`. A key's window is its latest
//! starts, oldest first, at most `limit` of them. PostgreSQL decides in SQL
//! (0024_rate_limits.sql); the embedded backend decides here, with the
//! same arithmetic, under its one write lock.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::PreparedJob;

/// A key whose starts are counted now, as operators see it: it started
/// runs within its window, or it is throttled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RateKeyStatus {
    /// The job type.
    pub job: String,
    /// The rendered key: the rate key, or for a throttle of a type without a
    /// rate limit its concurrency key or type.
    pub key: String,
    /// The type's limit, starts per period (none for a throttled key of a
    /// type without a rate limit).
    pub limit: Option<i64>,
    /// The type's window, in milliseconds.
    pub period_ms: Option<i64>,
    /// Starts within the window now.
    pub starts_in_window: i64,
    /// No run of the key starts before this, when it is in the future.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub throttled_until: Option<DateTime<Utc>>,
    /// Seconds until the throttle ends.
    pub throttled_secs: Option<f64>,
    /// Jobs a fetch sent back to wait for a start, ever.
    pub sent_back: i64,
    /// Throttles the key has had, ever.
    pub throttles: i64,
}

/// A job type's rate counts, summed over its keys, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateTotals {
    /// The job type.
    pub job: String,
    /// Jobs sent back to wait for a start.
    pub sent_back: i64,
    /// Throttles.
    pub throttles: i64,
}

from_row!(sqlx::postgres::PgRow, RateTotals { job, sent_back, throttles });
from_row!(sqlx::sqlite::SqliteRow, RateTotals { job, sent_back, throttles });

/// The most keys a listing shows: the busiest first would need a sort of
/// every key; these are the first in (type, key) order.
pub const MAX_LISTED_KEYS: i64 = 1_000;

/// The longest a throttle holds a key: a week.
pub const MAX_THROTTLE_MS: u64 = 7 * 24 * 3600 * 1000;

/// What a fetch does with the jobs of one key it picked, in fetch order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// How many of them start now: the first ones.
    pub started: usize,
    /// The key's window after those starts, oldest first (ms).
    pub starts: Vec<i64>,
    /// For each job that does not start, when a start frees up for it (ms):
    /// the q-th waits for the q-th oldest start to leave the window, then
    /// cycles a period later, and never before a throttle ends.
    pub wait_until: Vec<i64>,
}

/// A key's window and throttle, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyWindow {
    /// Start times (ms), oldest first; older ones may have left the window.
    pub starts: Vec<i64>,
    /// No run of the key starts before this (ms).
    pub throttled_until: Option<i64>,
}

/// The limit a key's starts are held to; `None` for a type without a rate
/// limit whose key is throttled (only the throttle holds it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Starts per period.
    pub limit: u32,
    /// The window's length (ms).
    pub period_ms: i64,
}

/// Decides a turn for `picked` jobs of one key at `now` (ms). A start at
/// `now - period` has left the window: windows are half-open, so `limit`
/// starts at `t` and `limit` more at `t + period` are allowed.
pub fn turn(window: &KeyWindow, limit: Option<Limit>, picked: usize, now: i64) -> Turn {
    let throttled = window.throttled_until.filter(|until| *until > now);
    let Some(Limit { limit, period_ms }) = limit else {
        let started = if throttled.is_some() { 0 } else { picked };
        let wait_until = vec![throttled.unwrap_or(now); picked - started];
        return Turn { started, starts: window.starts.clone(), wait_until };
    };
    let limit = limit as usize;
    let mut starts: Vec<i64> = window.starts.iter().copied().filter(|s| *s > now - period_ms).collect();
    let room = if throttled.is_some() { 0 } else { limit.saturating_sub(starts.len()) };
    let started = room.min(picked);
    starts.extend(std::iter::repeat_n(now, started));
    let in_window = starts.len() as i64;
    let wait_until = (1..=(picked - started) as i64)
        .map(|q| {
            // The q-th waiting job needs `in_window + q - limit` of the
            // window's starts gone: the i-th oldest, a period later per cycle.
            let i = in_window + q - limit as i64;
            let free = if i <= 0 {
                now
            } else {
                let (cycle, index) = ((i - 1) / limit as i64, ((i - 1) % limit as i64) as usize);
                starts.get(index).map_or(now, |s| s + period_ms * (1 + cycle))
            };
            free.max(throttled.unwrap_or(now))
        })
        .collect();
    Turn { started, starts, wait_until }
}

/// The jobs of an enqueue that its keys' plans place, by (type, key) in
/// that order, with their positions: those of a rate-limited type due at
/// once (a delay or a time to run at is counted when it comes due).
pub fn to_plan<'a>(jobs: &[&'a PreparedJob]) -> BTreeMap<(&'a str, &'a str), (Limit, Vec<usize>)> {
    let mut keys: BTreeMap<(&str, &str), (Limit, Vec<usize>)> = BTreeMap::new();
    for (i, job) in jobs.iter().enumerate() {
        if let Some(rate) = job.rate.as_ref().filter(|_| job.run_at.is_none() && job.delay_ms <= 0) {
            keys.entry((job.job.as_str(), rate.key.as_str())).or_insert_with(|| (rate.limit, Vec::new())).1.push(i);
        }
    }
    keys
}

/// Plans `n` jobs of one key enqueued at `now` (ms), all due now: when
/// each may start, in enqueue order, so that no window of `period` holds
/// more than `limit` planned times, after the key's `planned` ones (its
/// latest, oldest first). Returns the times and the key's new latest
/// `limit` planned times. The j-th job waits for the (j mod limit)-th of the
/// last `limit` planned times to leave the window, a period more per cycle:
/// the same arithmetic as a fetch's waiting jobs.
pub fn plan(planned: &[i64], limit: Limit, n: usize, now: i64) -> (Vec<i64>, Vec<i64>) {
    let Limit { limit, period_ms } = limit;
    let limit = limit.max(1) as usize;
    let mut recent: Vec<i64> = planned.iter().copied().filter(|p| *p > now - period_ms).collect();
    recent.sort_unstable();
    let recent = &recent[recent.len().saturating_sub(limit)..];
    let padding = limit - recent.len();
    let times: Vec<i64> = (0..n)
        .map(|j| {
            let first = match (j % limit).checked_sub(padding) {
                Some(i) => (recent[i] + period_ms).max(now),
                None => now,
            };
            first + period_ms * (j / limit) as i64
        })
        .collect();
    let mut latest: Vec<i64> = recent.iter().chain(&times).copied().collect();
    latest.sort_unstable();
    let latest = latest[latest.len().saturating_sub(limit)..].to_vec();
    (times, latest)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE_A_SECOND: Option<Limit> = Some(Limit { limit: 5, period_ms: 1000 });

    #[test]
    fn a_backlog_is_planned_a_limit_per_window() {
        let five = Limit { limit: 5, period_ms: 1000 };
        let (times, latest) = plan(&[], five, 12, 10_000);
        assert_eq!(times, [vec![10_000; 5], vec![11_000; 5], vec![12_000; 2]].concat());
        assert_eq!(latest, [11_000, 11_000, 11_000, 12_000, 12_000]);
        // The next enqueue comes after them, not beside the first window.
        let (next, _) = plan(&latest, five, 4, 10_500);
        assert_eq!(next, [12_000, 12_000, 12_000, 13_000]);
        // Once the plan has passed, a new job starts at once.
        let (later, _) = plan(&latest, five, 1, 20_000);
        assert_eq!(later, [20_000]);
    }

    /// Whatever the enqueues' sizes and times, the planned times never put
    /// more than `limit` in a window, and none is before its enqueue.
    #[test]
    fn no_sequence_of_plans_overfills_a_window() {
        let limit = Limit { limit: 4, period_ms: 100 };
        let mut rng = fastrand::Rng::with_seed(11);
        let (mut latest, mut all, mut now) = (Vec::new(), Vec::new(), 0);
        for _ in 0..2_000 {
            now += rng.i64(0..60);
            let (times, next) = plan(&latest, limit, rng.usize(0..7), now);
            assert!(times.iter().all(|t| *t >= now));
            all.extend(times);
            latest = next;
        }
        all.sort_unstable();
        for (i, t) in all.iter().enumerate() {
            let in_window = all[i..].iter().take_while(|s| **s < t + limit.period_ms).count();
            assert!(in_window <= 4, "{in_window} planned in the window from {t}");
        }
    }

    #[test]
    fn an_empty_window_starts_up_to_the_limit_and_the_rest_wait_a_period_per_cycle() {
        let turn = turn(&KeyWindow::default(), FIVE_A_SECOND, 12, 10_000);
        assert_eq!(turn.started, 5);
        assert_eq!(turn.starts, vec![10_000; 5]);
        assert_eq!(turn.wait_until, [vec![11_000; 5], vec![12_000; 2]].concat());
    }

    #[test]
    fn starts_leave_the_window_one_by_one() {
        let window = KeyWindow { starts: vec![9_000, 9_200, 9_400, 9_600, 9_800], throttled_until: None };
        // At 10,000 the start at 9,000 has left: one start now.
        let turn = turn(&window, FIVE_A_SECOND, 3, 10_000);
        assert_eq!(turn.started, 1);
        assert_eq!(turn.starts, vec![9_200, 9_400, 9_600, 9_800, 10_000]);
        assert_eq!(turn.wait_until, vec![10_200, 10_400]);
    }

    #[test]
    fn a_start_exactly_one_period_old_has_left_the_window() {
        let window = KeyWindow { starts: vec![9_000; 5], throttled_until: None };
        assert_eq!(turn(&window, FIVE_A_SECOND, 5, 10_000).started, 5);
        assert_eq!(turn(&window, FIVE_A_SECOND, 5, 9_999).started, 0);
    }

    #[test]
    fn a_throttle_holds_every_start_until_it_ends() {
        let window = KeyWindow { starts: vec![], throttled_until: Some(15_000) };
        let limited = turn(&window, FIVE_A_SECOND, 2, 10_000);
        assert_eq!((limited.started, limited.wait_until), (0, vec![15_000, 15_000]));
        let unlimited = turn(&window, None, 2, 10_000);
        assert_eq!((unlimited.started, unlimited.wait_until), (0, vec![15_000, 15_000]));
        let over = turn(&window, None, 2, 15_000);
        assert_eq!((over.started, over.wait_until.len()), (2, 0), "a throttle ends at its instant");
    }

    /// Whatever the order of fetches and their sizes, the starts a sequence
    /// of turns makes never put more than `limit` in a window.
    #[test]
    fn no_sequence_of_turns_overfills_a_window() {
        let limit = Limit { limit: 3, period_ms: 100 };
        let mut rng = fastrand::Rng::with_seed(7);
        let (mut window, mut all, mut now) = (KeyWindow::default(), Vec::new(), 0);
        for _ in 0..5_000 {
            now += rng.i64(0..40);
            let turn = turn(&window, Some(limit), rng.usize(0..6), now);
            all.extend(std::iter::repeat_n(now, turn.started));
            assert!(turn.wait_until.iter().all(|w| *w > now), "a job that waits waits for a later instant");
            window.starts = turn.starts;
        }
        for (i, start) in all.iter().enumerate() {
            let in_window = all[i..].iter().take_while(|s| **s < start + limit.period_ms).count();
            assert!(in_window <= 3, "{in_window} starts in the window from {start}");
        }
        assert!(all.len() > 5_000 * 20 / 100 / 2, "the limit is used, not starved: {}", all.len());
    }
}
