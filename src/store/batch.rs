//! Batches: a group of jobs counted as they end, whose callback jobs are
//! enqueued exactly once, in the transaction that ends the last member of a
//! closed batch (guarantee 12). The vocabulary, and the rules decided once
//! for both backends: which callbacks a new batch may name, and what a
//! finished batch enqueues. The counting itself is the backends' (a
//! trigger on the archive), so no path that ends a job can miss it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::enqueue::{Configs, EnqueueLimits, PreparedJob, job_names, prepare_registered};
use super::job::{EnqueueParams, Enqueued};
use super::{Backend, Error, Result};
use crate::types::MAX_BATCH_LABEL_BYTES;

/// A batch to create, as its creator asks for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewBatch {
    /// A name for people; not unique.
    pub label: Option<String>,
    /// The job types to enqueue when it finishes.
    pub callbacks: Callbacks,
    /// The object every callback's payload starts from (`{}` when `None`);
    /// the host adds `_batch`.
    pub callback_payload: Option<serde_json::Value>,
    /// Leave it open after its first members: more may be added (with
    /// [`EnqueueParams::batch_id`]) until it is closed. A closed batch
    /// finishes once every member has ended; an open one never does.
    pub open: bool,
}

/// A batch's callbacks: job types enqueued once when the batch finishes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Callbacks {
    /// Always.
    pub on_finish: Option<String>,
    /// When no member failed or was discarded (cancelled members do not count against it).
    pub on_success: Option<String>,
    /// When a member failed after its last attempt or was discarded.
    pub on_failure: Option<String>,
}

impl Callbacks {
    /// Each callback named, by its kind (`on_finish`, ...).
    pub fn named(&self) -> Vec<(&'static str, &str)> {
        [("on_finish", &self.on_finish), ("on_success", &self.on_success), ("on_failure", &self.on_failure)]
            .into_iter()
            .filter_map(|(kind, job)| job.as_deref().map(|job| (kind, job)))
            .collect()
    }

    /// The callbacks a batch that finished with these counts enqueues.
    pub fn due(&self, counts: &BatchCounts) -> Vec<(&'static str, &str)> {
        let succeeded = counts.succeeded();
        self.named()
            .into_iter()
            .filter(|(kind, _)| match *kind {
                "on_success" => succeeded,
                "on_failure" => !succeeded,
                _ => true,
            })
            .collect()
    }
}

/// A batch's members by where they are. Pending and running are read from
/// the live jobs; the endings are the counts the archive moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BatchCounts {
    /// Every member stored.
    pub total: i64,
    /// Waiting, available or blocked: not running and not ended.
    pub pending: i64,
    /// Leased to a host now.
    pub running: i64,
    /// Ended successfully (after however many attempts).
    pub completed: i64,
    /// Failed after their last attempt (or failed on purpose).
    pub failed: i64,
    /// Refused by their concurrency limit.
    pub discarded: i64,
    /// Cancelled by an operator.
    pub cancelled: i64,
}

impl BatchCounts {
    /// Members that have ended.
    pub fn ended(&self) -> i64 {
        self.completed + self.failed + self.discarded + self.cancelled
    }

    /// Whether nothing failed or was discarded.
    pub fn succeeded(&self) -> bool {
        self.failed + self.discarded == 0
    }
}

/// Where a batch is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    /// Takes more members; never finishes until closed.
    Open,
    /// Closed, with members still to end.
    Closed,
    /// Every member ended and nothing failed or was discarded.
    Succeeded,
    /// Every member ended, and some failed or were discarded.
    Failed,
}

impl BatchState {
    /// The name the CLI and JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Open => "open",
            BatchState::Closed => "closed",
            BatchState::Succeeded => "succeeded",
            BatchState::Failed => "failed",
        }
    }
}

/// One batch as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Batch {
    /// Its id.
    pub id: i64,
    /// Its label.
    pub label: Option<String>,
    /// Open, closed, or how it finished.
    pub state: BatchState,
    /// Its members by where they are.
    pub counts: BatchCounts,
    /// The work done, from 0 to 1: ended members count whole, and each
    /// live member the part of its latest `progress(done, total)`.
    pub progress: f64,
    /// The callbacks it names.
    pub callbacks: Callbacks,
    /// What each callback's payload starts from.
    pub callback_payload: serde_json::Value,
    /// The jobs the fired callbacks became, by kind.
    pub callback_jobs: BTreeMap<String, i64>,
    /// Callbacks refused when the batch finished, by kind, with the reason.
    pub callback_errors: BTreeMap<String, String>,
    /// When it was created.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub created_at: DateTime<Utc>,
    /// When it was closed.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub closed_at: Option<DateTime<Utc>>,
    /// When its last member ended (and its callbacks were enqueued).
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub finished_at: Option<DateTime<Utc>>,
}

impl Batch {
    /// The state a batch's times and counts say it is in.
    pub fn state_of(closed: bool, finished: bool, counts: &BatchCounts) -> BatchState {
        match (closed, finished) {
            (false, _) => BatchState::Open,
            (true, false) => BatchState::Closed,
            (true, true) if counts.succeeded() => BatchState::Succeeded,
            (true, true) => BatchState::Failed,
        }
    }

    /// The work done, from 0 to 1: `ended` members whole, plus `live_done`,
    /// the sum of the live members' reported fractions.
    pub fn progress_of(counts: &BatchCounts, live_done: f64) -> f64 {
        if counts.total <= 0 {
            return if counts.ended() >= counts.total { 1.0 } else { 0.0 };
        }
        ((counts.ended() as f64 + live_done) / counts.total as f64).clamp(0.0, 1.0)
    }
}

/// A batch's stored columns and what is read from its live members, as a
/// backend reads them: [`Batch::from`] derives the rest.
#[derive(Debug)]
pub struct StoredBatch {
    /// Its id.
    pub id: i64,
    /// Its label.
    pub label: Option<String>,
    /// Members stored, and the endings counted.
    pub total: i64,
    /// Ended successfully.
    pub completed: i64,
    /// Failed after their last attempt.
    pub failed: i64,
    /// Discarded by their limit.
    pub discarded: i64,
    /// Cancelled.
    pub cancelled: i64,
    /// Members leased to a host now.
    pub running: i64,
    /// The sum of the live members' reported fractions of work done.
    pub live_done: f64,
    /// Its callbacks.
    pub callbacks: Callbacks,
    /// What each callback's payload starts from.
    pub callback_payload: serde_json::Value,
    /// The jobs the fired callbacks became.
    pub callback_jobs: BTreeMap<String, i64>,
    /// Callbacks refused, with the reason.
    pub callback_errors: BTreeMap<String, String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was closed.
    pub closed_at: Option<DateTime<Utc>>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
}

impl From<StoredBatch> for Batch {
    fn from(stored: StoredBatch) -> Batch {
        let mut counts = BatchCounts {
            total: stored.total,
            pending: 0,
            running: stored.running,
            completed: stored.completed,
            failed: stored.failed,
            discarded: stored.discarded,
            cancelled: stored.cancelled,
        };
        counts.pending = (counts.total - counts.ended() - counts.running).max(0);
        Batch {
            id: stored.id,
            label: stored.label,
            state: Batch::state_of(stored.closed_at.is_some(), stored.finished_at.is_some(), &counts),
            progress: Batch::progress_of(&counts, stored.live_done),
            counts,
            callbacks: stored.callbacks,
            callback_payload: stored.callback_payload,
            callback_jobs: stored.callback_jobs,
            callback_errors: stored.callback_errors,
            created_at: stored.created_at,
            closed_at: stored.closed_at,
            finished_at: stored.finished_at,
        }
    }
}

/// A new batch with its first members, checked and prepared.
#[derive(Debug, Clone)]
pub struct PreparedBatch {
    /// Its label.
    pub label: Option<String>,
    /// Its callbacks, each a registered job type.
    pub callbacks: Callbacks,
    /// A JSON object.
    pub callback_payload: serde_json::Value,
    /// Left open after these members.
    pub open: bool,
    /// The first members, without their batch id (the backend sets it).
    pub members: Vec<PreparedJob>,
}

/// Creates a batch with its first members, all or none: checks the
/// callbacks (registered types whose keys render from the callback payload)
/// and prepares the members as any enqueue. Returns the batch's id and what
/// became of each member.
///
/// # Errors
/// An unregistered type, a callback payload that is not an object or
/// cannot render a callback's keys, a label too long, what an enqueue of
/// the members refuses, or the database.
pub(crate) async fn create(
    backend: &(impl Backend + ?Sized),
    batch: &NewBatch,
    members: &[EnqueueParams],
) -> Result<(i64, Vec<Enqueued>)> {
    if let Some(member) = members.iter().find(|m| m.batch_id.is_some()) {
        return Err(Error::InvalidEnqueue(format!(
            "a new batch's members cannot name another batch (job {:?} names {})",
            member.job,
            member.batch_id.unwrap_or_default()
        )));
    }
    if batch.label.as_ref().is_some_and(|l| l.len() > MAX_BATCH_LABEL_BYTES) {
        return Err(Error::InvalidEnqueue(format!("a batch's label is at most {MAX_BATCH_LABEL_BYTES} bytes")));
    }
    let names = job_names(members.iter().map(|m| m.job.as_str()).chain(batch.callbacks.named().iter().map(|c| c.1)));
    let configs = backend.configs_read(&names).await?;
    let callback_payload = batch.callback_payload.clone().unwrap_or_else(|| serde_json::json!({}));
    check_callbacks(&batch.callbacks, &callback_payload, &configs, backend.limits())?;
    let members = members
        .iter()
        .map(|m| prepare_registered(m.clone(), &configs, backend.limits()))
        .collect::<Result<Vec<_>>>()?;
    let prepared = PreparedBatch {
        label: batch.label.clone(),
        callbacks: batch.callbacks.clone(),
        callback_payload,
        open: batch.open,
        members,
    };
    backend.batch_write(prepared).await
}

/// Refuses callbacks that could never be enqueued: an unregistered type, a
/// payload that is not an object, or keys that do not render from it.
pub(crate) fn check_callbacks(
    callbacks: &Callbacks,
    payload: &serde_json::Value,
    configs: &Configs,
    limits: &EnqueueLimits,
) -> Result<()> {
    if !payload.is_object() {
        return Err(Error::InvalidEnqueue("a batch's callback payload must be a JSON object".into()));
    }
    let sample = callback_payload(payload, &BatchInfo { id: 0, label: None, counts: BatchCounts::default() });
    for (kind, job) in callbacks.named() {
        prepare_registered(EnqueueParams::new(job, sample.clone()), configs, limits).map_err(|error| {
            let reason = match error {
                Error::InvalidEnqueue(reason) => reason,
                other => other.to_string(),
            };
            Error::InvalidEnqueue(format!("the batch's {kind} callback: {reason}"))
        })?;
    }
    Ok(())
}

/// What a finished batch tells its callbacks.
#[derive(Debug, Clone)]
pub struct BatchInfo {
    /// The batch.
    pub id: i64,
    /// Its label.
    pub label: Option<String>,
    /// Its final counts (pending and running are zero).
    pub counts: BatchCounts,
}

/// A callback's payload: the creator's object with `_batch` added, as
/// PostgreSQL's `jobhost.batch_callback_payload` builds it.
pub fn callback_payload(base: &serde_json::Value, batch: &BatchInfo) -> serde_json::Value {
    let mut payload = base.clone();
    if let Some(object) = payload.as_object_mut() {
        let c = &batch.counts;
        object.insert(
            "_batch".into(),
            serde_json::json!({
                "id": batch.id,
                "label": batch.label,
                "succeeded": c.succeeded(),
                "total": c.total,
                "completed": c.completed,
                "failed": c.failed,
                "discarded": c.discarded,
                "cancelled": c.cancelled,
            }),
        );
    }
    payload
}

/// The callback jobs a finished batch enqueues, prepared against `configs`:
/// each kind with its job, or with why it cannot be enqueued (recorded on
/// the batch; it never fails the transaction ending the last member).
pub fn settle_callbacks(
    callbacks: &Callbacks,
    base: &serde_json::Value,
    batch: &BatchInfo,
    configs: &Configs,
    limits: &EnqueueLimits,
) -> Vec<(&'static str, Result<PreparedJob, String>)> {
    let payload = callback_payload(base, batch);
    callbacks
        .due(&batch.counts)
        .into_iter()
        .map(|(kind, job)| {
            let prepared = prepare_registered(EnqueueParams::new(job, payload.clone()), configs, limits)
                .map_err(|error| error.to_string());
            (kind, prepared)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(failed: i64, discarded: i64, cancelled: i64) -> BatchCounts {
        BatchCounts {
            total: 10,
            completed: 10 - failed - discarded - cancelled,
            failed,
            discarded,
            cancelled,
            ..Default::default()
        }
    }

    fn all() -> Callbacks {
        Callbacks { on_finish: Some("f".into()), on_success: Some("s".into()), on_failure: Some("x".into()) }
    }

    #[test]
    fn a_callback_that_cannot_be_enqueued_is_refused_in_one_sentence() {
        let configs: Configs = [("mail".to_string(), crate::store::enqueue::prepare_tests::config())].into();
        let callbacks = Callbacks { on_finish: Some("mail".into()), ..Default::default() };
        let error = check_callbacks(&callbacks, &serde_json::json!({}), &configs, &EnqueueLimits::default())
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("invalid enqueue: the batch's on_finish callback: job \"mail\""), "{error}");
        assert_eq!(error.matches("invalid enqueue").count(), 1, "{error}");
    }

    #[test]
    fn success_and_failure_callbacks_exclude_each_other_and_finish_always_fires() {
        let kinds = |c: &BatchCounts| all().due(c).into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(kinds(&counts(0, 0, 0)), ["on_finish", "on_success"]);
        assert_eq!(kinds(&counts(1, 0, 0)), ["on_finish", "on_failure"]);
        assert_eq!(kinds(&counts(0, 1, 0)), ["on_finish", "on_failure"]);
        assert_eq!(kinds(&counts(0, 0, 3)), ["on_finish", "on_success"], "a cancel is an operator's, not a failure");
    }

    #[test]
    fn a_callback_payload_keeps_the_creators_fields_and_adds_the_batch() {
        let info = BatchInfo { id: 7, label: Some("nightly".into()), counts: counts(2, 0, 0) };
        let payload = callback_payload(&serde_json::json!({"report": "r1"}), &info);
        assert_eq!(payload["report"], "r1");
        assert_eq!(payload["_batch"]["id"], 7);
        assert_eq!(payload["_batch"]["failed"], 2);
        assert_eq!(payload["_batch"]["succeeded"], false);
    }

    #[test]
    fn progress_counts_ended_members_whole_and_live_ones_in_part() {
        let c = BatchCounts { total: 4, completed: 1, failed: 1, running: 2, ..Default::default() };
        assert!((Batch::progress_of(&c, 0.5) - 0.625).abs() < 1e-9);
        assert_eq!(Batch::progress_of(&BatchCounts::default(), 0.0), 1.0, "an empty batch is done");
    }
}
