//! The schedule loop every host runs: it looks at every scheduled job type
//! that a live host serves, enqueues the jobs of the ticks that are due,
//! and sleeps until the next tick (a second at most, so a registration that
//! adds, changes or removes a schedule is seen within one).
//!
//! The database decides which ticks were enqueued (each schedule's cursor,
//! moved with a compare-and-set in the transaction that inserts the jobs;
//! see [`crate::store::schedule`]), so any number of hosts may look at once
//! and each tick is enqueued once. It also keeps the fleet's latest look at
//! each schedule: a tick that came due after a look of any host, no longer
//! than `max_pause` before this one, is enqueued however late; the ticks
//! before it were missed while no host looked, of which only the
//! schedule's `backfill` latest are enqueued ([`crate::calendar::due_ticks`]).
//! So a host that starts while others look (or a moment after they all
//! stopped) carries on where they were, and only a gap in which no host
//! looked for longer than `max_pause` counts as missed.
//!
//! Each look also passes over the keyed schedules (schedules made at run
//! time, [`crate::store::keyed_schedule`]): the database hands each host
//! the due ones with their rows locked and skipped by the others, a batch
//! at a time, until none is left due; the fleet's latest pass that left
//! none due plays the part of the latest look.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio_util::sync::CancellationToken;

use crate::calendar::{Calendar, due_ticks};
use crate::config::ConfigError;
use crate::store::keyed_schedule::KeyedPass;
use crate::store::{Enqueued, Fired, Store, Tick};

/// Settings of the schedule loop.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// The longest sleep between two looks: how soon a registration that
    /// adds, changes or removes a schedule, or a host that starts or stops
    /// serving one, is seen.
    pub max_sleep: Duration,
    /// The longest pause between two looks of this host after which it still
    /// enqueues every tick that came due in between; after a longer one (the
    /// host was frozen, or could not reach the database) those ticks count
    /// as missed and only the latest `backfill` are enqueued.
    pub max_pause: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { max_sleep: Duration::from_secs(1), max_pause: Duration::from_secs(10) }
    }
}

impl SchedulerConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// A zero sleep, or a pause no longer than the sleep (no host would ever
    /// count as looking without a pause).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_sleep.is_zero() {
            return Err(ConfigError { field: "max_sleep", reason: "must be positive".into() });
        }
        if self.max_pause <= self.max_sleep {
            return Err(ConfigError { field: "max_pause", reason: "must be longer than max_sleep".into() });
        }
        Ok(())
    }
}

/// What one look did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LookReport {
    /// Ticks whose jobs this host enqueued, by job type.
    pub enqueued: Vec<(String, DateTime<Utc>)>,
    /// Ticks of unique job types whose key a job (an earlier tick's, still
    /// waiting or running) held: with the id of that job, which skipped the
    /// tick or took its payload (`on_duplicate` `replace`).
    pub duplicates: Vec<(String, DateTime<Utc>, i64)>,
    /// Ticks skipped because their job was refused, with the reason.
    pub refused: Vec<(String, DateTime<Utc>, String)>,
    /// Schedules whose due ticks another host enqueued first.
    pub taken: Vec<String>,
    /// The earliest tick after this look of a schedule a live host serves.
    pub next_tick: Option<DateTime<Utc>>,
    /// The clock the look read its ticks by.
    pub now: Option<DateTime<Utc>>,
    /// What the passes over the keyed schedules did, summed.
    pub keyed: KeyedPass,
}

/// Sleeps shorter than this are rounded up: a tick a few milliseconds away
/// is not worth a look of its own.
const MIN_SLEEP: Duration = Duration::from_millis(2);

/// The schedule loop of one host.
pub struct Scheduler {
    store: Store,
    config: SchedulerConfig,
    /// Per job type, the time of this host's last look that handled it,
    /// while it keeps looking without a pause longer than `max_pause`: the
    /// fleet's record of looks, kept in the database, is written only every
    /// [`LOOK_RECORD_EVERY`]th of `max_pause`, and may not be written at all.
    looked: HashMap<String, DateTime<Utc>>,
    /// When this host last recorded a pass over the keyed schedules that
    /// left none due.
    keyed_recorded: Option<DateTime<Utc>>,
}

/// The most keyed schedules one pass takes: one transaction's worth.
const KEYED_BATCH: i64 = 500;

/// How soon a pass looks again at a schedule that stayed due because
/// another transaction held it.
const KEYED_LOCKED_RETRY: TimeDelta = TimeDelta::milliseconds(100);

/// The most passes one look makes over the keyed schedules before the
/// static ones get a turn again.
const KEYED_PASSES: usize = 20;

/// How stale the fleet's record of a schedule's latest look may grow, as a
/// part of `max_pause`, before a look writes it again: fresh enough that a
/// gap shorter than `max_pause` by more than this never counts as missed,
/// with a write every few seconds per schedule rather than every look.
const LOOK_RECORD_EVERY: i32 = 4;

impl Scheduler {
    /// A loop over `store`.
    ///
    /// # Errors
    /// Invalid settings.
    pub fn new(store: Store, config: SchedulerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Scheduler { store, config, looked: HashMap::new(), keyed_recorded: None })
    }

    /// One look at every schedule: enqueues the due ticks of each one a live
    /// host serves. `now` overrides the database's clock for the ticks, for
    /// tests. A schedule whose ticks cannot be written now (the database
    /// failing) stays due; the others go on.
    ///
    /// # Errors
    /// The schedules could not be read.
    pub async fn run_once(&mut self, now: Option<DateTime<Utc>>) -> crate::store::Result<LookReport> {
        let now_given = now;
        let listing = self.store.schedule_list(now).await?;
        let now = listing.now;
        let max_pause = TimeDelta::from_std(self.config.max_pause).unwrap_or(TimeDelta::MAX);
        let mut report = LookReport { now: Some(now), ..LookReport::default() };
        let mut looked = HashMap::new();
        let mut to_record = Vec::new();
        let record_after = max_pause / LOOK_RECORD_EVERY;
        for state in listing.schedules.iter().filter(|state| state.served) {
            let calendar = match Calendar::new(&state.schedule) {
                Ok(calendar) => calendar,
                Err(reason) => {
                    // Validated when its component loaded; a row written some other way.
                    tracing::warn!(job = state.job, reason, "a schedule cannot be read: it does not tick");
                    continue;
                }
            };
            // This host's last look, or the fleet's, whichever is later.
            let previous = self.looked.get(&state.job).copied().max(state.looked_at);
            let since = previous.filter(|at| now - *at <= max_pause);
            let ticks = due_ticks(&calendar, state.cursor(), since, now, state.schedule.backfill);
            let handled = if ticks.is_empty() {
                true
            } else {
                match self.store.schedule_fire(state, &ticks).await {
                    Ok(Fired::Done(done)) => {
                        record(&mut report, &state.job, done);
                        true
                    }
                    // Another host was first, perhaps to an earlier tick
                    // than this look found due: this host keeps counting
                    // from its previous look, so those ticks stay on time.
                    Ok(Fired::Taken) => {
                        report.taken.push(state.job.clone());
                        false
                    }
                    Err(error) => {
                        tracing::warn!(job = state.job, %error, "cannot enqueue a schedule's ticks; they stay due");
                        false
                    }
                }
            };
            match (handled, previous) {
                (true, _) => {
                    looked.insert(state.job.clone(), now);
                    if state.looked_at.is_none_or(|at| now - at >= record_after) {
                        to_record.push(state.job.clone());
                    }
                }
                (false, Some(at)) => {
                    looked.insert(state.job.clone(), at);
                }
                (false, None) => {}
            }
            if let Some(next) = calendar.next_after(now) {
                report.next_tick = Some(report.next_tick.map_or(next, |earliest| earliest.min(next)));
            }
        }
        // A schedule no live host serves (or that is gone) forgets its
        // looks: its ticks are missed until one does.
        self.looked = looked;
        if !to_record.is_empty()
            && let Err(error) = self.store.schedule_looked(&to_record, now).await
        {
            // The record only stays older: at worst a host starting later
            // counts a few more ticks as missed.
            tracing::warn!(%error, "cannot record this look at the schedules");
        }
        match self.keyed_passes(now_given, max_pause).await {
            Ok(keyed) => {
                // A schedule still due after a pass that took all it could
                // is locked by another transaction (a host's pass, an
                // application's write): looked at again shortly, not at once.
                let floor = keyed.now.map(|at| at + KEYED_LOCKED_RETRY);
                if let Some(next) =
                    keyed.next_look.map(|next| if keyed.full { next } else { next.max(floor.unwrap_or(next)) })
                {
                    report.next_tick = Some(report.next_tick.map_or(next, |earliest| earliest.min(next)));
                }
                report.keyed = keyed;
            }
            Err(error) => tracing::warn!(%error, "cannot pass over the keyed schedules; they stay due"),
        }
        Ok(report)
    }

    /// Passes over the due keyed schedules, a batch at a time, until a pass
    /// leaves none due (then recorded as the fleet's latest, every few
    /// seconds) or [`KEYED_PASSES`] are done. The passes' sums, with the
    /// last one's clock and next look (none when more are due at once).
    async fn keyed_passes(
        &mut self,
        now: Option<DateTime<Utc>>,
        max_pause: TimeDelta,
    ) -> crate::store::Result<KeyedPass> {
        let mut total = KeyedPass::default();
        for _ in 0..KEYED_PASSES {
            let pass = self.store.keyed_ticks(now, KEYED_BATCH, max_pause).await?;
            total.looked += pass.looked;
            total.enqueued += pass.enqueued;
            total.skipped += pass.skipped;
            total.now = pass.now;
            total.next_look = pass.next_look;
            total.full = pass.full;
            if pass.full {
                continue;
            }
            if let Some(at) = pass.now
                && self.keyed_recorded.is_none_or(|last| at - last >= max_pause / LOOK_RECORD_EVERY)
            {
                match self.store.keyed_looked(at).await {
                    Ok(()) => self.keyed_recorded = Some(at),
                    Err(error) => tracing::warn!(%error, "cannot record this pass over the keyed schedules"),
                }
            }
            break;
        }
        if total.enqueued > 0 || total.skipped > 0 {
            tracing::debug!(
                looked = total.looked,
                enqueued = total.enqueued,
                skipped = total.skipped,
                "keyed schedules ticked"
            );
        }
        Ok(total)
    }

    /// Looks at the schedules until `shutdown`, sleeping until the next
    /// tick between looks, by the clock the look read (the database's).
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let started = std::time::Instant::now();
            let sleep = match self.run_once(None).await {
                // The look's clock was read as it began: the time it took
                // is already part of the wait for the next tick.
                Ok(report) => self.sleep_after(&report).saturating_sub(started.elapsed()).max(MIN_SLEEP),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the schedules; looking again shortly");
                    self.config.max_sleep
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// How long to sleep after a look: until its next tick, within bounds.
    fn sleep_after(&self, report: &LookReport) -> Duration {
        if report.keyed.full {
            return MIN_SLEEP;
        }
        let until_next = match (report.next_tick, report.now) {
            (Some(next), Some(now)) => (next - now).to_std().unwrap_or(Duration::ZERO),
            _ => self.config.max_sleep,
        };
        // Just past the tick, so the next look finds it due.
        (until_next + MIN_SLEEP).clamp(MIN_SLEEP, self.config.max_sleep)
    }
}

/// Adds what one schedule's fire did to the report, and logs refusals.
fn record(report: &mut LookReport, job: &str, done: Vec<(DateTime<Utc>, Tick)>) {
    for (tick, outcome) in done {
        match outcome {
            Tick::Written(Enqueued::New(id)) => {
                tracing::debug!(job, %tick, id, "enqueued a scheduled tick");
                report.enqueued.push((job.to_string(), tick));
            }
            Tick::Written(Enqueued::Duplicate(holder) | Enqueued::Replaced(holder)) => {
                tracing::info!(job, %tick, holder, "a scheduled tick's key is held by an earlier job: not enqueued again");
                report.duplicates.push((job.to_string(), tick, holder));
            }
            Tick::Refused(reason) => {
                tracing::error!(job, %tick, reason, "a scheduled tick's job was refused; the tick is skipped");
                report.refused.push((job.to_string(), tick, reason));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_must_be_longer_than_a_sleep() {
        assert!(SchedulerConfig::default().validate().is_ok());
        let config = SchedulerConfig { max_pause: Duration::from_secs(1), ..SchedulerConfig::default() };
        assert_eq!(config.validate().unwrap_err().field, "max_pause");
        let config = SchedulerConfig { max_sleep: Duration::ZERO, ..SchedulerConfig::default() };
        assert_eq!(config.validate().unwrap_err().field, "max_sleep");
    }
}
