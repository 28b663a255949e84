//! The vocabulary shared by every module: a job type's configuration, what a
//! run is given, and how a run ended. Nothing here names wasmtime or SQL.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::template::KeyTemplate;

/// The longest job or queue name.
const MAX_NAME_LEN: usize = 128;

/// Checks a job or queue name: 1 to 128 characters of `a-z 0-9 _ . -`.
///
/// # Errors
/// Says which rule the name breaks.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!("{name:?} must be 1 to {MAX_NAME_LEN} characters long"));
    }
    if let Some(bad) = name.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '.' | '-')) {
        return Err(format!("{name:?} contains {bad:?}; use only a-z, 0-9, '_', '.' and '-'"));
    }
    Ok(())
}

/// A job type's configuration, as declared by its component's `describe()`
/// with the host's defaults filled in and validated. Stored in the database
/// so every enqueuer applies the same rules without a copy of the component.
/// The largest payload an enqueue accepts when nothing else is set: its
/// JSON text, in bytes. A payload is copied into every run's sandbox and
/// kept in the archive; a job that needs more should carry a reference.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// The largest output a run may return when nothing else is set: its JSON
/// text, in bytes. Like a payload, an output is kept in the archive; a job
/// that makes more should store it elsewhere and return a reference.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1 << 20;

/// The most bytes one run may make its host hold when nothing else is set:
/// its children's payloads, log lines, kept stdout and stderr, and its output.
pub const DEFAULT_RUN_BUDGET_BYTES: usize = 16 << 20;

/// Default bytes of outbound HTTP bodies (sent and received together) one run may move.
pub const DEFAULT_OUTBOUND_BUDGET_BYTES: u64 = 64 << 20;

/// A JSON document kept as its validated text. A guest's output travels as
/// this from the sandbox to the store: parsed into a `Value` it would take
/// many times its size, and clones (a result write is retried) share it.
#[derive(Clone)]
pub struct JsonText(Arc<RawValue>);

impl JsonText {
    /// Validates `text` as one JSON document, keeping it as it is.
    ///
    /// # Errors
    /// The text is not JSON.
    pub fn parse(text: String) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text).map(|raw| JsonText(Arc::from(raw)))
    }

    /// The document's text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.get().len()
    }

    /// True for no text at all, which a valid document never is.
    pub fn is_empty(&self) -> bool {
        self.get().is_empty()
    }

    /// The document parsed, for a reader that needs its fields.
    ///
    /// # Errors
    /// Never for a document made by [`JsonText::parse`].
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(self.get())
    }
}

impl From<&serde_json::Value> for JsonText {
    fn from(value: &serde_json::Value) -> Self {
        // Serialising a `Value` cannot fail (its keys are strings) and
        // produces valid JSON.
        let raw = serde_json::value::to_raw_value(value).expect("a Value serialises to JSON");
        JsonText(Arc::from(raw))
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl std::fmt::Debug for JsonText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

impl std::fmt::Display for JsonText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

impl Serialize for JsonText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RawValue::serialize(&self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(|raw| JsonText(Arc::from(raw)))
    }
}

/// A job type as its component declares it in `describe()`, validated and
/// with the host's defaults filled in: what the queue applies to every job of
/// the type when it enqueues, runs, limits and retries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobConfig {
    /// The job type's name, unique among loaded components.
    pub name: String,
    /// The queue jobs go to unless the enqueuer names one.
    pub queue: String,
    /// Lower runs first.
    pub priority: i16,
    /// Runs allowed before the job fails for good; at least 1.
    pub max_attempts: u32,
    /// The wait between attempts.
    pub backoff: Backoff,
    /// The longest one attempt may run before it is interrupted.
    pub timeout_ms: u64,
    /// The most linear memory one run may use.
    pub memory_limit_bytes: u64,
    /// A fleet-wide limit on concurrent runs per key.
    pub concurrency: Option<ConcurrencyConfig>,
    /// At most one job per rendered key at a time.
    pub unique: Option<UniqueConfig>,
    /// When the fleet enqueues this job by itself.
    #[serde(default, deserialize_with = "schedule_either")]
    pub schedule: Option<ScheduleConfig>,
    /// The origins its runs may send HTTP requests to, as its component
    /// declares them; an operator must grant each too (docs/outbound.md).
    /// Left out of the stored JSON when empty, so a type that declares
    /// none is stored as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outbound: Vec<OutboundRule>,
    /// How many runs of one key may start per period, fleet-wide
    /// (docs/rate-limits.md). Left out of the stored JSON when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitConfig>,
    /// The event keys this type is enqueued for, one job per event and
    /// type (docs/events.md, "Event triggers"). Left out of the stored
    /// JSON when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_events: Vec<String>,
}

impl JobConfig {
    /// The configuration as operators read it (`jobhost inspect`, the
    /// API's job types): every field present, `null` or `[]` where nothing
    /// is declared (docs/cli.md, "JSON output"). The stored form leaves the
    /// newer fields out instead, so hosts of earlier versions read it as
    /// before.
    pub fn document(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(fields) = value.as_object_mut() {
            fields.entry("outbound").or_insert_with(|| serde_json::json!([]));
            fields.entry("rate_limit").or_insert(serde_json::Value::Null);
            fields.entry("on_events").or_insert_with(|| serde_json::json!([]));
        }
        value
    }
}

/// Serializes a configuration as its [`JobConfig::document`].
pub fn serialize_config_document<S: serde::Serializer>(
    config: &Option<JobConfig>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&config.as_ref().map(JobConfig::document), serializer)
}

/// One origin a job type's runs may send HTTP requests to, as declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundRule {
    /// The origin pattern, in its printed form (`https://*.example.com`).
    pub origin: String,
    /// The methods allowed, upper case; empty allows any.
    #[serde(default)]
    pub methods: Vec<String>,
    /// The secrets requests to the origin may carry, by name.
    #[serde(default)]
    pub secrets: Vec<String>,
}

impl JobConfig {
    /// The longest one attempt may run.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// Exponential backoff between attempts, capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// The wait after the first failed attempt.
    pub base_ms: u64,
    /// The longest wait between two attempts.
    pub cap_ms: u64,
}

/// A limit on concurrent runs per key, fleet-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConcurrencyConfig {
    /// Slots per key; at least 1.
    pub limit: u32,
    /// Renders a job's key from its payload; the job name when the component gave none.
    pub key: KeyTemplate,
    /// How long a running holder may go without a heartbeat before it is
    /// presumed dead; already floored at twice the heartbeat interval.
    pub duration_secs: u32,
    /// What an enqueue does when the key has no free slot.
    pub on_conflict: OnConflict,
}

/// At most `limit` starts of one key in any window of `period_ms`,
/// decided by the database's clock. A start is a lease handed to a host, so
/// a retry is a new start; a job that cannot start yet waits without
/// spending an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitConfig {
    /// Starts per period per key; at least 1.
    pub limit: u32,
    /// The window's length in milliseconds.
    pub period_ms: u64,
    /// Renders a job's key from its payload; the job name when the component gave none.
    pub key: KeyTemplate,
}

/// What an enqueue does when its concurrency key has no free slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnConflict {
    /// Block the job until a slot frees.
    Block,
    /// Archive the job as discarded.
    Discard,
    /// Refuse the enqueue with an error.
    Raise,
}

/// At most one job of a type per rendered key at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UniqueConfig {
    /// Renders the uniqueness key from the payload.
    pub key: KeyTemplate,
    /// How long the claim on the key lasts.
    pub strategy: UniqueStrategy,
    /// What a duplicate enqueue does.
    #[serde(default)]
    pub on_duplicate: OnDuplicate,
}

/// How long a uniqueness claim lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UniqueStrategy {
    /// From enqueue until the job has finished.
    UntilExecuted,
    /// Only while the job runs.
    WhileExecuting,
}

/// What an enqueue does when its uniqueness key is claimed already.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDuplicate {
    /// Store nothing and answer with the claiming job's id.
    #[default]
    Skip,
    /// Replace a waiting claimant's payload and run time; skip a running one.
    Replace,
    /// Refuse the enqueue with an error.
    Raise,
}

/// A recurring enqueue of a job type, decided by the fleet's database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleConfig {
    /// A cron expression: five fields, or six with seconds first; checked.
    pub cron: String,
    /// The IANA time zone the expression is read in; checked.
    pub time_zone: String,
    /// Each job's payload, a JSON object, before the host adds `_tick`.
    pub payload: serde_json::Map<String, serde_json::Value>,
    /// How many missed ticks a host that starts after an outage enqueues.
    pub backfill: u32,
}

impl ScheduleConfig {
    /// A schedule with the defaults: UTC, an empty payload, one catch-up tick.
    pub fn new(cron: &str) -> Self {
        ScheduleConfig { cron: cron.to_string(), time_zone: "UTC".into(), payload: serde_json::Map::new(), backfill: 1 }
    }
}

/// Reads a stored schedule in either form: an object, or the bare cron
/// string hosts before WIT 0.2.0 registered (UTC, the defaults).
fn schedule_either<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<ScheduleConfig>, D::Error> {
    // Through a Value, not an untagged enum: serde's buffering loses numbers
    // under serde_json's arbitrary_precision.
    match Option::<serde_json::Value>::deserialize(deserializer)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(cron)) => Ok(Some(ScheduleConfig::new(&cron))),
        Some(value) => serde_json::from_value(value).map(Some).map_err(serde::de::Error::custom),
    }
}

/// What a run is told about its job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobContext {
    /// The job's id, stable across attempts.
    pub job_id: u64,
    /// 1-based; snoozes do not count.
    pub attempt: u32,
    /// The queue the job was taken from.
    pub queue: String,
    /// Milliseconds since the Unix epoch.
    pub enqueued_at_ms: u64,
    /// The batch the job belongs to.
    pub batch_id: Option<u64>,
    /// The rendered concurrency key, for a limited job type.
    pub concurrency_key: Option<String>,
    /// The run's own W3C trace context, when the host exports traces: its
    /// outbound requests carry it, so the services they call join the run's
    /// trace. Not given to the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// An event a running job sends (WIT `events.send`), held back like a
/// child until that job completes, and sent in its completion's
/// transaction: a failed or lost run sends nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildEvent {
    /// The event's key.
    pub key: String,
    /// The event's payload, a JSON object.
    pub payload: serde_json::Value,
}

/// A job enqueued by a running job, held back until that job completes so a
/// failed or lost run leaves no orphan (guarantee 9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildJob {
    /// The child's job type.
    pub job: String,
    /// The child's payload, already parsed: stored as a document, never as text.
    pub payload: serde_json::Value,
    /// Overrides the job type's queue.
    pub queue: Option<String>,
    /// Overrides the job type's priority.
    pub priority: Option<i16>,
    /// Delays the child's first run past the parent's completion.
    pub delay_ms: Option<u64>,
    /// The batch it joins as a member, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<ChildBatch>,
}

/// The batch a child joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildBatch {
    /// The batch its parent is a member of.
    Parent,
    /// The batch its parent's run opened with this number (0 for the first).
    Opened(u32),
}

/// The longest batch label, in bytes, however the batch is created.
pub const MAX_BATCH_LABEL_BYTES: usize = 256;

/// A batch a running job opens, created with the job's completion, closed,
/// with the children the run added to it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchRequest {
    /// A name for people.
    pub label: Option<String>,
    /// The job type enqueued when it finishes.
    pub on_finish: Option<String>,
    /// The job type enqueued when it finishes with nothing failed or discarded.
    pub on_success: Option<String>,
    /// The job type enqueued when it finishes with a member failed or discarded.
    pub on_failure: Option<String>,
    /// What each callback's payload starts from: a JSON object.
    pub callback_payload: serde_json::Value,
}

/// A workflow a running job opens, created with the job's completion with
/// the steps the run added to it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkflowRequest {
    /// A name for people.
    pub label: Option<String>,
}

/// The workflow a step a running job adds goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepTarget {
    /// The workflow the job is a step of: the step grows it (stored as
    /// `STEP/NAME`, after the job's step, before the job's dependents).
    Current,
    /// The workflow the run opened with this number (0 for the first).
    Opened(u32),
}

/// A step a running job adds, held for its completion. Its name and its
/// `after` are as the run gave them: the names of steps it added before
/// to the same workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRequest {
    /// Where it goes.
    pub target: StepTarget,
    /// The step.
    pub step: crate::step::NewStep,
}

/// The workflows a run opened and the steps it added, written with its completion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkflowEffects {
    /// Workflows opened, by number.
    pub opened: Vec<WorkflowRequest>,
    /// Steps added, in the order the run added them.
    pub steps: Vec<StepRequest>,
}

impl WorkflowEffects {
    /// True when the run opened no workflow and added no step.
    pub fn is_empty(&self) -> bool {
        self.opened.is_empty() && self.steps.is_empty()
    }
}

/// How one run of a job ended, from the sandbox's point of view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RunOutcome {
    /// The guest returned success, with an optional JSON output.
    Completed {
        /// The guest's output, validated, as the guest wrote it.
        output: Option<JsonText>,
    },
    /// The guest asked to be retried after its backoff.
    Retry {
        /// The guest's reason, kept with the attempt.
        reason: String,
    },
    /// The guest asked to fail without further attempts.
    Failed {
        /// The guest's reason.
        reason: String,
    },
    /// The guest asked to run again later without spending an attempt.
    Snooze {
        /// How long to wait.
        seconds: u32,
    },
    /// The service the guest called said "slow down": the job runs again
    /// later without spending an attempt, and its key starts nothing until then.
    Throttled {
        /// How long the key waits, in milliseconds.
        retry_after_ms: u64,
    },
    /// The run did not end on its own terms; a retryable failure.
    Crashed {
        /// What happened.
        crash: Crash,
    },
}

impl RunOutcome {
    /// How the run ended, in a word, for logs and the `outcome` label of
    /// `jobhost_runs_total`, in the words the dashboard, the CLI and the
    /// traces use (`retried`, `snoozed`): never the output or a reason,
    /// which a guest makes as large as it likes.
    pub fn kind(&self) -> &'static str {
        match self {
            RunOutcome::Completed { .. } => "completed",
            RunOutcome::Retry { .. } => "retried",
            RunOutcome::Failed { .. } => "failed",
            RunOutcome::Snooze { .. } => "snoozed",
            RunOutcome::Throttled { .. } => "throttled",
            RunOutcome::Crashed { crash: Crash::Interrupted { .. } } => "interrupted",
            RunOutcome::Crashed { .. } => "crashed",
        }
    }

    /// True only for a successful run.
    pub fn is_completed(&self) -> bool {
        matches!(self, RunOutcome::Completed { .. })
    }
}

/// A run that the host had to end, or that broke its contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Crash {
    /// The run passed its timeout and was interrupted.
    #[error("timed out after {limit_ms} ms")]
    Timeout {
        /// The timeout it passed.
        limit_ms: u64,
    },
    /// The run tried to grow its memory past its cap.
    #[error("exceeded its memory limit of {limit_bytes} bytes")]
    MemoryExceeded {
        /// The cap it hit.
        limit_bytes: u64,
    },
    /// The guest trapped (a panic, an out-of-bounds access, `unreachable`).
    #[error("trapped: {message}")]
    Trap {
        /// The trap, followed by the tail of the guest's stderr (a panic message).
        message: String,
    },
    /// The host stopped the run: shutdown, or a lease it could not renew.
    #[error("interrupted: {reason}")]
    Interrupted {
        /// Why the host stopped it.
        reason: String,
    },
    /// The guest returned something that breaks the contract (output that is not JSON).
    #[error("broke the contract: {message}")]
    InvalidResult {
        /// What was wrong.
        message: String,
    },
    /// The guest returned an output larger than the host accepts. Not
    /// retried: the same run would return the same output.
    #[error("output is {bytes} bytes, more than the limit of {limit_bytes} bytes")]
    OutputTooLarge {
        /// The output's size.
        bytes: u64,
        /// The host's limit.
        limit_bytes: u64,
    },
    /// The guest returned an output larger than what its earlier host calls
    /// left of the run's byte budget. Not retried, for the same reason.
    #[error(
        "output is {bytes} bytes, more than the {left_bytes} bytes left of the run's budget of {budget_bytes} bytes"
    )]
    OverBudget {
        /// The output's size.
        bytes: u64,
        /// What was left of the budget.
        left_bytes: u64,
        /// The run's whole budget.
        budget_bytes: u64,
    },
}

impl Crash {
    /// True when running the job again would end the same way, so its
    /// attempts are not spent on it: a contract the output itself breaks.
    pub fn is_deterministic(&self) -> bool {
        matches!(self, Crash::OutputTooLarge { .. } | Crash::OverBudget { .. })
    }
}

/// One line a guest wrote through the `log` import.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: LogLevel,
    /// The text, truncated to the log's bound.
    pub message: String,
}

/// The severity of a guest's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Finest detail.
    Trace,
    /// Diagnostic detail.
    Debug,
    /// Normal progress.
    Info,
    /// Something unexpected that the run survived.
    Warn,
    /// Something failed.
    Error,
}

impl std::fmt::Display for LogLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        })
    }
}

/// Everything a run produced besides its outcome.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunEffects {
    /// Lines from the `log` import, bounded.
    pub logs: Vec<LogLine>,
    /// The guest's stdout, bounded.
    pub stdout: String,
    /// The guest's stderr, bounded.
    pub stderr: String,
    /// True when any of the above was cut short at its bound.
    pub truncated: bool,
    /// The latest `progress(done, total)` the guest reported.
    pub progress: Option<(u64, u64)>,
    /// Jobs the guest enqueued, to be written with this job's completion.
    pub children: Vec<ChildJob>,
    /// Batches the guest opened, to be created with this job's completion.
    pub batches: Vec<BatchRequest>,
    /// Workflows the guest opened and steps it added, written with this job's completion.
    #[serde(default)]
    pub workflows: WorkflowEffects,
    /// Events the guest sent, written with this job's completion.
    #[serde(default)]
    pub events: Vec<ChildEvent>,
    /// Changes the guest made to keyed schedules, written with this job's completion.
    #[serde(default)]
    pub schedules: Vec<crate::schedule_spec::ScheduleChange>,
    /// How many times the guest called `heartbeat`.
    pub heartbeats: u32,
    /// The run's outbound HTTP requests, the last 100, oldest first.
    #[serde(default)]
    pub outbound: Vec<OutboundCall>,
}

/// One outbound request of a run, as the host saw it. Never a query
/// string, a header or a body: those may carry what the job's log must not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundCall {
    /// The method.
    pub method: String,
    /// The origin (`https://api.mailgun.net`).
    pub origin: String,
    /// The path, without its query.
    pub path: String,
    /// The declared rule it matched, or `undeclared`: the metrics' label,
    /// bounded by the rules a component may declare.
    pub rule: String,
    /// The response's status, when one came.
    pub status: Option<u16>,
    /// Why it failed or was refused, when it did.
    pub error: Option<String>,
    /// Bytes of request body sent.
    #[serde(default)]
    pub request_bytes: u64,
    /// Bytes of response body the guest read.
    pub response_bytes: u64,
    /// Milliseconds until the response's head, or the failure.
    pub ms: u64,
}

impl OutboundCall {
    /// One line for the job's log.
    pub fn describe(&self) -> String {
        let result = match (&self.status, &self.error) {
            (Some(status), None) => format!("{status}, {} bytes", self.response_bytes),
            (Some(status), Some(error)) => format!("{status}, {} bytes, then {error}", self.response_bytes),
            (None, Some(error)) => error.clone(),
            (None, None) => "no answer".to_string(),
        };
        format!("outbound {} {}{}: {result} in {} ms", self.method, self.origin, self.path, self.ms)
    }
}

/// `text` cut to its first `max_bytes` bytes (on a character boundary),
/// saying how much was cut: for a reason a guest gave, whose start says
/// what went wrong.
pub fn head(text: String, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes cut]", &text[..end], text.len() - end)
}

/// The last `max_bytes` of `text` (or less, to start on a character).
/// Logs keep their end: that is where a panic message or the last error is.
pub fn tail(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut start = text.len() - max_bytes;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The result of running one attempt of a job in a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// How the run ended.
    #[serde(flatten)]
    pub outcome: RunOutcome,
    /// What it produced along the way.
    pub effects: RunEffects,
    /// Wall time from entering the sandbox to leaving it.
    pub elapsed_us: u64,
    /// Of that, the time to instantiate the component (none when it did not
    /// instantiate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instantiate_us: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end_on_a_character_boundary() {
        assert_eq!(tail("hello", 10), "hello");
        assert_eq!(tail("hello", 3), "llo");
        assert_eq!(tail("aé", 1), "");
        assert_eq!(tail("aéb", 2), "b");
    }

    #[test]
    fn names_follow_the_rules() {
        assert!(check_name("send-mail.v2_x").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("Send").is_err());
        assert!(check_name(&"x".repeat(129)).is_err());
    }
}
