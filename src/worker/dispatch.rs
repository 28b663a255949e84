//! The completer's dispatcher: which finished runs go out in which result
//! write, and when a write goes out beside another still in flight. Each
//! write is sent by [`write_batch`] (`complete.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::complete::{Done, NextJobs, Sent, Writer, Writes, write_batch, write_waiting_on_keys};

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
/// While writes fail, the writer's health counts how long; see
/// [`super::health::WriteHealth`].
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Finish, FinishOutcome};

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
