//! Per-key concurrency: what operators see of slots and blocked jobs, what
//! the repair sweep reports, and the sweep of blocked jobs over the keys.
//! The gate itself is SQL, in the backends.

use serde::Serialize;

use super::Result;

/// One key of a limited job type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyStatus {
    /// The job type.
    pub job: String,
    /// The rendered key.
    pub key: String,
    /// The type's current limit (none when its latest version declares no limit).
    pub limit: Option<i32>,
    /// Slots taken, as the semaphore records them.
    pub holders: i32,
    /// The live jobs holding those slots.
    pub holding: Vec<Holder>,
    /// Jobs blocked until a slot frees.
    pub blocked: i64,
    /// Seconds the oldest blocked job has waited.
    pub oldest_blocked_secs: Option<f64>,
}

/// A job holding a slot.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Holder {
    /// The job's id.
    pub id: i64,
    /// `available` (admitted, not yet fetched) or `running`.
    pub state: String,
    /// The host running it, if running.
    pub host_id: Option<String>,
}

/// A semaphore the repair sweep corrected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SemaphoreFix {
    /// The job type.
    pub job: String,
    /// The key.
    pub key: String,
    /// The holder count it had.
    pub recorded: i32,
    /// The live jobs that hold its slots, which it now has.
    pub actual: i32,
}

/// Says in the host's log what a page of the repair sweep corrected, in
/// the same words on every backend, and returns the page.
pub(crate) fn logged_repairs(page: KeyPage<Vec<SemaphoreFix>>) -> KeyPage<Vec<SemaphoreFix>> {
    for SemaphoreFix { job, key, recorded, actual } in &page.done {
        tracing::warn!(job, key, recorded, actual, "repaired a semaphore whose holder count disagreed with its jobs");
    }
    page
}

/// A place in the (job type, key) order of concurrency keys: the last key a
/// paged maintenance sweep visited, where its next pass goes on.
pub type KeyCursor = (String, String);

/// The place before the first key, for a page query: a job type's name is
/// never empty.
pub(crate) fn key_page_start(after: Option<&KeyCursor>) -> (&str, &str) {
    after.map_or(("", ""), |(job, key)| (job.as_str(), key.as_str()))
}

/// How many keys a page query reads: one more than the page, to tell
/// whether the page reached the last key.
pub(crate) fn key_page_read(max_keys: i64) -> i64 {
    max_keys.saturating_add(1)
}

/// Cuts rows read with [`key_page_read`] to the page, and says where the
/// next page goes on: after the page's last key, or `None` at the end.
pub(crate) fn key_page_cut<R>(
    mut rows: Vec<R>,
    max_keys: i64,
    key_of: impl Fn(&R) -> KeyCursor,
) -> (Vec<R>, Option<KeyCursor>) {
    let more = rows.len() as i64 > max_keys;
    rows.truncate(usize::try_from(max_keys).unwrap_or(0));
    let next = if more { rows.last().map(key_of) } else { None };
    (rows, next)
}

/// What one page of a paged maintenance sweep did, and where the next page
/// starts: `next` is the last key this page visited, `None` when the page
/// reached the last key (the next pass starts again from the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPage<T> {
    /// What the page did.
    pub done: T,
    /// Where the next page goes on.
    pub next: Option<KeyCursor>,
}

/// The (job type, key) of every slot a write freed, one entry per slot (a
/// key listed twice gave back two).
#[derive(Debug, Default)]
pub struct Slots(Vec<(String, String)>);

impl Slots {
    /// Records a freed slot; a job without a key held none.
    pub fn push(&mut self, job: &str, key: Option<&str>) {
        if let Some(key) = key {
            self.0.push((job.to_string(), key.to_string()));
        }
    }

    /// The freed slots, in the order they were recorded.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(job, key)| (job.as_str(), key.as_str()))
    }

    /// True when no slot was freed: the release has nothing to do.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A key with blocked jobs, as the sweep reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockedKey {
    /// The job type.
    pub job: String,
    /// The key.
    pub key: String,
    /// Whether it has a free slot now, so its blocked jobs can be promoted.
    pub promotable: bool,
}

/// A backend's part in the sweep of blocked jobs: it reads and writes; the
/// sweep ([`promote_blocked`]) decides.
#[async_trait::async_trait]
pub(crate) trait BlockedSweep: Sync {
    /// The next `max_keys` keys with blocked jobs after `after` (from the
    /// first when `None`), in (job type, key) order.
    async fn blocked_keys_page(&self, after: Option<&KeyCursor>, max_keys: i64) -> Result<KeyPage<Vec<BlockedKey>>>;

    /// Promotes one key's blocked jobs into its free slots, in a
    /// transaction of its own: how many it promoted.
    async fn promote_key(&self, job: &str, key: &str) -> Result<u64>;
}

/// Visits a page of keys with blocked jobs and promotes those of the keys
/// that can take a slot now (see `Store::blocked_promote`).
///
/// One transaction per key: a key's promotion locks only that key, so the
/// sweep never holds one semaphore while waiting for another, and a key the
/// database refuses to promote stays blocked (guarantee 2) without holding
/// back the keys after it (guarantee 13): the page goes on past it.
pub(crate) async fn promote_blocked(
    backend: &(impl BlockedSweep + ?Sized),
    after: Option<&KeyCursor>,
    max_keys: i64,
) -> Result<KeyPage<u64>> {
    let page = backend.blocked_keys_page(after, max_keys).await?;
    let mut promoted = 0;
    for BlockedKey { job, key, .. } in page.done.into_iter().filter(|key| key.promotable) {
        match backend.promote_key(&job, &key).await {
            Ok(moved) => promoted += moved,
            Err(error) if error.is_refusal() => {
                tracing::error!(job, key, %error, "cannot promote this key's blocked jobs; they stay blocked");
            }
            // Another transaction holds the key's semaphore (an application
            // enqueuing to it): its blocked jobs wait for the next pass.
            Err(error) if error.is_lock_timeout() => {
                tracing::info!(job, key, "a key's semaphore is held by another transaction; promoting it next pass");
            }
            Err(error) => return Err(error),
        }
    }
    if promoted > 0 {
        tracing::info!(promoted, "promoted blocked jobs into free slots");
    }
    Ok(KeyPage { done: promoted, next: page.next })
}
