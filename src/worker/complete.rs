//! Writing results back: batches of finished runs.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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

/// A job leased along with a batch of results, on its way to be started.
pub(super) struct Handoff {
    pub(super) job: FetchedJob,
    /// The fetch slot it holds.
    pub(super) slot: OwnedSemaphorePermit,
    /// When the write that leased it was sent (its lease runs from then).
    pub(super) sent_at: Instant,
}

/// Where the completer leases the next jobs: what to fetch, and where to
/// send what it leased. Nothing is leased once `shutdown` has fired.
pub(super) struct NextJobs {
    pub(super) spec: FetchSpec,
    pub(super) handoff: mpsc::UnboundedSender<Handoff>,
    pub(super) shutdown: CancellationToken,
}

/// How the completer writes: the most results in one transaction, and how
/// long one write may go unanswered before it is abandoned and sent again.
pub(super) struct Writes {
    pub(super) batch: usize,
    pub(super) deadline: Duration,
}

/// Writes finished runs back in batches: whatever has arrived since the last
/// write. With each batch it leases up to one job per fetch slot the batch's
/// runs held, so the jobs the batch made room for, a parked job promoted
/// into a freed slot among them, start without another round trip; slots it
/// cannot fill go back to the fetch loop once the batch is written. A write the database could not take is retried, never dropped: if
/// the leases expire meanwhile, the write later finds them taken and changes
/// nothing. A batch the database refuses is written one result at a time, so
/// one unstorable result cannot hold back the others.
pub(super) async fn complete_loop(
    store: Arc<dyn Store>,
    leases: Leases,
    mut done: mpsc::UnboundedReceiver<Done>,
    next: NextJobs,
    writes: Writes,
    give_up: CancellationToken,
) {
    let batch = writes.batch;
    let mut pending: Vec<Done> = Vec::new();
    // Results whose key another transaction holds, each batch written off
    // this loop by a task that waits for the key.
    let mut waiting_on_keys = tokio::task::JoinSet::new();
    loop {
        if pending.is_empty() {
            match done.recv().await {
                Some(first) => pending.push(first),
                None => {
                    while waiting_on_keys.join_next().await.is_some() {}
                    return;
                }
            }
        }
        while pending.len() < batch {
            match done.try_recv() {
                Ok(next) => pending.push(next),
                Err(_) => break,
            }
        }
        let finishes: Vec<Finish> = pending.iter().map(|d| d.finish.clone()).collect();
        let sent_at = Instant::now();
        let write = async {
            if next.shutdown.is_cancelled() {
                store.job_finish(finishes).await.map(|results| (results, Vec::new()))
            } else {
                store.job_finish_and_fetch(finishes, &next.spec.params(pending.len() as i64)).await
            }
        };
        // A write abandoned at its deadline may still have committed: its
        // retry then finds the runs' tokens gone and changes nothing, and
        // jobs it leased were never started here, so their leases expire.
        let written = match tokio::time::timeout(writes.deadline, write).await {
            Ok(written) => written,
            Err(_) => {
                tracing::warn!(deadline = ?writes.deadline, jobs = pending.len(), "result write got no answer in time; retrying");
                continue;
            }
        };
        match written {
            Ok((results, leased)) => {
                let mut slots: Vec<OwnedSemaphorePermit> = Vec::with_capacity(pending.len());
                let mut deferred = Vec::new();
                for (mut done, result) in pending.drain(..).zip(results) {
                    slots.extend(done.fetch_slot.take());
                    match result {
                        FinishResult::Deferred => {
                            deferred.push(done);
                            continue;
                        }
                        FinishResult::Duplicate => {
                            tracing::warn!(
                                job_id = done.finish.id,
                                "result discarded: its lease is gone (the job was taken over, or an earlier send of this write committed)"
                            );
                        }
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
                if !deferred.is_empty() {
                    tracing::info!(jobs = deferred.len(), "results wait for a key another transaction holds");
                    let (store, leases, give_up) = (store.clone(), leases.clone(), give_up.clone());
                    waiting_on_keys.spawn(write_waiting_on_keys(
                        store,
                        leases,
                        deferred,
                        writes.deadline * 30,
                        give_up,
                    ));
                }
            }
            Err(error) if give_up.is_cancelled() => {
                tracing::error!(%error, jobs = pending.len(), "abandoning results at shutdown; the jobs will be redelivered");
                return;
            }
            Err(error) if error.is_refusal() => {
                tracing::warn!(%error, jobs = pending.len(), "the database refused a batch of results; writing one by one");
                pending = write_one_by_one(store.as_ref(), &leases, pending).await;
            }
            Err(error) => {
                tracing::warn!(%error, jobs = pending.len(), "cannot write results; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Writes results whose keys another transaction holds locked (an
/// application's open transaction with a `jobhost.enqueue` of that key):
/// each write waits for its keys, off the completer's loop, so other keys'
/// results and unlimited jobs' go on meanwhile. The deadline is long, as
/// such a transaction may be; a write abandoned at it is sent again.
async fn write_waiting_on_keys(
    store: Arc<dyn Store>,
    leases: Leases,
    mut pending: Vec<Done>,
    deadline: Duration,
    give_up: CancellationToken,
) {
    while !pending.is_empty() {
        let finishes: Vec<Finish> = pending.iter().map(|d| d.finish.clone()).collect();
        match tokio::time::timeout(deadline, store.job_finish(finishes)).await {
            Ok(Ok(results)) => {
                for (done, result) in pending.iter().zip(results) {
                    if result == FinishResult::Duplicate {
                        tracing::warn!(
                            job_id = done.finish.id,
                            "result discarded: its lease is gone (the job was taken over, or an earlier send of this write committed)"
                        );
                    }
                    leases.release(done.finish.run());
                }
                return;
            }
            Ok(Err(error)) if error.is_refusal() => pending = write_one_by_one(store.as_ref(), &leases, pending).await,
            _ if give_up.is_cancelled() => {
                tracing::error!(jobs = pending.len(), "abandoning results at shutdown; the jobs will be redelivered");
                return;
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, jobs = pending.len(), "cannot write results; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(_) => tracing::warn!(?deadline, jobs = pending.len(), "results still wait for their keys; retrying"),
        }
    }
}

/// Writes results singly; one the database refuses becomes a failure of its
/// job that says why. Returns the results that could not be written at all.
async fn write_one_by_one(store: &dyn Store, leases: &Leases, pending: Vec<Done>) -> Vec<Done> {
    let mut unwritten = Vec::new();
    for done in pending {
        let (id, run) = (done.finish.id, done.finish.run());
        let written = match store.job_finish(vec![done.finish.clone()]).await {
            Err(error) if error.is_refusal() => {
                tracing::error!(job_id = id, %error, "result cannot be stored; failing the job with the reason");
                let failed = Finish {
                    outcome: FinishOutcome::Failed { error: format!("the run's result could not be stored: {error}") },
                    log: serde_json::Value::Null,
                    progress: None,
                    ..done.finish.clone()
                };
                store.job_finish(vec![failed]).await
            }
            other => other,
        };
        match written {
            Ok(_) => leases.release(run),
            // Refused twice: give up on it; its lease expires and it is redelivered.
            Err(error) if error.is_refusal() => {
                tracing::error!(job_id = id, %error, "dropping a result the database refuses; the job will be redelivered");
                leases.release(run);
            }
            Err(_) => unwritten.push(done),
        }
    }
    unwritten
}
