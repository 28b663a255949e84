//! Writing results back: batches of finished runs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::health::WriteHealth;
use super::prefetch::Prefetch;
use super::{FetchSpec, Leases};
use crate::store::{FetchedJob, Finish, FinishOutcome, FinishResult, Store};

/// A finished run on its way to the database. Its run slot is already free,
/// so a prefetched job starts at once; it keeps its fetch slot until its
/// result is written, and the completer leases the next job into that slot
/// with the write. Its lease is still renewed meanwhile.
pub(super) struct Done {
    pub(super) finish: Finish,
    /// `None` once given to a job leased in its place while its own result
    /// waits for a key another transaction holds.
    pub(super) fetch_slot: Option<OwnedSemaphorePermit>,
}

/// A leased job on its way to be started: leased by the fetch loop, or by
/// the completer along with a batch of results.
pub(super) struct Handoff {
    pub(super) job: FetchedJob,
    /// The fetch slot it holds.
    pub(super) slot: OwnedSemaphorePermit,
    /// When the write that leased it was sent (its lease runs from then).
    pub(super) sent_at: Instant,
}

/// Where the completer leases the next jobs: what to fetch, how many, and
/// where to send what it leased. Nothing is leased once `shutdown` has fired.
pub(super) struct NextJobs {
    pub(super) spec: FetchSpec,
    /// Bounds the jobs leased ahead of free run slots, as in the fetch loop.
    pub(super) prefetch: Prefetch,
    /// The fetch slots, of which `fetch_slots` in all, that say how many
    /// jobs this host holds.
    pub(super) capacity: Arc<Semaphore>,
    pub(super) fetch_slots: usize,
    pub(super) handoff: mpsc::UnboundedSender<Handoff>,
    pub(super) shutdown: CancellationToken,
}

/// How the completer writes: the most results in one transaction, how
/// long one write may go unanswered before it is abandoned and sent again,
/// and how many may be out at once.
#[derive(Clone, Copy)]
pub(super) struct Writes {
    pub(super) batch: usize,
    pub(super) deadline: Duration,
    /// The most writes out at once.
    pub(super) in_flight: usize,
}

/// What writing results takes: the database, the leases to forget once
/// their results are written, the health each write reports to, and how
/// writes are made.
#[derive(Clone)]
pub(super) struct Writer {
    pub(super) store: Store,
    pub(super) leases: Leases,
    pub(super) health: WriteHealth,
    pub(super) writes: Writes,
}

/// Writes finished runs back in batches: whatever has arrived since the last
/// write was sent. Up to [`Writes::in_flight`] writes may be out at once, each
/// on its own connection: once a write has been out for [`OVERLAP_AFTER`],
/// the results behind it go out beside it instead of waiting for its
/// answer. Results of one concurrency key never go out in two
/// writes at once: a key's later result waits for the write carrying its
/// earlier one, so a host's own writes never wait on each other's key locks.
/// With each batch it leases up to one job per fetch slot the batch's runs
/// held, so the jobs the batch made room for, a blocked job promoted into a
/// freed slot among them, start without another round trip; slots it
/// cannot fill go back to the fetch loop once the batch is written.
///
/// A write that fails is sent again, never dropped (see [`write_batch`]).
/// While writes fail, the writer's health counts how long; see [`WriteHealth`].
pub(super) async fn complete_loop(
    writer: Writer,
    mut done: mpsc::UnboundedReceiver<Done>,
    next: NextJobs,
    give_up: CancellationToken,
) {
    let (batch, in_flight_max) = (writer.writes.batch, writer.writes.in_flight.max(1));
    let next = Arc::new(next);
    // Arrived and not sent yet, in arrival order.
    let mut pending: Vec<Done> = Vec::new();
    let mut in_flight: JoinSet<Sent> = JoinSet::new();
    // The keys each write in flight carries.
    let mut busy_keys: HashMap<tokio::task::Id, Vec<String>> = HashMap::new();
    // When the latest write in flight was sent.
    let mut latest_sent: Option<Instant> = None;
    // Results whose key another transaction holds, each batch written off
    // this loop by a task that waits for the key.
    let mut waiting_on_keys = JoinSet::new();
    let mut receiving = true;
    let mut abandoning = false;
    loop {
        while receiving && pending.len() < batch {
            match done.try_recv() {
                Ok(next) => pending.push(next),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => receiving = false,
            }
        }
        // Another write goes out beside those in flight only once the latest
        // has been out for `OVERLAP_AFTER`: until then it is likely using
        // the CPU the next would share, not waiting.
        let overlap_at = latest_sent.filter(|_| !in_flight.is_empty()).map(|sent| sent + OVERLAP_AFTER);
        let room = !abandoning && in_flight.len() < in_flight_max;
        if room && overlap_at.is_none_or(|at| at <= Instant::now()) {
            let sendable = take_sendable(&mut pending, &busy_keys, batch);
            if !sendable.is_empty() {
                let keys = sendable.iter().filter_map(|d| d.finish.concurrency_key.clone()).collect();
                if !in_flight.is_empty() {
                    tracing::debug!(
                        beside = in_flight.len(),
                        results = sendable.len(),
                        "a result write goes out beside a slow one"
                    );
                }
                let task = in_flight.spawn(write_batch(writer.clone(), next.clone(), sendable, give_up.clone()));
                busy_keys.insert(task.id(), keys);
                latest_sent = Some(Instant::now());
                continue;
            }
        }
        let overlap_wait = overlap_at.filter(|at| room && !pending.is_empty() && *at > Instant::now());
        if in_flight.is_empty() && (abandoning || (!receiving && pending.is_empty())) {
            if !abandoning {
                while waiting_on_keys.join_next().await.is_some() {}
            }
            return;
        }
        tokio::select! {
            joined = in_flight.join_next_with_id(), if !in_flight.is_empty() => {
                let (id, sent) = match joined {
                    Some(Ok((id, sent))) => (id, sent),
                    // A write that panicked stops the completer, and so the
                    // host (its supervisor), as a panic in its own loop would:
                    // the panicked write's runs are still held, and renewed,
                    // so going on would keep their jobs running forever.
                    Some(Err(error)) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                    Some(Err(error)) => {
                        busy_keys.remove(&error.id());
                        tracing::error!(%error, "a result write was cancelled; its jobs will be redelivered");
                        continue;
                    }
                    None => continue,
                };
                busy_keys.remove(&id);
                match sent {
                    Sent::Written { deferred } if !deferred.is_empty() => {
                        tracing::info!(jobs = deferred.len(), "results wait for a key another transaction holds");
                        let writes = Writes { deadline: writer.writes.deadline * 30, ..writer.writes };
                        let waiting = Writer { writes, ..writer.clone() };
                        waiting_on_keys.spawn(write_waiting_on_keys(waiting, deferred, give_up.clone()));
                    }
                    Sent::Written { .. } => {}
                    Sent::Abandoned => abandoning = true,
                }
            }
            received = done.recv(), if receiving && !abandoning && pending.len() < batch => match received {
                Some(first) => pending.push(first),
                None => receiving = false,
            },
            () = tokio::time::sleep_until(overlap_wait.unwrap_or_else(Instant::now)), if overlap_wait.is_some() => {}
        }
    }
}

/// How long a write must have been out before another goes out beside it.
/// A write usually takes a few milliseconds of the database's CPU; on a
/// machine of two cores a second write at once only shares that CPU, and
/// measured slower (BENCHMARKS.md, "Result writes in flight"). One out this
/// long is waiting (for a lock, a lost reply, a stalled disk), and the
/// results behind it need not.
const OVERLAP_AFTER: Duration = Duration::from_millis(100);

/// Takes from `pending` the results a new write may carry, at most `batch`,
/// in arrival order: those whose key no write in flight carries. Results of
/// one key may share a write (one transaction frees both slots).
fn take_sendable(
    pending: &mut Vec<Done>,
    busy_keys: &HashMap<tokio::task::Id, Vec<String>>,
    batch: usize,
) -> Vec<Done> {
    if busy_keys.is_empty() && pending.iter().all(|d| d.finish.concurrency_key.is_none()) {
        let n = pending.len().min(batch);
        return pending.drain(..n).collect();
    }
    let busy: HashSet<&str> = busy_keys.values().flatten().map(String::as_str).collect();
    let mut take = vec![false; pending.len()];
    let mut taken = 0;
    for (i, done) in pending.iter().enumerate() {
        if taken == batch {
            break;
        }
        if done.finish.concurrency_key.as_deref().is_none_or(|key| !busy.contains(key)) {
            take[i] = true;
            taken += 1;
        }
    }
    let mut sendable = Vec::with_capacity(taken);
    let mut kept = Vec::with_capacity(pending.len() - taken);
    for (done, take) in pending.drain(..).zip(take) {
        if take { sendable.push(done) } else { kept.push(done) }
    }
    *pending = kept;
    sendable
}

/// How a write of a batch ended.
enum Sent {
    /// Written, but for the results whose key another transaction holds.
    Written { deferred: Vec<Done> },
    /// The host is giving up on its writes at shutdown: the jobs will be
    /// redelivered once their leases expire.
    Abandoned,
}

/// Writes one batch of results, leasing jobs into the fetch slots it frees,
/// until it is written. A write that fails is sent again, never dropped: if
/// the leases expire meanwhile, the write later finds them taken and changes
/// nothing. A batch the database refuses is written one result at a time,
/// and one that keeps failing while the database answers is split, so one
/// unstorable result fails its own job and cannot hold back the others.
async fn write_batch(writer: Writer, next: Arc<NextJobs>, mut pending: Vec<Done>, give_up: CancellationToken) -> Sent {
    let Writer { store, leases, health, writes } = &writer;
    // Sends of `pending` in a row that failed without a refusal.
    let mut failed_sends = 0;
    let mut deferred = Vec::new();
    while !pending.is_empty() {
        let finishes: Vec<Finish> = pending.iter().map(|d| d.finish.clone()).collect();
        let sent_at = Instant::now();
        // Dropped with the write if it is abandoned: what it may have leased
        // is then a stray the heartbeat hands back.
        let call = leases.leasing_call();
        let write = async {
            // One job per fetch slot the batch frees, as far as the prefetch
            // allows while runs are long.
            let freed = pending.iter().filter(|d| d.fetch_slot.is_some()).count();
            let held = next.fetch_slots.saturating_sub(next.capacity.available_permits() + freed);
            let limit = next.prefetch.room(held).min(freed);
            if next.shutdown.is_cancelled() || limit == 0 {
                store.job_finish(finishes).await.map(|results| (results, Vec::new()))
            } else {
                store.job_finish_and_fetch(finishes, &next.spec.params(limit as i64)).await
            }
        };
        // A write abandoned at its deadline may still have committed: its
        // retry then finds the runs' tokens gone and changes nothing, and
        // jobs it leased were never started here, so their leases expire.
        let failure = match tokio::time::timeout(writes.deadline, write).await {
            Ok(Ok((results, leased))) => {
                tracing::debug!(
                    results = results.len(),
                    leased = leased.len(),
                    write_us = sent_at.elapsed().as_micros() as u64,
                    "results written"
                );
                health.succeeded();
                call.answered(&leased);
                drop(call);
                let mut slots: Vec<OwnedSemaphorePermit> = Vec::with_capacity(pending.len());
                for (mut done, result) in pending.drain(..).zip(results) {
                    slots.extend(done.fetch_slot.take());
                    match result {
                        FinishResult::Deferred => {
                            deferred.push(done);
                            continue;
                        }
                        FinishResult::Duplicate => log_duplicate(&done),
                        FinishResult::Done => {}
                    }
                    leases.release(done.finish.run());
                }
                // Every run's fetch slot goes to the jobs leased in its place,
                // a deferred one's too: its guest has returned, and only its
                // result is still on its way.
                for job in leased {
                    let slot = slots.pop().expect("a fetch leases at most `limit` jobs");
                    let _ = next.handoff.send(Handoff { job, slot, sent_at });
                }
                continue;
            }
            Ok(Err(error)) if error.is_refusal() && !give_up.is_cancelled() => {
                tracing::warn!(%error, jobs = pending.len(), "the database refused a batch of results; writing one by one");
                pending = writer.write_one_by_one(pending).await;
                continue;
            }
            Ok(Err(error)) => SendFailure::of(&error),
            Err(_) => SendFailure::unanswered(writes.deadline),
        };
        if give_up.is_cancelled() {
            tracing::error!(%failure, jobs = pending.len(), "abandoning results at shutdown; the jobs will be redelivered");
            return Sent::Abandoned;
        }
        failed_sends += 1;
        health.failed();
        pending = writer.retry_or_split(pending, &failure, failed_sends).await;
        if !pending.is_empty() {
            tokio::select! {
                () = tokio::time::sleep(retry_delay(failed_sends)) => {}
                () = give_up.cancelled() => {}
            }
        }
    }
    Sent::Written { deferred }
}

/// Writes results whose keys another transaction holds locked (an
/// application's open transaction with a `jobhost.enqueue` of that key):
/// each write waits for its keys, off the completer's loop, so other keys'
/// results and unlimited jobs' go on meanwhile. The deadline is long, as
/// such a transaction may be; a write abandoned at it is sent again.
async fn write_waiting_on_keys(writer: Writer, mut pending: Vec<Done>, give_up: CancellationToken) {
    let Writer { store, health, writes, .. } = &writer;
    let mut failed_sends = 0;
    while !pending.is_empty() {
        let finishes: Vec<Finish> = pending.iter().map(|d| d.finish.clone()).collect();
        let failure = match tokio::time::timeout(writes.deadline, store.job_finish(finishes)).await {
            Ok(Ok(results)) => {
                health.succeeded();
                writer.release_written(&pending, &results);
                return;
            }
            Ok(Err(error)) if error.is_refusal() => {
                pending = writer.write_one_by_one(pending).await;
                continue;
            }
            Ok(Err(error)) => SendFailure::of(&error),
            Err(_) => {
                tracing::warn!(deadline = ?writes.deadline, jobs = pending.len(), "results still wait for their keys; retrying");
                continue;
            }
        };
        if give_up.is_cancelled() {
            tracing::error!(jobs = pending.len(), "abandoning results at shutdown; the jobs will be redelivered");
            return;
        }
        failed_sends += 1;
        health.failed();
        pending = writer.retry_or_split(pending, &failure, failed_sends).await;
        tokio::time::sleep(retry_delay(failed_sends)).await;
    }
}

/// Sends of one batch that fail, without the database refusing it, before
/// the batch is split: a failure that repeats while the database answers
/// is likely the batch's own (a result too large to send, a statement that
/// never finishes), not the connection's. A transient failure (a deadlock,
/// a lock or statement timeout, a cancel) never counts: it says nothing
/// about the batch (guarantee 13).
const SENDS_BEFORE_SPLITTING: u32 = 3;

/// Why a send of results failed.
struct SendFailure {
    reason: String,
    /// The database said the statement may pass later and nothing is wrong
    /// with its rows: the batch is sent again, never split.
    transient: bool,
}

impl SendFailure {
    fn of(error: &crate::store::Error) -> Self {
        SendFailure { reason: error.to_string(), transient: error.is_transient() }
    }

    fn unanswered(deadline: Duration) -> Self {
        SendFailure { reason: format!("no answer within {deadline:?}"), transient: false }
    }
}

impl std::fmt::Display for SendFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The wait before sending a failed batch again: doubling from 200 ms to 5 s.
fn retry_delay(failed_sends: u32) -> Duration {
    Duration::from_millis(200u64 << failed_sends.saturating_sub(1).min(5)).min(Duration::from_secs(5))
}

impl Writer {
    /// After a failed send: logs it, and once the same batch has failed
    /// [`SENDS_BEFORE_SPLITTING`] times while the database answers, splits
    /// it (see [`Writer::write_splitting`]). Returns what is still to be sent.
    async fn retry_or_split(&self, pending: Vec<Done>, failure: &SendFailure, failed_sends: u32) -> Vec<Done> {
        if failure.transient || failed_sends < SENDS_BEFORE_SPLITTING || !self.answers().await {
            tracing::warn!(%failure, jobs = pending.len(), failed_sends, "cannot write results; retrying");
            return pending;
        }
        tracing::warn!(
            %failure,
            jobs = pending.len(),
            failed_sends,
            "a batch of results keeps failing while the database answers; splitting it to find the results it will not take"
        );
        self.write_splitting(pending).await
    }

    /// Whether the database answers a trivial statement in time.
    async fn answers(&self) -> bool {
        matches!(tokio::time::timeout(self.writes.deadline, self.store.database_ping()).await, Ok(Ok(())))
    }

    /// Halves a batch that keeps failing until each failing part is a single
    /// result, and fails that result's job with the reason, so one result the
    /// database will not take (one too large for the server to hold, one
    /// whose statement never finishes) cannot hold back the host's other
    /// results. Stops at the first
    /// sign that the database itself is down and returns what it did not write.
    async fn write_splitting(&self, batch: Vec<Done>) -> Vec<Done> {
        let deadline = self.writes.deadline;
        let mut parts = vec![batch];
        let mut unwritten = Vec::new();
        while let Some(mut part) = parts.pop() {
            let finishes: Vec<Finish> = part.iter().map(|d| d.finish.clone()).collect();
            let failure = match tokio::time::timeout(deadline, self.store.job_finish(finishes)).await {
                Ok(Ok(results)) => {
                    self.release_written(&part, &results);
                    continue;
                }
                Ok(Err(error)) if error.is_refusal() => {
                    unwritten.extend(self.write_one_by_one(part).await);
                    continue;
                }
                // A full disk answers pings too, and a lock or a deadlock
                // is another transaction's doing; what failed is not these
                // results: they wait, whole.
                Ok(Err(error)) if error.is_out_of_resources() || error.is_transient() => {
                    unwritten.extend(part);
                    unwritten.extend(parts.into_iter().flatten());
                    break;
                }
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {deadline:?}"),
            };
            if !self.answers().await {
                unwritten.extend(part);
                unwritten.extend(parts.into_iter().flatten());
                break;
            }
            if part.len() > 1 {
                let second = part.split_off(part.len() / 2);
                parts.push(second);
                parts.push(part);
                continue;
            }
            for done in part {
                self.fail_unwritable(done, &failure).await;
            }
        }
        unwritten
    }

    /// Ends the job of a result the database would not take as failed, with
    /// the reason and without the result's output, children or log. If even
    /// that cannot be written, the result is dropped: its lease is no longer
    /// renewed, so the job is redelivered when it expires.
    async fn fail_unwritable(&self, done: Done, failure: &str) {
        let (id, run) = (done.finish.id, done.finish.run());
        tracing::error!(job_id = id, %failure, "a result could not be written; failing the job with the reason");
        let failed = Finish {
            outcome: FinishOutcome::Failed { error: format!("the run's result could not be written: {failure}") },
            log: serde_json::Value::Null,
            progress: None,
            ..done.finish
        };
        match tokio::time::timeout(self.writes.deadline, self.store.job_finish(vec![failed])).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::error!(job_id = id, %error, "cannot record the failure either; the job will be redelivered");
            }
            Err(_) => tracing::error!(job_id = id, "recording the failure got no answer; the job will be redelivered"),
        }
        self.leases.release(run);
    }

    /// Forgets the leases of written results, saying which were found already
    /// written or taken over.
    fn release_written(&self, written: &[Done], results: &[FinishResult]) {
        for (done, result) in written.iter().zip(results) {
            if *result == FinishResult::Duplicate {
                log_duplicate(done);
            }
            self.leases.release(done.finish.run());
        }
    }

    /// Writes results singly; one the database refuses becomes a failure of its
    /// job that says why. Returns the results that could not be written at all.
    async fn write_one_by_one(&self, pending: Vec<Done>) -> Vec<Done> {
        let mut unwritten = Vec::new();
        for done in pending {
            let (id, run) = (done.finish.id, done.finish.run());
            let written = match self.store.job_finish(vec![done.finish.clone()]).await {
                Err(error) if error.is_refusal() => {
                    tracing::error!(job_id = id, %error, "result cannot be stored; failing the job with the reason");
                    let failed = Finish {
                        outcome: FinishOutcome::Failed {
                            error: format!("the run's result could not be stored: {error}"),
                        },
                        log: serde_json::Value::Null,
                        progress: None,
                        ..done.finish.clone()
                    };
                    self.store.job_finish(vec![failed]).await
                }
                other => other,
            };
            match written {
                Ok(_) => self.leases.release(run),
                // Refused twice: give up on it; its lease expires and it is redelivered.
                Err(error) if error.is_refusal() => {
                    tracing::error!(job_id = id, %error, "dropping a result the database refuses; the job will be redelivered");
                    self.leases.release(run);
                }
                Err(_) => unwritten.push(done),
            }
        }
        unwritten
    }
}

fn log_duplicate(done: &Done) {
    tracing::warn!(
        job_id = done.finish.id,
        "result discarded: its lease is gone (the job was taken over, or an earlier send of this write committed)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(id: i64, key: Option<&str>) -> Done {
        let finish = Finish {
            id,
            lease_token: 1,
            attempt: 1,
            outcome: FinishOutcome::Failed { error: String::new() },
            log: serde_json::Value::Null,
            progress: None,
            concurrency_key: key.map(str::to_string),
            batch_id: None,
            traceparent: None,
        };
        Done { finish, fetch_slot: None }
    }

    fn ids(results: &[Done]) -> Vec<i64> {
        results.iter().map(|d| d.finish.id).collect()
    }

    #[tokio::test]
    async fn a_write_takes_no_key_another_write_carries() {
        let mut writes = JoinSet::new();
        let out = writes.spawn(async {});
        let busy = HashMap::from([(out.id(), vec!["a".to_string()])]);
        let mut pending =
            vec![done(1, Some("a")), done(2, None), done(3, Some("b")), done(4, Some("b")), done(5, None)];
        let sent = take_sendable(&mut pending, &busy, 10);
        assert_eq!(ids(&sent), [2, 3, 4, 5], "a's result waits for the write carrying a; b's two share one");
        assert_eq!(ids(&pending), [1]);
        pending.extend([done(6, Some("c")), done(7, Some("a"))]);
        let sent = take_sendable(&mut pending, &busy, 10);
        assert_eq!((ids(&sent), ids(&pending)), (vec![6], vec![1, 7]), "what stays keeps its order");

        let sent = take_sendable(&mut pending, &HashMap::new(), 10);
        assert_eq!(ids(&sent), [1, 7]);
        assert!(pending.is_empty());
    }

    #[test]
    fn a_write_carries_at_most_a_batch() {
        let mut pending: Vec<Done> = (1..=5).map(|id| done(id, None)).collect();
        let sent = take_sendable(&mut pending, &HashMap::new(), 2);
        assert_eq!((ids(&sent), ids(&pending)), (vec![1, 2], vec![3, 4, 5]));
        let mut pending: Vec<Done> =
            (1..=5).map(|id| done(id, Some(if id % 2 == 0 { "even" } else { "odd" }))).collect();
        let sent = take_sendable(&mut pending, &HashMap::new(), 3);
        assert_eq!((ids(&sent), ids(&pending)), (vec![1, 2, 3], vec![4, 5]));
    }
}
