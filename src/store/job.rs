//! The job vocabulary: a job's states, what an enqueue asks for, what a
//! fetch hands out, how a run ends, and what operators see. The rules that
//! act on it are in [`super::enqueue`] and [`super::finish`]; the SQL is in
//! the backends.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::types::ChildJob;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for its time (delayed, or in retry backoff).
    Scheduled,
    /// Ready to run.
    Available,
    /// Held by a host under a lease.
    Running,
    /// Blocked until its concurrency key has a free slot.
    Blocked,
    /// Finished successfully.
    Completed,
    /// Finished without success: attempts spent or failed on purpose.
    Failed,
    /// Not run: refused by its concurrency limit.
    Discarded,
    /// Stopped by an operator.
    Cancelled,
}

impl JobState {
    /// Every state, in life order.
    pub const ALL: [JobState; 8] = [
        JobState::Scheduled,
        JobState::Available,
        JobState::Running,
        JobState::Blocked,
        JobState::Completed,
        JobState::Failed,
        JobState::Discarded,
        JobState::Cancelled,
    ];

    /// The name used in the database, the CLI and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Available => "available",
            JobState::Running => "running",
            JobState::Blocked => "blocked",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Discarded => "discarded",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Whether a job in this state has ended for good: it is in the archive.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Completed | JobState::Failed | JobState::Discarded | JobState::Cancelled)
    }

    /// Parses a state name.
    pub fn parse(name: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Reads a state name the database stored.
    ///
    /// # Errors
    /// [`super::Error::Decode`] for a name no state has: the schema and this
    /// binary disagree.
    pub(crate) fn decode(name: &str) -> super::Result<JobState> {
        JobState::parse(name).ok_or_else(|| super::Error::Decode(format!("unknown job state {name:?}")))
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, not `write_str`, so a table's column width applies.
        f.pad(self.as_str())
    }
}

/// What an enqueue did with one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Stored as a new job with this id.
    New(i64),
    /// Not stored: the job with this id holds its uniqueness key.
    Duplicate(i64),
    /// Not stored: the waiting job with this id holds its uniqueness key and
    /// took this enqueue's payload and time to run (`on_duplicate` `replace`).
    Replaced(i64),
}

impl Enqueued {
    /// The id of the job that stands for this enqueue: the new one, or the one
    /// holding the key.
    pub fn id(self) -> i64 {
        match self {
            Enqueued::New(id) | Enqueued::Duplicate(id) | Enqueued::Replaced(id) => id,
        }
    }
}

/// One job to enqueue. Unset options take the job type's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueParams {
    /// The job type; must be registered.
    pub job: String,
    /// The payload: a JSON object, stored as a document.
    pub payload: serde_json::Value,
    /// Overrides the job type's queue.
    pub queue: Option<String>,
    /// Overrides the job type's priority.
    pub priority: Option<i16>,
    /// Run no earlier than this (the database's clock decides when it is due).
    pub run_at: Option<DateTime<Utc>>,
    /// Run no earlier than this long after the enqueue commits.
    pub delay_ms: Option<u64>,
    /// The job whose run enqueued this one.
    pub parent_id: Option<i64>,
    /// The batch the job joins as a member; it must exist and be open.
    pub batch_id: Option<i64>,
    /// The W3C trace context its run joins (docs/observability.md).
    pub traceparent: Option<String>,
}

impl EnqueueParams {
    /// A job of type `job` with this payload and every option from its type.
    pub fn new(job: impl Into<String>, payload: serde_json::Value) -> Self {
        EnqueueParams {
            job: job.into(),
            payload,
            queue: None,
            priority: None,
            run_at: None,
            delay_ms: None,
            parent_id: None,
            batch_id: None,
            traceparent: None,
        }
    }

    /// This job's run joins the trace of `traceparent` (a W3C trace
    /// context); an invalid one is refused at the enqueue.
    pub fn traceparent(self, traceparent: impl Into<String>) -> Self {
        EnqueueParams { traceparent: Some(traceparent.into()), ..self }
    }

    /// The enqueue of a child job, written with its parent's completion.
    pub fn child(parent_id: i64, child: ChildJob) -> Self {
        Self::child_traced(parent_id, child, None)
    }

    /// The enqueue of a child job, whose run joins the trace of its
    /// parent's run.
    pub fn child_traced(parent_id: i64, child: ChildJob, traceparent: Option<String>) -> Self {
        EnqueueParams {
            job: child.job,
            payload: child.payload,
            queue: child.queue,
            priority: child.priority,
            run_at: None,
            delay_ms: child.delay_ms,
            parent_id: Some(parent_id),
            batch_id: None,
            traceparent,
        }
    }
}

/// What a host asks for when it fetches.
#[derive(Debug, Clone)]
pub struct FetchParams {
    /// The fetching host; recorded on each job it leases.
    pub host_id: String,
    /// The queues it serves.
    pub queues: Vec<String>,
    /// The job types it has loaded, each with its lease length in seconds.
    pub job_types: Vec<(String, i32)>,
    /// How many jobs it can start now.
    pub limit: i64,
}

/// A job leased to a host.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchedJob {
    /// The job's id.
    pub id: i64,
    /// The lease token every later write must present.
    pub lease_token: i64,
    /// The job type.
    pub job: String,
    /// The queue it was taken from.
    pub queue: String,
    /// The payload document.
    pub payload: serde_json::Value,
    /// This attempt's number, 1-based.
    pub attempt: i32,
    /// Attempts allowed in all.
    pub max_attempts: i32,
    /// When it was enqueued.
    pub enqueued_at: DateTime<Utc>,
    /// The batch it belongs to.
    pub batch_id: Option<i64>,
    /// Its rendered concurrency key.
    pub concurrency_key: Option<String>,
    /// How long the lease lasts without a heartbeat.
    pub lease_secs: i32,
}

/// How a run ended, as the store records it.
#[derive(Debug, Clone, PartialEq)]
pub enum FinishOutcome {
    /// Archive as completed, with the output, and enqueue the children.
    Completed {
        /// The guest's output document, as its text: shared, not copied,
        /// by the clones a retried write makes.
        output: Option<crate::types::JsonText>,
        /// Jobs the run enqueued, shared by the clones a retried write makes.
        children: std::sync::Arc<[ChildJob]>,
        /// Batches the run opened, created with its completion.
        batches: std::sync::Arc<[crate::types::BatchRequest]>,
        /// Workflows the run opened and steps it added, written with its completion.
        workflows: std::sync::Arc<crate::types::WorkflowEffects>,
        /// Events the run sent, sent in its completion's transaction.
        events: std::sync::Arc<[crate::types::ChildEvent]>,
        /// Changes the run made to keyed schedules, written in its completion's transaction.
        schedules: std::sync::Arc<[crate::schedule_spec::ScheduleChange]>,
    },
    /// Back to scheduled after a backoff, keeping the error.
    Retry {
        /// The attempt's error.
        error: String,
        /// The backoff.
        delay_ms: u64,
    },
    /// Archive as failed, keeping the error.
    Failed {
        /// The attempt's error.
        error: String,
    },
    /// Back to scheduled without spending the attempt.
    Snooze {
        /// How long to wait.
        delay_ms: u64,
    },
    /// Back to available at once without spending the attempt: the host
    /// stopped the run (shutdown), not the job's fault.
    Release {
        /// Why it was stopped.
        reason: String,
    },
    /// Archive as cancelled: an operator cancelled the job while it ran.
    Cancelled {
        /// What stopped it, kept as the attempt's error.
        reason: String,
    },
}

/// A job id and lease token no run can have (both come from sequences that
/// start at 1): writes that must go the way a result write goes but change
/// nothing (a probe, a new session's warm-up) name it.
pub const NO_RUN: i64 = -1;

/// One run's end, matched on its lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// The job.
    pub id: i64,
    /// The lease token from the fetch.
    pub lease_token: i64,
    /// Which attempt ended.
    pub attempt: i32,
    /// How it ended.
    pub outcome: FinishOutcome,
    /// The attempt's log lines and captured output, kept with the job.
    pub log: serde_json::Value,
    /// The latest progress the guest reported.
    pub progress: Option<serde_json::Value>,
    /// The concurrency key whose slot the run holds, if its type is
    /// limited: a write can then tell which results would wait on a key's
    /// lock another transaction holds.
    pub concurrency_key: Option<String>,
    /// The batch the run's job is a member of: where its children that
    /// join their parent's batch go.
    pub batch_id: Option<i64>,
    /// The run's own trace context, which the children it enqueued carry.
    pub traceparent: Option<String>,
}

impl Finish {
    /// The run this result ends.
    pub fn run(&self) -> super::RunId {
        super::RunId { job_id: self.id, lease_token: self.lease_token }
    }
}

/// What an operator's cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// The job was waiting, available or blocked: it is archived as cancelled.
    Cancelled,
    /// The job is running: its host learns of the cancel at its next lease
    /// renewal, stops the guest and archives the job as cancelled, giving
    /// back its slot in the same transaction (a slot is never freed while
    /// its guest may still run).
    Requested,
}

/// What happened to one [`Finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishResult {
    /// Recorded.
    Done,
    /// The lease is no longer this run's: another host owns the job now, so
    /// nothing was touched (guarantee 5).
    Duplicate,
    /// Not written: its key's semaphore is locked by another transaction
    /// (an application's, holding a `jobhost.enqueue` of that key until it
    /// commits), and the batch did not wait for it. Write it again with
    /// [`super::Store::job_finish`], which waits.
    Deferred,
}

/// What a result write does about a key's semaphore that another
/// transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockedKeys {
    /// Waits for it: the write ends only once every result is written.
    Wait,
    /// Leaves those results out ([`FinishResult::Deferred`]), so one key's
    /// lock never holds back the results of other keys or unlimited jobs.
    Defer,
}

/// Which jobs to list, newest (highest id) first. Every field narrows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobFilter {
    /// Only this state.
    pub state: Option<JobState>,
    /// Only this job type.
    pub job: Option<String>,
    /// Only jobs of this queue.
    pub queue: Option<String>,
    /// Only jobs with this rendered concurrency key.
    pub concurrency_key: Option<String>,
    /// Only members of this batch.
    pub batch_id: Option<i64>,
    /// Only jobs enqueued at or after this time.
    pub enqueued_since: Option<DateTime<Utc>>,
    /// Only jobs enqueued before this time.
    pub enqueued_before: Option<DateTime<Utc>>,
    /// Only jobs with an id below this one: the cursor of the next page,
    /// the last id of the page before. Ids never change, so a page never
    /// repeats or skips a job that existed when the first was read.
    pub before_id: Option<i64>,
    /// At most this many.
    pub limit: i64,
}

/// A job in a listing: a summary, never its payload, output, errors or
/// log, so a page of them costs the same whatever the jobs hold (a job's
/// documents come one job at a time, in [`JobDetail`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobRow {
    /// The job's id.
    pub id: i64,
    /// The job type.
    pub job: String,
    /// Its queue.
    pub queue: String,
    /// Where it is.
    pub state: JobState,
    /// Attempts started.
    pub attempts: i32,
    /// Its rendered concurrency key.
    pub concurrency_key: Option<String>,
    /// The last attempt's error; in a listing its first
    /// [`ERROR_PREVIEW_CHARS`] characters.
    pub error: Option<String>,
    /// When it was enqueued.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub enqueued_at: DateTime<Utc>,
    /// When its last attempt started.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub started_at: Option<DateTime<Utc>>,
    /// When it finished.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub finished_at: Option<DateTime<Utc>>,
}

/// How much of a job's last error a listing shows.
pub const ERROR_PREVIEW_CHARS: i64 = 500;

/// One job in full.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobDetail {
    /// The listing fields.
    #[serde(flatten)]
    pub row: JobRow,
    /// The guest's output document, for a completed job.
    pub output: Option<serde_json::Value>,
    /// Its priority.
    pub priority: i16,
    /// The payload document.
    pub payload: serde_json::Value,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Every failed attempt's error.
    #[serde(serialize_with = "super::timestamp::serialize_errors")]
    pub errors: serde_json::Value,
    /// The last attempt's log.
    pub log: Option<serde_json::Value>,
    /// The latest progress.
    pub progress: Option<serde_json::Value>,
    /// When it is (or was) due.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub run_at: Option<DateTime<Utc>>,
    /// The host running it.
    pub host_id: Option<String>,
    /// The job that enqueued it.
    pub parent_id: Option<i64>,
    /// The batch it belongs to.
    pub batch_id: Option<i64>,
    /// The workflow step it is, if it is one.
    pub workflow: Option<StepOf>,
}

/// The workflow step a job is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepOf {
    /// The workflow.
    pub id: i64,
    /// The step's name.
    pub step: String,
}

/// The queue at a glance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Every state with its count (zero included), in life order.
    pub states: std::collections::BTreeMap<JobState, i64>,
    /// Per queue, its jobs by state (only the states it has).
    pub queues: std::collections::BTreeMap<String, std::collections::BTreeMap<JobState, i64>>,
    /// Seconds the oldest available job has waited.
    pub oldest_available_secs: Option<f64>,
    /// Hosts that heartbeated within their own interval's allowance.
    pub hosts_alive: i64,
    /// Hosts presumed dead: silent for several of their own heartbeats.
    pub hosts_silent: Vec<super::fleet::SilentHost>,
    /// Queues an operator paused: no host leases from them.
    pub paused_queues: Vec<String>,
    /// Live hosts whose directory watcher is down: they may not see new components.
    pub watchers_down: Vec<super::fleet::WatcherDown>,
    /// Job types live hosts serve with different components.
    pub mixed_components: Vec<super::fleet::MixedComponents>,
}

impl Stats {
    /// The stats from (state, queue, count) rows, every state listed, and
    /// the hosts as (id, seconds since seen, heartbeat ms) rows, and the
    /// paused queues.
    ///
    /// # Errors
    /// [`super::Error::Decode`] for a state name no state has.
    pub fn from_counts(
        counts: Vec<(String, String, i64)>,
        oldest_available_secs: Option<f64>,
        hosts: Vec<(String, f64, i64)>,
        paused_queues: Vec<String>,
    ) -> super::Result<Stats> {
        let (hosts_alive, hosts_silent) = super::fleet::liveness(hosts);
        use std::collections::BTreeMap;
        let mut states: BTreeMap<JobState, i64> = JobState::ALL.iter().map(|s| (*s, 0)).collect();
        let mut queues: BTreeMap<String, BTreeMap<JobState, i64>> = BTreeMap::new();
        for (state, queue, count) in counts {
            let state = JobState::decode(&state)?;
            *states.entry(state).or_default() += count;
            *queues.entry(queue).or_default().entry(state).or_default() += count;
        }
        Ok(Stats {
            states,
            queues,
            oldest_available_secs,
            hosts_alive,
            hosts_silent,
            paused_queues,
            watchers_down: Vec::new(),
            mixed_components: Vec::new(),
        })
    }
}

/// Counts by state from (state name, count) rows.
///
/// # Errors
/// [`super::Error::Decode`] for a state name no state has.
pub(crate) fn counts_by_state(rows: Vec<(String, i64)>) -> super::Result<std::collections::BTreeMap<JobState, i64>> {
    rows.into_iter().map(|(state, count)| Ok((JobState::decode(&state)?, count))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_fills_its_table_column() {
        assert_eq!(format!("{:<10}|{:<10}|", JobState::Failed, JobState::Completed), "failed    |completed |");
    }

    #[test]
    fn state_names_round_trip() {
        for state in JobState::ALL {
            assert_eq!(JobState::parse(state.as_str()), Some(state));
        }
        assert_eq!(JobState::parse("done"), None);
    }
}
