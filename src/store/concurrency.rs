//! Per-key concurrency: what operators see of slots and blocked jobs, and
//! what the repair sweep reports. The gate itself is SQL, in the backends.

use serde::Serialize;

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
