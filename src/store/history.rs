//! The fleet over time (docs/observability.md): per minute, queue and job
//! type, the jobs that finished and how (computed from the archive by
//! maintenance, so every host's jobs count once, whoever ran them), their
//! run and wait times, the attempts hosts scheduled again, and the live
//! jobs' depth. Both backends store minutes; the points a chart draws are
//! made here, once, from minutes summed over queues and types.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, DurationRound, TimeDelta, Utc};
use serde::Serialize;

/// One minute of the fleet, summed over the queues and types read.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HistoryMinute {
    /// The minute's start.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub minute: DateTime<Utc>,
    /// Jobs that finished in the minute, by how.
    pub completed: i64,
    /// Jobs archived as failed.
    pub failed: i64,
    /// Jobs discarded (by their handler, the gate or an operator).
    pub discarded: i64,
    /// Jobs cancelled.
    pub cancelled: i64,
    /// Attempts that failed and were scheduled again by the host that ran them.
    pub retried: i64,
    /// Finished jobs with a run time (the last attempt's).
    pub runs: i64,
    /// Run time percentiles, in milliseconds.
    pub run_p50_ms: Option<f64>,
    /// The 95th percentile.
    pub run_p95_ms: Option<f64>,
    /// The longest.
    pub run_max_ms: Option<f64>,
    /// Jobs that finished on their first attempt, whose wait is measured.
    pub waits: i64,
    /// Wait from enqueue to start, in milliseconds: the median.
    pub wait_p50_ms: Option<f64>,
    /// The 95th percentile.
    pub wait_p95_ms: Option<f64>,
    /// Live jobs at the minute's last sample, when one was taken.
    pub available: Option<i64>,
    /// Blocked by a concurrency limit.
    pub blocked: Option<i64>,
    /// Scheduled for later.
    pub scheduled: Option<i64>,
}

/// A span of time a chart shows, and the width of each of its points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HistoryRange {
    /// The last hour, a point per minute.
    #[serde(rename = "1h")]
    Hour,
    /// The last 24 hours, a point per 15 minutes.
    #[serde(rename = "24h")]
    Day,
    /// The last 7 days, a point per hour.
    #[serde(rename = "7d")]
    Week,
}

impl HistoryRange {
    /// Every range, shortest first.
    pub const ALL: [HistoryRange; 3] = [HistoryRange::Hour, HistoryRange::Day, HistoryRange::Week];

    /// The range a query names (`1h`, `24h`, `7d`).
    pub fn parse(text: &str) -> Option<HistoryRange> {
        HistoryRange::ALL.into_iter().find(|range| range.name() == text)
    }

    /// Its name in URLs and the API.
    pub fn name(self) -> &'static str {
        match self {
            HistoryRange::Hour => "1h",
            HistoryRange::Day => "24h",
            HistoryRange::Week => "7d",
        }
    }

    /// Minutes per point.
    pub fn step_minutes(self) -> i64 {
        match self {
            HistoryRange::Hour => 1,
            HistoryRange::Day => 15,
            HistoryRange::Week => 60,
        }
    }

    /// How many points it has.
    pub fn points(self) -> i64 {
        match self {
            HistoryRange::Hour => 60,
            HistoryRange::Day => 96,
            HistoryRange::Week => 168,
        }
    }

    /// How many minutes it covers.
    pub fn minutes(self) -> i64 {
        self.step_minutes() * self.points()
    }
}

/// One point of a chart: the minutes of a step merged. Counts add up; a
/// percentile over several minutes is the runs-weighted mean of the
/// minutes' medians (p50) and the largest of their p95s and maxima (an
/// upper bound, never an average that hides a bad minute); depth is the
/// step's last sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HistoryPoint {
    /// The step's start.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub at: DateTime<Utc>,
    /// As [`HistoryMinute`], over the step.
    pub completed: i64,
    /// Failed.
    pub failed: i64,
    /// Discarded.
    pub discarded: i64,
    /// Cancelled.
    pub cancelled: i64,
    /// Retried.
    pub retried: i64,
    /// Runs measured.
    pub runs: i64,
    /// Run time median, in milliseconds.
    pub run_p50_ms: Option<f64>,
    /// Run time p95.
    pub run_p95_ms: Option<f64>,
    /// Longest run.
    pub run_max_ms: Option<f64>,
    /// Waits measured.
    pub waits: i64,
    /// Wait median.
    pub wait_p50_ms: Option<f64>,
    /// Wait p95.
    pub wait_p95_ms: Option<f64>,
    /// Depth at the step's last sample.
    pub available: Option<i64>,
    /// Blocked at the step's last sample.
    pub blocked: Option<i64>,
    /// Scheduled at the step's last sample.
    pub scheduled: Option<i64>,
}

/// The points of `range` ending with the one that holds `now`, oldest
/// first, every step present (a step without minutes is a zero point).
pub fn points(range: HistoryRange, now: DateTime<Utc>, minutes: &[HistoryMinute]) -> Vec<HistoryPoint> {
    let step = Duration::minutes(range.step_minutes());
    let last = now.duration_trunc(step).unwrap_or(now);
    let first = last - step * (range.points() as i32 - 1);
    let mut steps: BTreeMap<DateTime<Utc>, Vec<&HistoryMinute>> =
        (0..range.points() as i32).map(|i| (first + step * i, Vec::new())).collect();
    for minute in minutes {
        let at = minute.minute.duration_trunc(step).unwrap_or(minute.minute);
        if let Some(bucket) = steps.get_mut(&at) {
            bucket.push(minute);
        }
    }
    steps.into_iter().map(|(at, minutes)| merge(at, &minutes)).collect()
}

/// The minutes of one step as one point (see [`HistoryPoint`]).
fn merge(at: DateTime<Utc>, minutes: &[&HistoryMinute]) -> HistoryPoint {
    let sum = |f: fn(&HistoryMinute) -> i64| minutes.iter().map(|m| f(m)).sum();
    let max = |f: fn(&HistoryMinute) -> Option<f64>| minutes.iter().filter_map(|m| f(m)).reduce(f64::max);
    let sampled = minutes.iter().rev().find(|m| m.available.is_some());
    HistoryPoint {
        at,
        completed: sum(|m| m.completed),
        failed: sum(|m| m.failed),
        discarded: sum(|m| m.discarded),
        cancelled: sum(|m| m.cancelled),
        retried: sum(|m| m.retried),
        runs: sum(|m| m.runs),
        run_p50_ms: weighted(minutes.iter().map(|m| (m.run_p50_ms, m.runs))),
        run_p95_ms: max(|m| m.run_p95_ms),
        run_max_ms: max(|m| m.run_max_ms),
        waits: sum(|m| m.waits),
        wait_p50_ms: weighted(minutes.iter().map(|m| (m.wait_p50_ms, m.waits))),
        wait_p95_ms: max(|m| m.wait_p95_ms),
        available: sampled.and_then(|m| m.available),
        blocked: sampled.and_then(|m| m.blocked),
        scheduled: sampled.and_then(|m| m.scheduled),
    }
}

/// `minutes` (the computed rows, oldest first) with each minute's retried
/// attempts (kept apart: hosts add them, see 0025_history.sql) added in,
/// a minute with retries only becoming a row of its own.
pub fn with_retries(minutes: Vec<HistoryMinute>, retries: Vec<(DateTime<Utc>, i64)>) -> Vec<HistoryMinute> {
    let mut by_minute: BTreeMap<DateTime<Utc>, HistoryMinute> = minutes.into_iter().map(|m| (m.minute, m)).collect();
    for (minute, retried) in retries {
        by_minute.entry(minute).or_insert_with(|| HistoryMinute { minute, ..Default::default() }).retried += retried;
    }
    by_minute.into_values().collect()
}

/// The mean of `values` weighted by their counts; `None` without any.
pub fn weighted(values: impl Iterator<Item = (Option<f64>, i64)>) -> Option<f64> {
    let (total, weight) = values
        .filter_map(|(value, count)| value.filter(|_| count > 0).map(|v| (v * count as f64, count)))
        .fold((0.0, 0i64), |(total, weight), (v, count)| (total + v, weight + count));
    (weight > 0).then(|| total / weight as f64)
}

/// The `p`-th percentile (0–1) of `sorted` (ascending), interpolating
/// between the two nearest values as PostgreSQL's `percentile_cont` does,
/// so both backends report the same figure for the same jobs.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = p.clamp(0.0, 1.0) * last as f64;
    let (below, above) = (rank.floor() as usize, rank.ceil() as usize);
    Some(sorted[below] + (sorted[above] - sorted[below]) * (rank - below as f64))
}

/// The finished jobs of one minute, queue and type, as maintenance
/// computes them from the archive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArchivedMinute {
    /// The minute, its queue and its type.
    pub minute: DateTime<Utc>,
    /// The queue.
    pub queue: String,
    /// The job type.
    pub job: String,
    /// Completed, failed, discarded, cancelled.
    pub ended: [i64; 4],
    /// Run times of the jobs that ran, in milliseconds.
    pub run_ms: Vec<f64>,
    /// Waits of the jobs that finished on their first attempt.
    pub wait_ms: Vec<f64>,
}

/// An archive row as the embedded backend reads it for the history.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchivedJob {
    /// When it finished.
    pub finished_at: DateTime<Utc>,
    /// Its queue and type.
    pub queue: String,
    /// The job type.
    pub job: String,
    /// Its final state.
    pub state: String,
    /// Its last attempt's run time.
    pub run_ms: Option<f64>,
    /// Its wait, when it finished on its first attempt.
    pub wait_ms: Option<f64>,
}

/// Archive rows grouped by minute, queue and type, with their times sorted.
pub fn archived_minutes(jobs: Vec<ArchivedJob>) -> Vec<ArchivedMinute> {
    let mut minutes: BTreeMap<(DateTime<Utc>, String, String), ArchivedMinute> = BTreeMap::new();
    for job in jobs {
        let minute = job.finished_at.duration_trunc(TimeDelta::minutes(1)).unwrap_or(job.finished_at);
        let entry = minutes.entry((minute, job.queue.clone(), job.job.clone())).or_insert_with(|| ArchivedMinute {
            minute,
            queue: job.queue,
            job: job.job,
            ..Default::default()
        });
        if let Some(index) = ["completed", "failed", "discarded", "cancelled"].iter().position(|s| *s == job.state) {
            entry.ended[index] += 1;
        }
        entry.run_ms.extend(job.run_ms);
        entry.wait_ms.extend(job.wait_ms);
    }
    let mut minutes: Vec<ArchivedMinute> = minutes.into_values().collect();
    for minute in &mut minutes {
        minute.run_ms.sort_by(f64::total_cmp);
        minute.wait_ms.sort_by(f64::total_cmp);
    }
    minutes
}

/// How far back maintenance computes the archive when a database has no
/// history yet: the archive's oldest rows within this are charted at once.
pub const BACKFILL: Duration = Duration::hours(24);

/// The most minutes one computation covers, so a backfill of a large
/// archive is spread over passes instead of one long statement.
pub const MINUTES_PER_PASS: i64 = 60;

/// Minutes this close to now are computed again at each pass: a result
/// written in a transaction that began in a minute already computed still
/// counts in it. One that commits later still is flagged at its commit
/// (PostgreSQL's `history_late`) and its minute computed again.
pub const SETTLE_MINUTES: i64 = 2;

/// The attempts a host scheduled again, per minute, queue and type, kept
/// in memory until the host adds them to the history.
#[derive(Debug, Clone, Default)]
pub struct RetryShare {
    counts: std::sync::Arc<std::sync::Mutex<BTreeMap<MinuteOf, i64>>>,
}

/// A minute, queue and job type.
type MinuteOf = (DateTime<Utc>, String, String);

/// One host's count of retried attempts for a minute, queue and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryCount {
    /// The minute (this host's clock).
    pub minute: DateTime<Utc>,
    /// The queue.
    pub queue: String,
    /// The job type.
    pub job: String,
    /// Attempts scheduled again.
    pub retried: i64,
}

impl RetryShare {
    /// Counts an attempt of a `job` in `queue` scheduled again now.
    pub fn retried(&self, queue: &str, job: &str) {
        let now = Utc::now();
        let minute = now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now);
        let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *counts.entry((minute, queue.to_string(), job.to_string())).or_default() += 1;
    }

    /// Takes the counts so far, leaving none.
    pub fn take(&self) -> Vec<RetryCount> {
        let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::take(&mut *counts)
            .into_iter()
            .map(|((minute, queue, job), retried)| RetryCount { minute, queue, job, retried })
            .collect()
    }

    /// Puts back counts a write could not add, to be added with the next.
    pub fn restore(&self, counts: Vec<RetryCount>) {
        let mut held = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for count in counts {
            *held.entry((count.minute, count.queue, count.job)).or_default() += count.retried;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `minute` minutes after an hour's start (1,800,000,000 s is one).
    fn at(minute: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + minute * 60, 0).unwrap()
    }

    #[test]
    fn percentile_interpolates_as_percentile_cont() {
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[7.0], 0.95), Some(7.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.5), Some(2.5));
        // 0.95 * 9 = 8.55: between the 9th and 10th values.
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!((percentile(&ten, 0.95).unwrap() - 9.55).abs() < 1e-9);
    }

    #[test]
    fn a_range_has_every_step_and_merges_its_minutes() {
        let minute = |m: i64, completed: i64, p50: f64, p95: f64, available: Option<i64>| HistoryMinute {
            minute: at(m),
            completed,
            runs: completed,
            run_p50_ms: Some(p50),
            run_p95_ms: Some(p95),
            available,
            ..Default::default()
        };
        // Minutes 0..15 are the first 15-minute step that ends at minute 14.
        let minutes = [minute(1, 1, 10.0, 20.0, Some(5)), minute(2, 3, 30.0, 90.0, None)];
        let points = points(HistoryRange::Day, at(14), &minutes);
        assert_eq!(points.len(), 96);
        let last = points.last().unwrap();
        assert_eq!(last.at, at(0));
        assert_eq!(last.completed, 4);
        assert_eq!(last.run_p50_ms, Some(25.0), "weighted by runs: (10·1 + 30·3) / 4");
        assert_eq!(last.run_p95_ms, Some(90.0), "the worst minute's p95");
        assert_eq!(last.available, Some(5), "the last sample");
        assert!(points[..95].iter().all(|p| p.completed == 0 && p.run_p50_ms.is_none()));
        assert_eq!(points[0].at, at(0) - Duration::minutes(15 * 95));
    }

    #[test]
    fn archive_rows_group_by_minute_queue_and_type() {
        let job = |second: i64, state: &str, run: Option<f64>| ArchivedJob {
            finished_at: at(3) + Duration::seconds(second),
            queue: "default".into(),
            job: "hello".into(),
            state: state.into(),
            run_ms: run,
            wait_ms: None,
        };
        let minutes = archived_minutes(vec![
            job(1, "completed", Some(3.0)),
            job(59, "failed", Some(1.0)),
            job(60, "cancelled", None),
        ]);
        assert_eq!(minutes.len(), 2);
        assert_eq!(minutes[0].ended, [1, 1, 0, 0]);
        assert_eq!(minutes[0].run_ms, vec![1.0, 3.0], "sorted");
        assert_eq!(minutes[1].minute, at(4));
        assert_eq!(minutes[1].ended, [0, 0, 0, 1]);
    }

    #[test]
    fn a_retry_share_is_taken_once_and_restored_after_a_failed_write() {
        let share = RetryShare::default();
        share.retried("default", "flaky");
        share.retried("default", "flaky");
        let taken = share.take();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].retried, 2);
        assert!(share.take().is_empty());
        share.restore(taken);
        share.retried("default", "flaky");
        assert_eq!(share.take().iter().map(|c| c.retried).sum::<i64>(), 3);
    }
}
