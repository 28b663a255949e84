//! Jobs: what an enqueue asks for, what a fetch hands out, how a run ends,
//! and what operators see. Backend-neutral; the SQL is in the backends.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::types::ChildJob;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
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

    /// Parses a state name.
    pub fn parse(name: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, not `write_str`, so a table's column width applies.
        f.pad(self.as_str())
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
        }
    }

    /// The enqueue of a child job, written with its parent's completion.
    pub fn child(parent_id: i64, child: ChildJob) -> Self {
        EnqueueParams {
            job: child.job,
            payload: child.payload,
            queue: child.queue,
            priority: child.priority,
            run_at: None,
            delay_ms: child.delay_ms,
            parent_id: Some(parent_id),
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

/// Which jobs to list.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    /// Only this state.
    pub state: Option<JobState>,
    /// Only this job type.
    pub job: Option<String>,
    /// At most this many.
    pub limit: i64,
}

/// A job in a listing.
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
    /// The guest's output document, for a completed job.
    pub output: Option<serde_json::Value>,
    /// The last attempt's error.
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

/// One job in full.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobDetail {
    /// The listing fields.
    #[serde(flatten)]
    pub row: JobRow,
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
}

/// The queue at a glance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Every state name with its count (zero included).
    pub states: std::collections::BTreeMap<String, i64>,
    /// Per queue, live jobs by state.
    pub queues: std::collections::BTreeMap<String, std::collections::BTreeMap<String, i64>>,
    /// Seconds the oldest available job has waited.
    pub oldest_available_secs: Option<f64>,
    /// Hosts that heartbeated within their own interval's allowance.
    pub hosts_alive: i64,
    /// Hosts presumed dead: silent for several of their own heartbeats.
    pub hosts_silent: Vec<super::host::SilentHost>,
    /// Queues an operator paused: no host leases from them.
    pub paused_queues: Vec<String>,
    /// Live hosts whose directory watcher is down: they may not see new components.
    pub watchers_down: Vec<super::host::WatcherDown>,
    /// Job types live hosts serve with different components.
    pub mixed_components: Vec<super::host::MixedComponents>,
}

impl Stats {
    /// The stats from (state, queue, count) rows, every state listed, and
    /// the hosts as (id, seconds since seen, heartbeat ms) rows, and the
    /// paused queues.
    pub fn from_counts(
        counts: Vec<(String, String, i64)>,
        oldest_available_secs: Option<f64>,
        hosts: Vec<(String, f64, i64)>,
        paused_queues: Vec<String>,
    ) -> Stats {
        let (hosts_alive, hosts_silent) = super::host::liveness(hosts);
        use std::collections::BTreeMap;
        let mut states: BTreeMap<String, i64> = JobState::ALL.iter().map(|s| (s.as_str().to_string(), 0)).collect();
        let mut queues: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for (state, queue, count) in counts {
            *states.entry(state.clone()).or_default() += count;
            *queues.entry(queue).or_default().entry(state).or_default() += count;
        }
        Stats {
            states,
            queues,
            oldest_available_secs,
            hosts_alive,
            hosts_silent,
            paused_queues,
            watchers_down: Vec::new(),
            mixed_components: Vec::new(),
        }
    }
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

/// An enqueue with the job type's defaults applied and every check passed,
/// ready for any backend to insert.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedJob {
    /// The job type.
    pub job: String,
    /// The queue.
    pub queue: String,
    /// The priority.
    pub priority: i16,
    /// The payload object.
    pub payload: serde_json::Value,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// An absolute due time, if the enqueuer gave one.
    pub run_at: Option<DateTime<Utc>>,
    /// A delay from the enqueue's commit, in milliseconds (0 for none).
    pub delay_ms: i64,
    /// The rendered concurrency key, for a limited job type.
    pub concurrency_key: Option<String>,
    /// The job that enqueued it.
    pub parent_id: Option<i64>,
}

/// What one enqueue may carry, applied by every enqueue through a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnqueueLimits {
    /// The largest payload, as JSON text, in bytes.
    pub max_payload_bytes: usize,
}

impl Default for EnqueueLimits {
    fn default() -> Self {
        EnqueueLimits { max_payload_bytes: crate::types::DEFAULT_MAX_PAYLOAD_BYTES }
    }
}

/// The length of a JSON document's text, without keeping the text.
pub fn json_len(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a Value to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Applies the job type's configuration to an enqueue and checks it.
///
/// # Errors
/// The payload is not a JSON object or is larger than `limits` allow, an
/// override is invalid, or the concurrency key cannot be rendered from the
/// payload.
pub fn prepare(
    params: &EnqueueParams,
    config: &crate::types::JobConfig,
    limits: &EnqueueLimits,
) -> Result<PreparedJob, super::Error> {
    use super::Error;
    if !params.payload.is_object() {
        return Err(Error::PayloadNotObject { job: params.job.clone(), kind: json_kind(&params.payload) });
    }
    let bytes = json_len(&params.payload);
    if bytes > limits.max_payload_bytes {
        return Err(Error::PayloadTooLarge { job: params.job.clone(), bytes, max: limits.max_payload_bytes });
    }
    let queue = params.queue.clone().unwrap_or_else(|| config.queue.clone());
    crate::types::check_name(&queue).map_err(|reason| Error::InvalidEnqueue(format!("queue {reason}")))?;
    if params.run_at.is_some() && params.delay_ms.is_some() {
        return Err(Error::InvalidEnqueue("give a delay or a time to run at, not both".into()));
    }
    let delay_ms =
        i64::try_from(params.delay_ms.unwrap_or(0)).map_err(|_| Error::InvalidEnqueue("delay is too long".into()))?;
    let concurrency_key = match &config.concurrency {
        None => None,
        Some(limit) => Some(
            limit
                .key
                .render(&params.payload)
                .map_err(|e| Error::InvalidEnqueue(format!("job {:?}: {e}", params.job)))?,
        ),
    };
    Ok(PreparedJob {
        job: params.job.clone(),
        queue,
        priority: params.priority.unwrap_or(config.priority),
        payload: params.payload.clone(),
        max_attempts: i32::try_from(config.max_attempts).unwrap_or(i32::MAX),
        run_at: params.run_at,
        delay_ms,
        concurrency_key,
        parent_id: params.parent_id,
    })
}

/// The distinct job types of a batch of enqueues, sorted.
pub fn job_names(jobs: &[EnqueueParams]) -> Vec<String> {
    let mut names: Vec<String> = jobs.iter().map(|j| j.job.clone()).collect();
    names.sort();
    names.dedup();
    names
}

/// Prepares every enqueue of a batch against its registered type's
/// configuration in `configs`.
///
/// # Errors
/// An unregistered type, or what [`prepare`] refuses.
pub fn prepare_all(
    jobs: &[EnqueueParams],
    configs: &std::collections::HashMap<String, crate::types::JobConfig>,
    limits: &EnqueueLimits,
) -> Result<Vec<PreparedJob>, super::Error> {
    jobs.iter()
        .map(|job| {
            let config = configs.get(&job.job).ok_or_else(|| super::Error::UnknownJobType(job.job.clone()))?;
            prepare(job, config, limits)
        })
        .collect()
}

/// The job types of every child that the completed runs among `finishes`
/// enqueue, each once.
pub fn child_types(finishes: &[Finish]) -> Vec<String> {
    let mut names: Vec<String> = finishes
        .iter()
        .flat_map(|f| match &f.outcome {
            FinishOutcome::Completed { children, .. } => children.iter().map(|c| c.job.clone()).collect(),
            _ => Vec::new(),
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A child that cannot be enqueued (unknown type, bad payload) would fail
/// the whole completion transaction; instead its parent fails with the
/// reason, and nothing is lost: the parent can be retried once the type
/// exists. `configs` holds the registered types of [`child_types`].
pub fn fail_parents_of_unfit_children(
    finishes: &mut [Finish],
    configs: &std::collections::HashMap<String, crate::types::JobConfig>,
    limits: &EnqueueLimits,
) {
    for f in finishes.iter_mut() {
        let FinishOutcome::Completed { children, .. } = &f.outcome else { continue };
        let problem = children.iter().find_map(|c| {
            let Some(config) = configs.get(&c.job) else {
                return Some(super::Error::UnknownJobType(c.job.clone()).to_string());
            };
            prepare(&EnqueueParams::child(f.id, c.clone()), config, limits).err().map(|e| e.to_string())
        });
        if let Some(problem) = problem {
            f.outcome = FinishOutcome::Failed { error: format!("could not enqueue a child job: {problem}") };
        }
    }
}

/// Takes the superseded results out of a batch: a host whose result writes
/// kept failing while its lease ran out may lease the job again and end up
/// holding both runs' results. Lease tokens only grow, so only the run with
/// a job's newest token can still hold its lease; older runs (and repeats
/// of one run) are duplicates without being written. Returns the runs to
/// write, in input order, and where each input's result will be.
pub fn current_runs(finishes: Vec<Finish>) -> (Vec<Finish>, InputOrder) {
    let mut newest: std::collections::HashMap<i64, i64> = std::collections::HashMap::new();
    for f in &finishes {
        let token = newest.entry(f.id).or_insert(f.lease_token);
        *token = (*token).max(f.lease_token);
    }
    let mut runs = Vec::with_capacity(finishes.len());
    let positions = finishes
        .into_iter()
        .map(|f| {
            if newest.get(&f.id) != Some(&f.lease_token) {
                return None;
            }
            // Taken out, so a repeat of this run is a duplicate.
            newest.remove(&f.id);
            runs.push(f);
            Some(runs.len() - 1)
        })
        .collect();
    (runs, InputOrder(positions))
}

/// Per input of a batch, its index among the runs written, or `None` where
/// [`current_runs`] found it superseded.
pub struct InputOrder(Vec<Option<usize>>);

impl InputOrder {
    /// The results of the runs written, spread back over the inputs.
    pub fn results(&self, written: &[FinishResult]) -> Vec<FinishResult> {
        self.0.iter().map(|p| p.map_or(FinishResult::Duplicate, |i| written[i])).collect()
    }
}

/// The children of the runs among `finishes` whose completion was written.
pub fn children_of_written(finishes: &[Finish], written: &std::collections::HashSet<i64>) -> Vec<EnqueueParams> {
    finishes
        .iter()
        .filter(|f| written.contains(&f.id))
        .flat_map(|f| match &f.outcome {
            FinishOutcome::Completed { children, .. } => {
                children.iter().map(|c| EnqueueParams::child(f.id, c.clone())).collect()
            }
            _ => Vec::new(),
        })
        .collect()
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod prepare_tests {
    use super::*;
    use crate::types::{Backoff, ConcurrencyConfig, JobConfig, OnConflict};
    use serde_json::json;

    fn config() -> JobConfig {
        JobConfig {
            name: "mail".into(),
            queue: "default".into(),
            priority: 3,
            max_attempts: 7,
            backoff: Backoff { base_ms: 1, cap_ms: 2 },
            timeout_ms: 1000,
            memory_limit_bytes: 1 << 20,
            concurrency: Some(ConcurrencyConfig {
                limit: 1,
                key: crate::template::KeyTemplate::parse("acct:{account}").unwrap(),
                duration_secs: 10,
                on_conflict: OnConflict::Block,
            }),
            unique: None,
            schedule: None,
        }
    }

    #[test]
    fn applies_defaults_and_renders_the_key() {
        let prepared =
            prepare(&EnqueueParams::new("mail", json!({"account": 9})), &config(), &EnqueueLimits::default()).unwrap();
        assert_eq!((prepared.queue.as_str(), prepared.priority, prepared.max_attempts), ("default", 3, 7));
        assert_eq!(prepared.concurrency_key.as_deref(), Some("acct:9"));
    }

    #[test]
    fn refuses_payloads_that_are_not_objects() {
        // A double-encoded payload is a string: refused, never stored (guarantee 8).
        let encoded = json!(json!({"account": 9}).to_string());
        let error = prepare(&EnqueueParams::new("mail", encoded), &config(), &EnqueueLimits::default()).unwrap_err();
        assert!(error.to_string().contains("must be a JSON object, got a string"), "{error}");
    }

    #[test]
    fn refuses_a_payload_without_the_key_field() {
        let error = prepare(&EnqueueParams::new("mail", json!({})), &config(), &EnqueueLimits::default()).unwrap_err();
        assert!(error.to_string().contains("account"), "{error}");
    }

    #[test]
    fn refuses_bad_overrides() {
        let bad_queue =
            EnqueueParams { queue: Some("Bad Queue".into()), ..EnqueueParams::new("mail", json!({"account": 1})) };
        assert!(prepare(&bad_queue, &config(), &EnqueueLimits::default()).is_err());
        let both = EnqueueParams {
            run_at: Some(Utc::now()),
            delay_ms: Some(5),
            ..EnqueueParams::new("mail", json!({"account": 1}))
        };
        assert!(prepare(&both, &config(), &EnqueueLimits::default()).is_err());
    }
}

#[cfg(test)]
mod current_runs_tests {
    use super::*;

    fn run(id: i64, lease_token: i64) -> Finish {
        Finish {
            concurrency_key: None,
            id,
            lease_token,
            attempt: 1,
            outcome: FinishOutcome::Failed { error: "x".into() },
            log: serde_json::Value::Null,
            progress: None,
        }
    }

    #[test]
    fn keeps_each_jobs_newest_lease_once_and_spreads_results_back_in_input_order() {
        // Job 1 leased under 10 then 30; job 2 once, its result repeated; job 3 once.
        let (runs, order) = current_runs(vec![run(1, 10), run(2, 20), run(1, 30), run(2, 20), run(3, 5)]);
        let kept: Vec<_> = runs.iter().map(|r| (r.id, r.lease_token)).collect();
        assert_eq!(kept, [(2, 20), (1, 30), (3, 5)]);
        let written = [FinishResult::Done, FinishResult::Done, FinishResult::Duplicate];
        use FinishResult::{Done, Duplicate};
        assert_eq!(order.results(&written), [Duplicate, Done, Done, Duplicate, Duplicate]);
    }
}
