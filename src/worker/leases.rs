//! The leases this host holds: renewed together each heartbeat, and fenced
//! locally, so a host that cannot renew a lease stops that guest before the
//! database could hand the job to another host (guarantee 6).
//!
//! Renewal and fencing are two tasks. The fence runs on this host's
//! monotonic clock alone and never waits on the database, so a renewal that
//! hangs (a partition, a lock, an exhausted pool) cannot delay it; the
//! renewal only ever moves a fence later, by the time it was sent.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::component::{LiveProgress, StopSignal};
use crate::store::{
    FetchedJob, Finish, FinishOutcome, LeaseRenew, LeaseRenewal, RunId, RunProgress, Store, StrayLease,
};

use super::WorkerConfig;
use super::health::WriteHealth;
use super::membership::Membership;

/// One run's lease as this host sees it.
struct Held {
    lease: Duration,
    /// When this host stops the guest unless a renewal succeeds first:
    /// measured from before the statement that last set the lease was sent,
    /// so it always falls before the database's expiry.
    fence_at: Instant,
    signal: StopSignal,
    /// What its guest last reported, sent with the renewals.
    progress: LiveProgress,
    /// When the run ended, its result being on its way to the database. The
    /// lease is still renewed for one more lease length, so a slow write
    /// does not cause a redelivery, but not for ever: a result that has not
    /// been written by then is not coming soon, and its job is better run
    /// again elsewhere than held here. There is no guest left to stop.
    ended_at: Option<Instant>,
    /// Its result was not written within a lease of its end, and its lease
    /// is no longer renewed.
    overdue: bool,
    /// An operator asked to cancel the job: the run ends as cancelled
    /// unless its guest completed first.
    cancelled: bool,
    /// Its guest has started (it is not waiting for a run slot): renewals
    /// confirm its lease, so an expiry of it spends the attempt.
    started: bool,
}

/// The reason a cancelled run is stopped with, kept as its last error.
pub const CANCELLED: &str = "cancelled by an operator while running";

/// The runs of this host, each under its own lease. Keyed by run, not by
/// job: a job re-leased to this host while an older run of it lingers is a
/// second entry, and neither touches the other's.
#[derive(Clone, Default)]
pub struct Leases {
    held: Arc<Mutex<HashMap<RunId, Held>>>,
    /// Wakes the fence task when a lease is added whose fence comes before
    /// the one it waits for.
    added: Arc<Notify>,
    /// The fence the fence task waits for (none: no live lease), written
    /// and read under `held`'s lock. A new lease's fence is almost always
    /// later, so adding one rarely wakes the task: with a thousand runs
    /// held, waking it per lease scanned them all per job.
    next_fence: Arc<Mutex<Option<Instant>>>,
    calls: Arc<Mutex<LeasingCalls>>,
}

/// The calls that lease jobs to this host (its fetches, and its result
/// writes that lease the next jobs), so the heartbeat can tell a lease the
/// host will never learn of (leased by a call whose answer was lost or
/// abandoned) from one still on its way.
///
/// Lease tokens come from one sequence, so a call leases tokens larger than
/// every token drawn before it was sent, among them every token any earlier
/// answer carried. A stray lease whose token is at most the smallest such
/// floor of the calls that may still answer, and at most the largest token
/// seen so far, was leased by a call that has finished: if this host does
/// not hold it by then, it never will.
#[derive(Default)]
struct LeasingCalls {
    next: u64,
    /// The calls whose answer may still be used, each with the largest
    /// token this host had been answered with when it was sent.
    in_flight: HashMap<u64, i64>,
    /// The largest lease token any answer has carried.
    largest_seen: i64,
    /// Runs an answer carried that are not held yet: on their way to start.
    arriving: HashSet<RunId>,
}

/// A call that may lease jobs to this host, from its send until its answer
/// is in hand or it is abandoned (dropped).
pub struct LeasingCall {
    calls: Arc<Mutex<LeasingCalls>>,
    id: u64,
}

impl LeasingCall {
    /// The call's answer: the jobs it leased are on their way to be held.
    pub fn answered(&self, jobs: &[FetchedJob]) {
        let mut calls = lock_calls(&self.calls);
        for job in jobs {
            calls.largest_seen = calls.largest_seen.max(job.lease_token);
            calls.arriving.insert(RunId { job_id: job.id, lease_token: job.lease_token });
        }
    }
}

impl Drop for LeasingCall {
    fn drop(&mut self) {
        lock_calls(&self.calls).in_flight.remove(&self.id);
    }
}

fn lock_calls(calls: &Mutex<LeasingCalls>) -> std::sync::MutexGuard<'_, LeasingCalls> {
    // Updates are plain map operations that cannot panic midway.
    calls.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Why a stray lease is handed back: the host never knew of its job.
pub const STRAY: &str = "leased to this host by a write whose answer never reached it";

impl Leases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Held>> {
        // Updates are plain map operations that cannot panic midway.
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a call that may lease jobs to this host, before it is sent.
    pub fn leasing_call(&self) -> LeasingCall {
        let mut calls = lock_calls(&self.calls);
        let id = calls.next;
        calls.next += 1;
        let floor = calls.largest_seen;
        calls.in_flight.insert(id, floor);
        LeasingCall { calls: self.calls.clone(), id }
    }

    /// The largest token a stray lease may have for this host to be sure,
    /// whatever happens after this moment, that no call it may still use
    /// the answer of leased it (see [`LeasingCalls`]).
    fn stray_floor(&self) -> i64 {
        let calls = lock_calls(&self.calls);
        calls.in_flight.values().copied().fold(calls.largest_seen, i64::min)
    }

    /// The strays a renewal found that this host can hand back: leased
    /// before `floor` (taken before the renewal was sent) and neither held
    /// nor on their way to be held now.
    fn strays_to_hand_back(&self, strays: Vec<StrayLease>, floor: i64) -> Vec<StrayLease> {
        let held = self.lock();
        let calls = lock_calls(&self.calls);
        strays
            .into_iter()
            .filter(|s| s.run.lease_token <= floor && !held.contains_key(&s.run) && !calls.arriving.contains(&s.run))
            .collect()
    }

    /// Notes that a run's guest has started: renewals confirm its lease.
    pub fn started(&self, run: RunId) {
        if let Some(held) = self.lock().get_mut(&run) {
            held.started = true;
        }
    }

    /// Records a lease taken by a fetch sent at `sent_at`, with the run's
    /// stop signal and progress cell.
    pub fn hold(
        &self,
        run: RunId,
        lease: Duration,
        margin: Duration,
        sent_at: Instant,
        link: (StopSignal, LiveProgress),
    ) {
        let fence_at = sent_at + lease.saturating_sub(margin);
        let (signal, progress) = link;
        let held = Held {
            lease,
            fence_at,
            signal,
            progress,
            ended_at: None,
            overdue: false,
            cancelled: false,
            started: false,
        };
        let comes_first = {
            let mut held_now = self.lock();
            held_now.insert(run, held);
            let next = self.next_fence.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            next.is_none_or(|next| fence_at < next)
        };
        lock_calls(&self.calls).arriving.remove(&run);
        if comes_first {
            self.added.notify_one();
        }
    }

    /// Notes that a run's guest has returned; says whether an operator
    /// asked to cancel the job meanwhile.
    pub fn ended(&self, run: RunId) -> bool {
        match self.lock().get_mut(&run) {
            Some(held) => {
                held.ended_at.get_or_insert_with(Instant::now);
                held.cancelled
            }
            None => false,
        }
    }

    /// Forgets a lease once its run is written back.
    pub fn release(&self, run: RunId) {
        self.lock().remove(&run);
    }

    /// How many leases this host holds (running or prefetched jobs).
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// Stops every running guest with `reason`.
    pub fn stop_all(&self, reason: &str) {
        for held in self.lock().values() {
            held.signal.stop(reason);
        }
    }

    /// The runs to renew at `now`: every running one, and each ended one
    /// whose result has been on its way for less than a lease; those of
    /// them whose guests started; and the running ones' progress that
    /// changed since it was last sent.
    fn to_renew(&self, now: Instant) -> (Vec<RunId>, Vec<RunId>, Vec<RunProgress>) {
        let mut held = self.lock();
        let mut renew = Vec::with_capacity(held.len());
        let mut started = Vec::with_capacity(held.len());
        let mut progress = Vec::new();
        let mut overdue = Vec::new();
        for (run, lease) in held.iter_mut() {
            match lease.ended_at {
                Some(ended) if now.saturating_duration_since(ended) >= lease.lease => {
                    if !lease.overdue {
                        lease.overdue = true;
                        overdue.push(run.job_id);
                    }
                }
                _ => {
                    renew.push(*run);
                    if lease.started {
                        started.push(*run);
                    }
                }
            }
            if lease.ended_at.is_none()
                && let Some((done, total)) = lease.progress.take_changed()
            {
                progress.push(RunProgress { run: *run, done, total });
            }
        }
        if !overdue.is_empty() {
            tracing::error!(
                jobs = ?overdue,
                "results not written within a lease of their runs' end; no longer renewing their leases, so the jobs will be redelivered"
            );
        }
        (renew, started, progress)
    }

    /// Progress a renewal did not deliver goes with the next one.
    fn progress_unsent(&self, progress: &[RunProgress]) {
        let held = self.lock();
        for sent in progress {
            if let Some(lease) = held.get(&sent.run) {
                lease.progress.unsent();
            }
        }
    }

    /// Applies a renewal sent at `sent_at`: renewed leases move their fence;
    /// a lost one belongs to another host (or to nobody) now, so its guest
    /// is stopped at once; the rest keep their fence.
    fn renewed(&self, renewal: &LeaseRenewal, margin: Duration, sent_at: Instant) {
        let mut held = self.lock();
        for run in &renewal.renewed {
            if let Some(lease) = held.get_mut(run) {
                lease.fence_at = lease.fence_at.max(sent_at + lease.lease.saturating_sub(margin));
            }
        }
        for run in &renewal.cancelled {
            if let Some(lease) = held.get_mut(run).filter(|h| h.ended_at.is_none()) {
                tracing::info!(job_id = run.job_id, lease_token = run.lease_token, "job cancelled; stopping the run");
                lease.cancelled = true;
                lease.signal.stop(CANCELLED);
            }
        }
        for run in &renewal.lost {
            if let Some(lease) = held.get(run).filter(|h| h.ended_at.is_none()) {
                tracing::warn!(job_id = run.job_id, lease_token = run.lease_token, "lease lost; stopping the run");
                lease.signal.stop("lease lost: the job is no longer this host's");
            }
        }
    }

    /// Stops guests whose fence has passed; returns the next fence time.
    fn enforce_fences(&self, now: Instant) -> Option<Instant> {
        let held = self.lock();
        let live = |h: &&Held| h.ended_at.is_none() && !h.signal.is_stopped();
        for (run, lease) in held.iter().filter(|(_, h)| h.fence_at <= now && live(h)) {
            tracing::warn!(
                job_id = run.job_id,
                lease_token = run.lease_token,
                "lease could not be renewed in time; stopping the run"
            );
            lease.signal.stop("lease could not be renewed before it expired");
        }
        let next = held.values().filter(live).map(|h| h.fence_at).min();
        *self.next_fence.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = next;
        next
    }
}

/// Stops each guest whose lease was not renewed in time, until `shutdown`.
/// It reads nothing but this host's clock and its own table of leases.
pub async fn fence_loop(leases: Leases, shutdown: CancellationToken) {
    loop {
        let next_fence = leases.enforce_fences(Instant::now());
        let fence = async {
            match next_fence {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = fence => {}
            () = leases.added.notified() => {}
        }
    }
}

/// What the heartbeat renews, where, and when it must not.
pub struct Heartbeat {
    pub store: Store,
    pub leases: Leases,
    /// This host's row, written at each heartbeat (and at once when a
    /// component loads or goes).
    pub membership: Arc<Membership>,
    /// Whether results get written: while they cannot be, leases are not
    /// renewed, so the rest of the fleet runs this host's jobs.
    pub health: WriteHealth,
    pub config: WorkerConfig,
    pub metrics: crate::metrics::Metrics,
}

/// Renews leases and the host's row every heartbeat, until `shutdown`. Each
/// statement has a deadline of the fence margin: one not answered by then
/// is abandoned (the fence task stops what it must meanwhile) and the next
/// heartbeat sends a fresh one.
pub async fn heartbeat_loop(heartbeat: Heartbeat, shutdown: CancellationToken) {
    let Heartbeat { store, leases, membership, health, config, metrics } = heartbeat;
    let margin = config.fence_margin();
    let deadline = config.heartbeat_deadline();
    let mut tick = tokio::time::interval(config.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let sent_at = Instant::now();
        let host = membership.host();
        if let Some(failing) = health.given_up_for() {
            tracing::error!(
                ?failing,
                leases = leases.count(),
                "results cannot be written: not renewing leases, so this host's jobs go to the rest of the fleet"
            );
        } else {
            let (asked, started, progress) = leases.to_renew(sent_at);
            let floor = leases.stray_floor();
            let renew = LeaseRenew { host_id: &host.id, runs: &asked, started: &started, progress: &progress };
            match tokio::time::timeout(deadline, store.lease_renew(&renew)).await {
                Ok(Ok(mut renewal)) => {
                    metrics.leases_renewed(renewal.renewed.len(), renewal.lost.len());
                    leases.renewed(&renewal, margin, sent_at);
                    let strays = leases.strays_to_hand_back(std::mem::take(&mut renewal.strays), floor);
                    hand_back_strays(&store, strays, deadline).await;
                    // A run passed over for a lock did not write its progress.
                    let renewed: std::collections::HashSet<&RunId> = renewal.renewed.iter().collect();
                    let unwritten: Vec<RunProgress> =
                        progress.into_iter().filter(|p| !renewed.contains(&p.run)).collect();
                    leases.progress_unsent(&unwritten);
                }
                Ok(Err(error)) => {
                    leases.progress_unsent(&progress);
                    tracing::warn!(%error, "cannot renew leases; fencing continues");
                }
                Err(_) => {
                    leases.progress_unsent(&progress);
                    tracing::warn!(?deadline, "lease renewal got no answer in time; fencing continues");
                }
            }
        }
        membership.write_unless_writing(deadline).await;
    }
}

/// Hands back jobs leased to this host by a call whose answer never
/// reached it, at once and with their attempt given back, so they start
/// elsewhere now instead of when their lease expires (a whole concurrency
/// `duration` for a limited key, holding the key meanwhile). Each is matched
/// on its lease token, so one since taken over changes nothing. One that
/// cannot be handed back now is found by the next heartbeat.
async fn hand_back_strays(store: &Store, strays: Vec<StrayLease>, deadline: Duration) {
    if strays.is_empty() {
        return;
    }
    let jobs: Vec<i64> = strays.iter().map(|s| s.run.job_id).collect();
    let releases = strays
        .into_iter()
        .map(|s| Finish {
            id: s.run.job_id,
            lease_token: s.run.lease_token,
            attempt: s.attempt,
            outcome: FinishOutcome::Release { reason: STRAY.to_string() },
            log: serde_json::Value::Null,
            progress: None,
            concurrency_key: s.concurrency_key,
            batch_id: s.batch_id,
            traceparent: None,
        })
        .collect();
    match tokio::time::timeout(deadline, store.job_finish(releases)).await {
        Ok(Ok(_)) => tracing::warn!(?jobs, "handed back jobs leased to this host by a write whose answer was lost"),
        Ok(Err(error)) => tracing::warn!(%error, ?jobs, "cannot hand back jobs leased by a lost write; retrying"),
        Err(_) => tracing::warn!(?jobs, "handing back jobs leased by a lost write got no answer; retrying"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(1);

    fn run(job_id: i64, lease_token: i64) -> RunId {
        RunId { job_id, lease_token }
    }

    #[test]
    fn an_unrenewed_lease_is_fenced_before_it_expires() {
        let leases = Leases::default();
        let signal = StopSignal::new();
        let fetched = Instant::now();
        leases.hold(run(1, 7), LEASE, MARGIN, fetched, (signal.clone(), LiveProgress::new()));
        assert_eq!(leases.enforce_fences(fetched + Duration::from_secs(8)), Some(fetched + Duration::from_secs(9)));
        assert!(!signal.is_stopped());
        leases.enforce_fences(fetched + Duration::from_secs(9));
        assert!(signal.is_stopped(), "stopped a full margin before the database would expire the lease");
    }

    #[test]
    fn a_renewal_moves_the_fence_and_a_lost_lease_stops_the_run() {
        let leases = Leases::default();
        let (kept, lost, busy) = (StopSignal::new(), StopSignal::new(), StopSignal::new());
        let fetched = Instant::now();
        leases.hold(run(1, 7), LEASE, MARGIN, fetched, (kept.clone(), LiveProgress::new()));
        leases.hold(run(2, 8), LEASE, MARGIN, fetched, (lost.clone(), LiveProgress::new()));
        leases.hold(run(3, 9), LEASE, MARGIN, fetched, (busy.clone(), LiveProgress::new()));
        let renewed_at = fetched + Duration::from_secs(5);
        let renewal =
            LeaseRenewal { renewed: vec![run(1, 7)], lost: vec![run(2, 8)], cancelled: vec![], ..Default::default() };
        leases.renewed(&renewal, MARGIN, renewed_at);
        assert!(lost.is_stopped(), "a lost lease is someone else's");
        assert!(!kept.is_stopped() && !busy.is_stopped());
        leases.enforce_fences(fetched + Duration::from_secs(9));
        assert!(busy.is_stopped(), "a run whose row was locked keeps its old fence");
        assert_eq!(leases.enforce_fences(fetched + Duration::from_secs(12)), Some(renewed_at + LEASE - MARGIN));
        assert!(!kept.is_stopped());
    }

    #[test]
    fn two_runs_of_one_job_keep_their_own_leases() {
        let leases = Leases::default();
        let (old, new) = (StopSignal::new(), StopSignal::new());
        let fetched = Instant::now();
        leases.hold(run(1, 7), LEASE, MARGIN, fetched, (old.clone(), LiveProgress::new()));
        leases.hold(run(1, 8), LEASE, MARGIN, fetched, (new.clone(), LiveProgress::new()));
        assert_eq!(leases.count(), 2);
        let renewal =
            LeaseRenewal { renewed: vec![run(1, 8)], lost: vec![run(1, 7)], cancelled: vec![], ..Default::default() };
        leases.renewed(&renewal, MARGIN, fetched + Duration::from_secs(5));
        assert!(old.is_stopped() && !new.is_stopped(), "the old run is lost, the new one renewed");
        leases.release(run(1, 7));
        assert_eq!(leases.count(), 1, "writing the old run back leaves the new one's lease");
        leases.ended(run(1, 7));
        leases.enforce_fences(fetched + Duration::from_secs(9));
        assert!(!new.is_stopped(), "the new run's fence moved with its own renewal");
    }

    #[test]
    fn an_ended_run_is_renewed_for_one_lease_and_then_let_go() {
        let leases = Leases::default();
        let fetched = Instant::now();
        leases.hold(run(1, 7), LEASE, MARGIN, fetched, (StopSignal::new(), LiveProgress::new()));
        leases.hold(run(2, 8), LEASE, MARGIN, fetched, (StopSignal::new(), LiveProgress::new()));
        leases.ended(run(1, 7));
        let ended = Instant::now();
        assert_eq!(leases.to_renew(ended + LEASE - MARGIN).0.len(), 2, "a result on its way keeps its lease");
        assert_eq!(
            leases.to_renew(ended + LEASE).0,
            vec![run(2, 8)],
            "a result not written within a lease of its run's end lets its job go; the running one is still renewed"
        );
        assert_eq!(leases.count(), 2, "the result may still be written: it is only no longer renewed");
    }

    #[test]
    fn a_cancelled_run_is_stopped_and_remembered() {
        let leases = Leases::default();
        let signal = StopSignal::new();
        leases.hold(run(1, 7), LEASE, MARGIN, Instant::now(), (signal.clone(), LiveProgress::new()));
        let renewal =
            LeaseRenewal { renewed: vec![run(1, 7)], lost: vec![], cancelled: vec![run(1, 7)], ..Default::default() };
        leases.renewed(&renewal, MARGIN, Instant::now());
        assert_eq!(signal.reason(), Some(CANCELLED));
        assert!(leases.ended(run(1, 7)), "the run ends as cancelled");
    }

    fn leased(job_id: i64, lease_token: i64) -> FetchedJob {
        FetchedJob {
            id: job_id,
            lease_token,
            job: "j".into(),
            queue: "default".into(),
            payload: serde_json::json!({}),
            attempt: 1,
            max_attempts: 3,
            enqueued_at: chrono::Utc::now(),
            batch_id: None,
            concurrency_key: None,
            lease_secs: 10,
        }
    }

    fn stray(job_id: i64, lease_token: i64) -> StrayLease {
        StrayLease { run: run(job_id, lease_token), attempt: 1, concurrency_key: None, batch_id: None }
    }

    fn handed_back(leases: &Leases, strays: &[StrayLease], floor: i64) -> Vec<RunId> {
        leases.strays_to_hand_back(strays.to_vec(), floor).into_iter().map(|s| s.run).collect()
    }

    /// A lease this host does not hold is handed back only once no call
    /// whose answer it may still use can have leased it: its token is no
    /// larger than every token drawn before such a call was sent.
    #[test]
    fn only_strays_no_live_call_can_have_leased_are_handed_back() {
        let leases = Leases::default();
        let fetch = leases.leasing_call();
        fetch.answered(&[leased(1, 5)]);
        drop(fetch);
        let floor = leases.stray_floor();
        assert_eq!(floor, 5);
        assert!(handed_back(&leases, &[stray(1, 5)], floor).is_empty(), "answered, on its way to start");
        leases.hold(run(1, 5), LEASE, MARGIN, Instant::now(), (StopSignal::new(), LiveProgress::new()));
        assert!(handed_back(&leases, &[stray(1, 5)], floor).is_empty(), "held");

        // A write in flight may lease any token drawn after it was sent.
        let write = leases.leasing_call();
        let floor = leases.stray_floor();
        assert_eq!(handed_back(&leases, &[stray(2, 4), stray(3, 7)], floor), [run(2, 4)]);
        // Its answer came, with a larger token: token 7 was not its own, so
        // its call has ended without this host ever learning of it.
        write.answered(&[leased(4, 9)]);
        drop(write);
        let floor = leases.stray_floor();
        assert_eq!(handed_back(&leases, &[stray(3, 7), stray(4, 9)], floor), [run(3, 7)]);
        // An abandoned call's leases are strays once nothing older is in flight.
        let abandoned = leases.leasing_call();
        let later = leases.leasing_call();
        drop(abandoned);
        assert_eq!(leases.stray_floor(), 9, "the call still in flight was sent after token 9 was seen");
        drop(later);
    }

    /// A renewal that never answers cannot hold the fence back: the guest
    /// is stopped by the host's own clock while the statement still hangs.
    #[tokio::test(start_paused = true)]
    async fn a_hung_renewal_does_not_delay_the_fence() {
        let leases = Leases::default();
        let signal = StopSignal::new();
        let shutdown = CancellationToken::new();
        let fence = tokio::spawn(fence_loop(leases.clone(), shutdown.clone()));
        let fetched = Instant::now();
        leases.hold(run(1, 7), LEASE, MARGIN, fetched, (signal.clone(), LiveProgress::new()));
        tokio::time::timeout(LEASE, signal.stopped()).await.expect("stopped before the lease expired");
        assert_eq!(Instant::now(), fetched + LEASE - MARGIN);
        shutdown.cancel();
        fence.await.unwrap();
    }
}
