//! What a run's child enqueues are checked against at the call: the probe
//! a check sees (the child, the run's earlier children per key) and the
//! check itself, which the worker builds from the fleet's job types. Shared
//! by the sandbox's `enqueue` and the workflow imports' steps.

use std::collections::HashMap;
use std::sync::Arc;

use crate::types::ChildJob;

/// A child job a guest asks to enqueue, as the [`ChildCheck`] sees it.
#[derive(Debug, Clone)]
pub struct ChildProbe {
    /// The child, with its options: the check applies the same rules as
    /// the completion that will enqueue it.
    pub child: ChildJob,
    /// How many children of each (type, key) this run enqueued before.
    pub earlier: ChildKeyCounts,
    /// A workflow step's job, enqueued when the step is released: its
    /// limit's room is the gate's to decide then, not the check's now.
    pub at_release: bool,
}

/// How many children a run has enqueued per (job type, rendered key): what a
/// check needs to know of the earlier ones, at a constant cost per call
/// however many there were. Clones share the map until it changes, and it
/// changes only between calls, when the probe holding it has been dropped.
#[derive(Debug, Clone, Default)]
pub struct ChildKeyCounts(Arc<HashMap<(String, String), u32>>);

impl ChildKeyCounts {
    /// The children of type `job` and key `key` enqueued so far.
    pub fn count(&self, job: &str, key: &str) -> u32 {
        // A tuple of `String`s cannot be looked up by `&str`s; a key is short.
        self.0.get(&(job.to_string(), key.to_string())).copied().unwrap_or(0)
    }

    /// How many (type, key) pairs are counted: what a probe carries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True before any limited child was enqueued.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn add(&mut self, job: String, key: String) {
        *Arc::make_mut(&mut self.0).entry((job, key)).or_insert(0) += 1;
    }
}

/// Checks a child against the fleet when the guest enqueues it (its type
/// exists, its payload and options pass the enqueue rules, a `raise` limit
/// has room for it), so the guest gets the error at the call instead of its
/// run failing at completion. `Ok` carries the
/// child's rendered concurrency key, if its type has one, for the counts
/// later probes carry; an `Err` is the message the guest receives.
pub type ChildCheck = std::sync::Arc<
    dyn Fn(ChildProbe) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<String>, String>> + Send>>
        + Send
        + Sync,
>;
