//! Writing results back: one batch of finished runs, sent until it is
//! written (the dispatcher in `dispatch.rs` decides what goes in each).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
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

/// How a write of a batch ended.
pub(super) enum Sent {
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
pub(super) async fn write_batch(
    writer: Writer,
    next: Arc<NextJobs>,
    mut pending: Vec<Done>,
    give_up: CancellationToken,
) -> Sent {
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
pub(super) async fn write_waiting_on_keys(writer: Writer, mut pending: Vec<Done>, give_up: CancellationToken) {
    let Writer { store, health, writes, .. } = &writer;
    let mut failed_sends = 0;
    while !pending.is_empty() {
        let finishes: Vec<Finish> = pending.iter().map(|d| d.finish.clone()).collect();
        let failure = match tokio::time::timeout(writes.deadline, store.job_finish(finishes)).await {
            Ok(Ok(results)) => {
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
            Ok(Ok(_)) => self.health.succeeded(),
            Ok(Err(error)) => {
                tracing::error!(job_id = id, %error, "cannot record the failure either; the job will be redelivered");
            }
            Err(_) => tracing::error!(job_id = id, "recording the failure got no answer; the job will be redelivered"),
        }
        self.leases.release(run);
    }

    /// Forgets the leases of written results, saying which were found already
    /// written or taken over; a write got through, whichever path sent it.
    fn release_written(&self, written: &[Done], results: &[FinishResult]) {
        self.health.succeeded();
        for (done, result) in written.iter().zip(results) {
            if *result == FinishResult::Duplicate {
                log_duplicate(done);
            }
            self.leases.release(done.finish.run());
        }
    }

    /// Writes results singly; one the database refuses becomes a failure of its
    /// job that says why. Returns the results that could not be written at all.
    /// Each result's writes are bounded by the write deadline, as every
    /// other send is: one that gets no answer in time (its connection lost
    /// unseen) is returned unwritten with all after it, to be sent again.
    async fn write_one_by_one(&self, pending: Vec<Done>) -> Vec<Done> {
        let mut unwritten = Vec::new();
        let mut pending = pending.into_iter();
        while let Some(done) = pending.next() {
            let (id, run) = (done.finish.id, done.finish.run());
            let Ok(written) = tokio::time::timeout(self.writes.deadline, self.write_alone(&done)).await else {
                tracing::warn!(job_id = id, deadline = ?self.writes.deadline, "a result written alone got no answer in time; sending it again");
                unwritten.push(done);
                unwritten.extend(pending);
                break;
            };
            match written {
                Ok(_) => {
                    self.health.succeeded();
                    self.leases.release(run);
                }
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

    /// Writes one result; if the database refuses it, writes its job's
    /// failure with the reason instead.
    async fn write_alone(&self, done: &Done) -> crate::store::Result<Vec<FinishResult>> {
        let id = done.finish.id;
        match self.store.job_finish(vec![done.finish.clone()]).await {
            Err(error) if error.is_refusal() => {
                tracing::error!(job_id = id, %error, "result cannot be stored; failing the job with the reason");
                let failed = Finish {
                    outcome: FinishOutcome::Failed { error: format!("the run's result could not be stored: {error}") },
                    log: serde_json::Value::Null,
                    progress: None,
                    ..done.finish.clone()
                };
                self.store.job_finish(vec![failed]).await
            }
            other => other,
        }
    }
}

fn log_duplicate(done: &Done) {
    tracing::warn!(
        job_id = done.finish.id,
        "result discarded: its lease is gone (the job was taken over, or an earlier send of this write committed)"
    );
}
