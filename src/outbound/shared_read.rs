//! Reads that runs starting together share. Each caller gets the result of
//! a read that began after it asked, so a grant revoked before a run starts
//! is never missed by that run; and at most one read per key is in flight,
//! so a thousand runs of one type starting at once cost one query, not a
//! thousand (which would also drain the connection pool the queue needs).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Mutex;

/// A read's result, and the number of the read that produced it.
type Last<T> = Option<(u64, Result<Arc<T>, String>)>;

/// One key's reads: how many have begun, and the last one's result,
/// behind the lock its reader holds.
struct Slot<T> {
    begun: AtomicU64,
    last: Mutex<Last<T>>,
}

/// Shared reads, by key.
pub struct SharedReads<K, T> {
    slots: std::sync::Mutex<HashMap<K, Arc<Slot<T>>>>,
}

impl<K, T> Default for SharedReads<K, T> {
    fn default() -> Self {
        SharedReads { slots: Default::default() }
    }
}

impl<K: Eq + Hash + Clone, T> SharedReads<K, T> {
    /// The result of a `read` of `key` that began after this call: this
    /// caller's own, or one another caller began meanwhile.
    ///
    /// # Errors
    /// That read's error.
    pub async fn read<F, Fut>(&self, key: &K, read: F) -> Result<Arc<T>, String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            slots
                .entry(key.clone())
                .or_insert_with(|| Arc::new(Slot { begun: AtomicU64::new(0), last: Mutex::new(None) }))
                .clone()
        };
        // Reads numbered above this one began after this call.
        let asked = slot.begun.load(Ordering::SeqCst);
        let mut last = slot.last.lock().await;
        if let Some((number, result)) = last.as_ref()
            && *number > asked
        {
            return result.clone();
        }
        let number = slot.begun.fetch_add(1, Ordering::SeqCst) + 1;
        let result = read().await.map(Arc::new);
        *last = Some((number, result.clone()));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::sync::{Notify, watch};

    // One thread, so each caller runs from its spawn to its first wait
    // without interruption: every caller has asked (read `begun`) before
    // the gate opens. On several threads a caller not yet polled when the
    // second read begins rightly asks for a third, and the count is a race.
    #[tokio::test(flavor = "current_thread")]
    async fn callers_arriving_together_share_one_read() {
        const CALLERS: usize = 200;
        let reads = Arc::new(SharedReads::<String, usize>::default());
        let count = Arc::new(AtomicUsize::new(0));
        let (open, gate) = watch::channel(false);
        let callers: Vec<_> = (0..CALLERS)
            .map(|_| {
                let (reads, count, mut gate) = (reads.clone(), count.clone(), gate.clone());
                tokio::spawn(async move {
                    reads
                        .read(&"mail".to_string(), || async move {
                            let _ = gate.wait_for(|open| *open).await;
                            Ok(count.fetch_add(1, Ordering::SeqCst) + 1)
                        })
                        .await
                })
            })
            .collect();
        // Every caller holds the key's slot (the map holds one more): all
        // have asked, the first while no read had begun, the rest while it
        // was in flight.
        while reads.slots.lock().unwrap().get("mail").is_none_or(|slot| Arc::strong_count(slot) < CALLERS + 1) {
            tokio::task::yield_now().await;
        }
        open.send(true).unwrap();
        for caller in callers {
            caller.await.unwrap().unwrap();
        }
        // The first read, and one more for all who asked while it was in
        // flight: a read each would be 200.
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_caller_never_gets_a_read_that_began_before_it_asked() {
        let reads = Arc::new(SharedReads::<&str, &str>::default());
        let (began, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let first = {
            let (reads, began, release) = (reads.clone(), began.clone(), release.clone());
            tokio::spawn(async move {
                reads
                    .read(&"mail", || async move {
                        began.notify_one();
                        release.notified().await;
                        Ok("granted")
                    })
                    .await
            })
        };
        began.notified().await;
        // Revoked now, while the first read is in flight: a run asking
        // after this must not see "granted".
        let second = {
            let reads = reads.clone();
            tokio::spawn(async move { reads.read(&"mail", || async { Ok("revoked") }).await })
        };
        tokio::task::yield_now().await;
        release.notify_one();
        assert_eq!(*first.await.unwrap().unwrap(), "granted");
        assert_eq!(*second.await.unwrap().unwrap(), "revoked");
        let error = reads.read(&"other", || async { Err::<&str, _>("no database".to_string()) }).await;
        assert_eq!(error.unwrap_err(), "no database");
    }
}
