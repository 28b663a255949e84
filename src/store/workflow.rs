//! Workflows: named steps, each an ordinary job once released, with
//! dependencies between them. A step waits (no job yet) until every step it
//! depends on has ended, and is then released exactly once, in the
//! transaction that ends its last dependency, whichever path ends it
//! (guarantee 14): enqueued through the gate with its dependencies' outputs
//! under `_deps`, or ended as cancelled or failed when a dependency did not
//! complete and its policy says so.
//!
//! The vocabulary, and the rules decided once for both backends: what a new
//! workflow may be (names, dependencies, no cycle, a bounded size), and how
//! a released step is decided and what its payload carries. PostgreSQL
//! applies the same decision in `jobhost.workflow_release`
//! (src/store/postgres/functions/workflow_release.sql); the tests hold both to it.

use std::collections::{BTreeMap, HashMap, VecDeque};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::enqueue::{Configs, EnqueueLimits, prepare_registered};
use super::job::EnqueueParams;
use super::{Error, Result};
pub use crate::step::{
    DEPS_FAILED_KEY, DEPS_KEY, Dependency, EVENT_KEY, IfFailed, MAX_STEP_NAME_BYTES, MAX_WORKFLOW_LABEL_BYTES,
    MAX_WORKFLOW_STEPS, NewStep, check_step_name,
};

/// A workflow to create: its steps, in any order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewWorkflow {
    /// A name for people; not unique.
    #[serde(default)]
    pub label: Option<String>,
    /// Its steps.
    pub steps: Vec<NewStep>,
}

impl IfFailed {
    /// Reads a stored name.
    pub fn decode(text: &str) -> Result<IfFailed> {
        match text {
            "cancel" => Ok(IfFailed::Cancel),
            "run" => Ok(IfFailed::Run),
            "fail" => Ok(IfFailed::Fail),
            other => Err(Error::Decode(format!("unknown dependency policy {other:?}"))),
        }
    }
}

/// A new workflow, checked: its steps in dependency order (every step after
/// the steps it waits for), each a job an enqueue would accept.
#[derive(Debug, Clone)]
pub struct PreparedWorkflow {
    /// Its label.
    pub label: Option<String>,
    /// Its steps, dependencies first.
    pub steps: Vec<PreparedStep>,
}

/// One checked step.
#[derive(Debug, Clone)]
pub struct PreparedStep {
    /// Its name.
    pub name: String,
    /// Its job type.
    pub job: String,
    /// Its payload object.
    pub payload: serde_json::Value,
    /// Its queue, if overridden.
    pub queue: Option<String>,
    /// Its priority, if overridden.
    pub priority: Option<i16>,
    /// Its delay after release.
    pub delay_ms: i64,
    /// The steps it waits for, as indexes into [`PreparedWorkflow::steps`]
    /// (always earlier), each with its policy.
    pub after: Vec<(usize, IfFailed)>,
    /// What it waits for besides them.
    pub wait: Option<super::wait::PreparedWait>,
}

/// Checks a new workflow against the registered types and orders its
/// steps, dependencies first.
///
/// # Errors
/// [`Error::InvalidWorkflow`] for no steps or too many, a bad or repeated
/// name, a dependency on an unknown step or on itself, or a cycle (named);
/// what an enqueue of a step refuses (an unknown type, a payload that is not
/// an object or is too large, a bad queue, a key that does not render), or
/// a payload that already has `_deps`. Nothing is stored.
pub fn prepare(workflow: &NewWorkflow, configs: &Configs, limits: &EnqueueLimits) -> Result<PreparedWorkflow> {
    prepare_steps(workflow, configs, limits, false)
}

/// [`prepare`] for the steps a run adds to its own workflow: each waits
/// for the run's step too, so a wait's match may name its output.
///
/// # Errors
/// As [`prepare`].
pub fn prepare_grown(steps: &NewWorkflow, configs: &Configs, limits: &EnqueueLimits) -> Result<PreparedWorkflow> {
    prepare_steps(steps, configs, limits, true)
}

fn prepare_steps(
    workflow: &NewWorkflow,
    configs: &Configs,
    limits: &EnqueueLimits,
    grown: bool,
) -> Result<PreparedWorkflow> {
    let invalid = |reason: String| Err(Error::InvalidWorkflow(reason));
    let steps = &workflow.steps;
    if steps.is_empty() {
        return invalid("a workflow needs at least one step".into());
    }
    if steps.len() > MAX_WORKFLOW_STEPS {
        return invalid(format!("{} steps, more than the most a workflow has, {MAX_WORKFLOW_STEPS}", steps.len()));
    }
    if workflow.label.as_ref().is_some_and(|l| l.len() > MAX_WORKFLOW_LABEL_BYTES) {
        return invalid(format!("a workflow's label is at most {MAX_WORKFLOW_LABEL_BYTES} bytes"));
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        check_step_name(&step.name).map_err(Error::InvalidWorkflow)?;
        if index.insert(&step.name, i).is_some() {
            return invalid(format!("two steps are named {:?}", step.name));
        }
    }
    let mut after: Vec<Vec<(usize, IfFailed)>> = Vec::with_capacity(steps.len());
    for step in steps {
        let mut deps: Vec<(usize, IfFailed)> = Vec::with_capacity(step.after.len());
        for dep in &step.after {
            let Some(&d) = index.get(dep.step.as_str()) else {
                return invalid(format!("step {:?} waits for {:?}, which is not a step of it", step.name, dep.step));
            };
            if dep.step == step.name {
                return invalid(format!("step {:?} waits for itself", step.name));
            }
            if deps.iter().any(|(seen, _)| *seen == d) {
                return invalid(format!("step {:?} names {:?} twice", step.name, dep.step));
            }
            deps.push((d, dep.if_failed.or(step.if_failed).unwrap_or_default()));
        }
        after.push(deps);
    }
    let order = dependency_order(&after).map_err(|stuck| {
        Error::InvalidWorkflow(format!(
            "its steps wait for each other in a cycle: {}",
            cycle_names(steps, &after, stuck)
        ))
    })?;
    let mut position = vec![0; steps.len()];
    for (at, &i) in order.iter().enumerate() {
        position[i] = at;
    }
    let mut prepared = Vec::with_capacity(steps.len());
    for &i in &order {
        let step = &steps[i];
        if [DEPS_KEY, DEPS_FAILED_KEY, EVENT_KEY].iter().any(|key| step.payload.get(key).is_some()) {
            return invalid(format!(
                "step {:?}: its payload has {DEPS_KEY:?}, {DEPS_FAILED_KEY:?} or {EVENT_KEY:?}, which its release writes",
                step.name
            ));
        }
        let wait = step
            .wait
            .as_ref()
            .map(|wait| super::wait::prepare(wait, &step.payload, grown || !step.after.is_empty()))
            .transpose()
            .map_err(|reason| Error::InvalidWorkflow(format!("step {:?}: its wait: {reason}", step.name)))?;
        let params = EnqueueParams {
            queue: step.queue.clone(),
            priority: step.priority,
            delay_ms: step.delay_ms,
            ..EnqueueParams::new(step.job.clone(), step.payload.clone())
        };
        let job = prepare_registered(params, configs, limits)
            .map_err(|error| Error::InvalidWorkflow(format!("step {:?}: {error}", step.name)))?;
        prepared.push(PreparedStep {
            name: step.name.clone(),
            job: job.job,
            payload: job.payload,
            queue: step.queue.clone(),
            priority: step.priority,
            delay_ms: job.delay_ms,
            after: after[i].iter().map(|&(d, policy)| (position[d], policy)).collect(),
            wait,
        });
    }
    Ok(PreparedWorkflow { label: workflow.label.clone(), steps: prepared })
}

/// The steps in an order where each comes after every step it waits for,
/// keeping the given order where the dependencies allow (Kahn's algorithm);
/// on a cycle, a step on or behind it.
fn dependency_order(after: &[Vec<(usize, IfFailed)>]) -> std::result::Result<Vec<usize>, usize> {
    let mut waiting: Vec<usize> = after.iter().map(Vec::len).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); after.len()];
    for (step, deps) in after.iter().enumerate() {
        for &(dep, _) in deps {
            dependents[dep].push(step);
        }
    }
    let mut ready: VecDeque<usize> = (0..after.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(after.len());
    while let Some(step) = ready.pop_front() {
        order.push(step);
        for &dependent in &dependents[step] {
            waiting[dependent] -= 1;
            if waiting[dependent] == 0 {
                ready.push_back(dependent);
            }
        }
    }
    match waiting.iter().position(|&w| w > 0) {
        Some(stuck) => Err(stuck),
        None => Ok(order),
    }
}

/// Steps as read back (by id), put in dependency order: steps a run added
/// to its workflow come after the steps that wait for them in id order.
/// Keeps the given order where the dependencies allow.
pub fn in_dependency_order(steps: Vec<WorkflowStep>) -> Vec<WorkflowStep> {
    let index: HashMap<&str, usize> = steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let after: Vec<Vec<(usize, IfFailed)>> = steps
        .iter()
        .map(|s| s.after.iter().filter_map(|d| index.get(d.step.as_str()).map(|&i| (i, d.if_failed))).collect())
        .collect();
    let Ok(order) = dependency_order(&after) else {
        return steps;
    };
    let mut slots: Vec<Option<WorkflowStep>> = steps.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// The names around a cycle, found by following unfinished dependencies
/// from `stuck` until one repeats: `a → b → a`.
fn cycle_names(steps: &[NewStep], after: &[Vec<(usize, IfFailed)>], stuck: usize) -> String {
    let waits = never_ready(after);
    let mut seen: Vec<usize> = Vec::new();
    let mut at = stuck;
    while !seen.contains(&at) {
        seen.push(at);
        at = after[at].iter().map(|&(d, _)| d).find(|&d| waits[d]).unwrap_or(at);
    }
    let start = seen.iter().position(|&s| s == at).unwrap_or(0);
    let mut names: Vec<&str> = seen[start..].iter().map(|&i| steps[i].name.as_str()).collect();
    names.push(&steps[at].name);
    names.join(" → ")
}

/// Which steps never become ready (on or behind a cycle).
fn never_ready(after: &[Vec<(usize, IfFailed)>]) -> Vec<bool> {
    let mut done = vec![false; after.len()];
    loop {
        let mut changed = false;
        for (step, deps) in after.iter().enumerate() {
            if !done[step] && deps.iter().all(|&(d, _)| done[d]) {
                done[step] = true;
                changed = true;
            }
        }
        if !changed {
            return done.iter().map(|d| !d).collect();
        }
    }
}

/// How one dependency of a step being released ended.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedDependency {
    /// Its name.
    pub name: String,
    /// `completed`, `failed`, `discarded` or `cancelled`.
    pub state: String,
    /// Its output when completed; else its last error (a JSON string) or null.
    pub result: serde_json::Value,
    /// The dependent's policy for it.
    pub if_failed: IfFailed,
}

impl EndedDependency {
    fn completed(&self) -> bool {
        self.state == "completed"
    }

    /// "dependency "b" failed: why", for the dependent's error.
    fn reason(&self) -> String {
        let how = match self.state.as_str() {
            "failed" => "failed",
            "discarded" => "was discarded",
            _ => "was cancelled",
        };
        match &self.result {
            serde_json::Value::Null => format!("dependency {:?} {how}", self.name),
            serde_json::Value::String(why) => format!("dependency {:?} {how}: {why}", self.name),
            other => format!("dependency {:?} {how}: {other}", self.name),
        }
    }
}

/// What a released step becomes.
#[derive(Debug, Clone, PartialEq)]
pub enum Release {
    /// It is enqueued with this payload.
    Run(serde_json::Value),
    /// It ends as cancelled, for this reason.
    Cancel(String),
    /// It ends as failed, for this reason.
    Fail(String),
}

/// Decides a step whose dependencies have all ended (listed in dependency
/// order): any that did not complete under `fail` fails it; else any under
/// `cancel`, or its workflow being cancelled, cancels it; else it runs with
/// `_deps` (each output, or `{"state", "error"}` for one that did not
/// complete) and `_deps_failed` (those names) when some did not complete.
pub fn release(payload: &serde_json::Value, deps: &[EndedDependency], workflow_cancelled: bool) -> Release {
    let unmet = |policy: IfFailed| -> Vec<&EndedDependency> {
        deps.iter().filter(|d| !d.completed() && d.if_failed == policy).collect()
    };
    let joined = |ds: Vec<&EndedDependency>| ds.iter().map(|d| d.reason()).collect::<Vec<_>>().join("; ");
    if workflow_cancelled {
        return Release::Cancel("its workflow was cancelled".into());
    }
    let failing = unmet(IfFailed::Fail);
    if !failing.is_empty() {
        return Release::Fail(joined(failing));
    }
    let cancelling = unmet(IfFailed::Cancel);
    if !cancelling.is_empty() {
        return Release::Cancel(joined(cancelling));
    }
    let mut payload = payload.clone();
    if let (Some(object), false) = (payload.as_object_mut(), deps.is_empty()) {
        let outputs: serde_json::Map<String, serde_json::Value> = deps
            .iter()
            .map(|d| {
                let value = if d.completed() {
                    d.result.clone()
                } else {
                    serde_json::json!({ "state": d.state, "error": d.result })
                };
                (d.name.clone(), value)
            })
            .collect();
        object.insert(DEPS_KEY.into(), outputs.into());
        let failed: Vec<&str> = deps.iter().filter(|d| !d.completed()).map(|d| d.name.as_str()).collect();
        if !failed.is_empty() {
            object.insert(DEPS_FAILED_KEY.into(), serde_json::json!(failed));
        }
    }
    Release::Run(payload)
}

/// How a released step's wait ended, for its release.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedWait {
    /// The event key it waited for; none for a sleep.
    pub key: Option<String>,
    /// How it ended.
    pub ended_by: super::wait::WaitEnd,
    /// What a timeout does.
    pub on_timeout: IfFailed,
    /// The payload of the event that ended it.
    pub event: Option<serde_json::Value>,
}

/// Applies a step's ended wait to what its dependencies decided (PostgreSQL
/// applies the same in `jobhost.workflow_release`): a step that runs gets
/// its event's payload under `_event`; a timed-out event wait fails or
/// cancels it by `on_timeout` (or lets it run, with no `_event`). What its
/// dependencies or a cancelled workflow decided stands.
pub fn apply(release: Release, wait: &EndedWait) -> Release {
    let Release::Run(mut payload) = release else {
        return release;
    };
    match wait.ended_by {
        super::wait::WaitEnd::Event => {
            if let (Some(object), Some(event)) = (payload.as_object_mut(), &wait.event) {
                object.insert(EVENT_KEY.into(), event.clone());
            }
            Release::Run(payload)
        }
        super::wait::WaitEnd::Timeout => {
            let reason = format!("its wait for event \"{}\" timed out", wait.key.as_deref().unwrap_or_default());
            match wait.on_timeout {
                IfFailed::Run => Release::Run(payload),
                IfFailed::Fail => Release::Fail(reason),
                IfFailed::Cancel => Release::Cancel(reason),
            }
        }
        super::wait::WaitEnd::Unmatched => Release::Fail(unmatched_reason(wait.key.as_deref().unwrap_or_default())),
        super::wait::WaitEnd::Time | super::wait::WaitEnd::Skipped => Release::Run(payload),
    }
}

/// Why a step whose match could not be rendered when its wait was armed
/// fails (PostgreSQL's `jobhost.workflow_release` says the same).
pub fn unmatched_reason(key: &str) -> String {
    format!(
        "its wait for event \"{key}\" could not render its match: a field it names is in neither its payload nor its \
         dependencies' outputs"
    )
}

/// Why an ended step did not complete, from its stored result.
pub fn step_error(ended_state: Option<&str>, result: Option<serde_json::Value>) -> Option<String> {
    match (ended_state, result) {
        (Some("completed") | None, _) | (_, None | Some(serde_json::Value::Null)) => None,
        (_, Some(serde_json::Value::String(why))) => Some(why),
        (_, Some(other)) => Some(other.to_string()),
    }
}

/// Where a step is: waiting for its dependencies, or its job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Not released: a dependency has not ended.
    Waiting,
    /// Released, due later (its delay, or a retry's backoff).
    Scheduled,
    /// Released and ready to run.
    Available,
    /// Released and parked at its concurrency limit.
    Blocked,
    /// Running on a host.
    Running,
    /// Ended successfully.
    Completed,
    /// Failed after its last attempt, or by its policy.
    Failed,
    /// Discarded by its limit (or a duplicate of a unique job).
    Discarded,
    /// Cancelled, by an operator or by its policy.
    Cancelled,
}

impl StepState {
    /// The name the CLI and JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Waiting => "waiting",
            StepState::Scheduled => "scheduled",
            StepState::Available => "available",
            StepState::Blocked => "blocked",
            StepState::Running => "running",
            StepState::Completed => "completed",
            StepState::Failed => "failed",
            StepState::Discarded => "discarded",
            StepState::Cancelled => "cancelled",
        }
    }

    /// Reads a stored state.
    pub fn decode(text: &str) -> Result<StepState> {
        Ok(match text {
            "waiting" => StepState::Waiting,
            "scheduled" => StepState::Scheduled,
            "available" => StepState::Available,
            "blocked" => StepState::Blocked,
            "running" => StepState::Running,
            "completed" => StepState::Completed,
            "failed" => StepState::Failed,
            "discarded" => StepState::Discarded,
            "cancelled" => StepState::Cancelled,
            other => return Err(Error::Decode(format!("unknown step state {other:?}"))),
        })
    }

    /// Whether it has ended.
    pub fn is_final(self) -> bool {
        self >= StepState::Completed
    }
}

/// Where a workflow is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    /// A step has not ended.
    Running,
    /// Every step completed.
    Succeeded,
    /// Every step ended, and some did not complete.
    Failed,
    /// An operator cancelled it (its running steps may still be ending).
    Cancelled,
}

impl WorkflowState {
    /// The name the CLI and JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowState::Running => "running",
            WorkflowState::Succeeded => "succeeded",
            WorkflowState::Failed => "failed",
            WorkflowState::Cancelled => "cancelled",
        }
    }
}

/// A workflow's steps by where they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WorkflowCounts {
    /// Every step.
    pub total: i64,
    /// Steps by state, only the states some step is in.
    pub by_state: BTreeMap<String, i64>,
}

impl WorkflowCounts {
    /// Steps that have ended.
    pub fn ended(&self) -> i64 {
        self.count_where(StepState::is_final)
    }

    /// Steps that ended without completing.
    pub fn unsuccessful(&self) -> i64 {
        self.count_where(|s| s.is_final() && s != StepState::Completed)
    }

    fn count_where(&self, wanted: impl Fn(StepState) -> bool) -> i64 {
        self.by_state.iter().filter(|(state, _)| StepState::decode(state).is_ok_and(&wanted)).map(|(_, n)| n).sum()
    }
}

/// One step as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowStep {
    /// Its name.
    pub name: String,
    /// Its job type.
    pub job: String,
    /// The job it became, once released.
    pub job_id: Option<i64>,
    /// Where it is.
    pub state: StepState,
    /// The steps it waits for, with their policies.
    pub after: Vec<StepDependency>,
    /// Why it did not complete (its last error, or its policy's reason).
    pub error: Option<String>,
    /// When it ended.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub ended_at: Option<DateTime<Utc>>,
    /// What it waits for besides its dependencies, if anything.
    pub wait: Option<super::wait::StepWait>,
}

/// A dependency as shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepDependency {
    /// The step waited for.
    pub step: String,
    /// The policy if it does not complete.
    pub if_failed: IfFailed,
}

/// One workflow as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workflow {
    /// Its id.
    pub id: i64,
    /// Its label.
    pub label: Option<String>,
    /// Running, or how it ended.
    pub state: WorkflowState,
    /// Its steps by state.
    pub counts: WorkflowCounts,
    /// When it was created.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub created_at: DateTime<Utc>,
    /// When it was cancelled.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub cancelled_at: Option<DateTime<Utc>>,
    /// When its last step ended.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Its steps in dependency order (empty in listings).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<WorkflowStep>,
}

impl Workflow {
    /// The state its cancel time and step counts say it is in.
    pub fn state_of(cancelled: bool, counts: &WorkflowCounts) -> WorkflowState {
        if cancelled {
            WorkflowState::Cancelled
        } else if counts.ended() < counts.total {
            WorkflowState::Running
        } else if counts.unsuccessful() == 0 {
            WorkflowState::Succeeded
        } else {
            WorkflowState::Failed
        }
    }
}

/// A workflow's stored columns and its steps' counts, as a backend reads
/// them: [`Workflow::from`] derives the rest.
#[derive(Debug)]
pub struct StoredWorkflow {
    /// Its id.
    pub id: i64,
    /// Its label.
    pub label: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was cancelled.
    pub cancelled_at: Option<DateTime<Utc>>,
    /// The latest end of a step.
    pub last_ended_at: Option<DateTime<Utc>>,
    /// Steps by state.
    pub counts: WorkflowCounts,
}

impl From<StoredWorkflow> for Workflow {
    fn from(stored: StoredWorkflow) -> Workflow {
        let ended = stored.counts.ended() >= stored.counts.total;
        Workflow {
            id: stored.id,
            label: stored.label,
            state: Workflow::state_of(stored.cancelled_at.is_some(), &stored.counts),
            created_at: stored.created_at,
            cancelled_at: stored.cancelled_at,
            finished_at: if ended { stored.last_ended_at } else { None },
            counts: stored.counts,
            steps: Vec::new(),
        }
    }
}

/// A new workflow as created: its id and the jobs its first steps became.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CreatedWorkflow {
    /// Its id.
    pub id: i64,
    /// Each step released at once (those waiting for nothing), with its job.
    pub released: BTreeMap<String, i64>,
}

/// What cancelling a workflow did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WorkflowCancel {
    /// Steps that were waiting and are now cancelled.
    pub waiting_cancelled: usize,
    /// Released jobs cancelled before they ran.
    pub jobs_cancelled: usize,
    /// Running jobs whose hosts were asked to stop them.
    pub cancel_requested: usize,
}

/// What a workflow's cancel did, as the audit trail records it: the
/// waiting steps it ended and the live jobs it goes on to cancel (each a
/// cancel of its own), or `absent`.
pub fn cancel_outcome(waiting: i64, live: Option<&[i64]>) -> String {
    match live {
        Some(live) => format!("cancelled: {waiting} waiting steps ended, {} jobs to cancel", live.len()),
        None => "absent".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Backoff, JobConfig};
    use serde_json::json;

    fn configs() -> Configs {
        let config = |name: &str| JobConfig {
            name: name.into(),
            queue: "default".into(),
            priority: 0,
            max_attempts: 3,
            backoff: Backoff { base_ms: 1, cap_ms: 2 },
            timeout_ms: 1000,
            memory_limit_bytes: 1 << 20,
            concurrency: None,
            unique: None,
            schedule: None,
            outbound: Vec::new(),
            rate_limit: None,
            on_events: Vec::new(),
        };
        ["a", "b"].iter().map(|n| (n.to_string(), config(n))).collect()
    }

    fn workflow(steps: serde_json::Value) -> NewWorkflow {
        serde_json::from_value(json!({ "steps": steps })).unwrap()
    }

    fn refusal(steps: serde_json::Value) -> String {
        match prepare(&workflow(steps), &configs(), &EnqueueLimits::default()) {
            Err(Error::InvalidWorkflow(reason)) => reason,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn grown_steps_read_back_by_id_are_shown_before_the_steps_waiting_for_them() {
        let shown = |name: &str, after: &[&str]| WorkflowStep {
            name: name.into(),
            job: "a".into(),
            job_id: None,
            state: StepState::Waiting,
            after: after.iter().map(|d| StepDependency { step: d.to_string(), if_failed: IfFailed::Cancel }).collect(),
            error: None,
            ended_at: None,
            wait: None,
        };
        // By id: `s` grew `s/x` and `s/y` after `d`, which waits for them, was stored.
        let by_id = vec![shown("s", &[]), shown("d", &["s", "s/x", "s/y"]), shown("s/x", &["s"]), shown("s/y", &["s"])];
        let names: Vec<String> = in_dependency_order(by_id).into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["s", "s/x", "s/y", "d"]);
    }

    #[test]
    fn steps_come_out_after_their_dependencies_with_their_policies() {
        let wf = workflow(json!([
            {"name": "d", "job": "a", "after": ["b", {"step": "c", "if_failed": "run"}], "if_failed": "fail"},
            {"name": "b", "job": "a", "after": ["a"]},
            {"name": "c", "job": "b", "after": ["a"], "delay": "2s"},
            {"name": "a", "job": "a", "payload": {"x": 1}},
        ]));
        let prepared = prepare(&wf, &configs(), &EnqueueLimits::default()).unwrap();
        let names: Vec<&str> = prepared.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        let d = &prepared.steps[3];
        assert_eq!(d.after, vec![(1, IfFailed::Fail), (2, IfFailed::Run)], "the step's policy, or the dependency's");
        assert_eq!(prepared.steps[2].delay_ms, 2000);
        assert_eq!(prepared.steps[0].payload, json!({"x": 1}));
    }

    #[test]
    fn a_bad_workflow_is_refused_naming_the_problem() {
        assert!(refusal(json!([])).contains("at least one step"));
        assert!(refusal(json!([{"name": "x", "job": "a"}, {"name": "x", "job": "a"}])).contains("two steps"));
        assert!(refusal(json!([{"name": "x", "job": "a", "after": ["nope"]}])).contains("\"nope\""));
        assert!(refusal(json!([{"name": "x", "job": "a", "after": ["x"]}])).contains("itself"));
        assert!(refusal(json!([{"name": "x y", "job": "a"}])).contains("step name"));
        assert!(refusal(json!([{"name": "x", "job": "zzz"}])).contains("unknown job type"));
        assert!(refusal(json!([{"name": "x", "job": "a", "payload": [1]}])).contains("JSON object"));
        assert!(refusal(json!([{"name": "x", "job": "a", "payload": {"_deps": {}}}])).contains("_deps"));
        let cycle = refusal(json!([
            {"name": "root", "job": "a"},
            {"name": "p", "job": "a", "after": ["root", "r"]},
            {"name": "q", "job": "a", "after": ["p"]},
            {"name": "r", "job": "a", "after": ["q"]},
            {"name": "tail", "job": "a", "after": ["r"]},
        ]));
        assert!(cycle.contains("cycle"), "{cycle}");
        assert!(cycle.ends_with("p → r → q → p"), "{cycle}");
        let too_many: Vec<_> = (0..=MAX_WORKFLOW_STEPS).map(|i| json!({"name": format!("s{i}"), "job": "a"})).collect();
        assert!(refusal(json!(too_many)).contains("10000"));
    }

    fn ended(name: &str, state: &str, result: serde_json::Value, if_failed: IfFailed) -> EndedDependency {
        EndedDependency { name: name.into(), state: state.into(), result, if_failed }
    }

    #[test]
    fn a_release_runs_with_outputs_or_follows_the_strictest_unmet_policy() {
        let ok = ended("a", "completed", json!({"url": "u"}), IfFailed::Cancel);
        let bad = |policy| ended("b", "failed", json!("boom"), policy);
        assert_eq!(
            release(&json!({"k": 1}), std::slice::from_ref(&ok), false),
            Release::Run(json!({"k": 1, "_deps": {"a": {"url": "u"}}}))
        );
        assert_eq!(
            release(&json!({}), &[ok.clone(), bad(IfFailed::Run)], false),
            Release::Run(json!({
                "_deps": {"a": {"url": "u"}, "b": {"state": "failed", "error": "boom"}},
                "_deps_failed": ["b"],
            }))
        );
        assert_eq!(
            release(&json!({}), &[ok.clone(), bad(IfFailed::Cancel)], false),
            Release::Cancel("dependency \"b\" failed: boom".into())
        );
        let cancelled = ended("c", "cancelled", serde_json::Value::Null, IfFailed::Cancel);
        assert_eq!(
            release(&json!({}), &[cancelled, bad(IfFailed::Fail)], false),
            Release::Fail("dependency \"b\" failed: boom".into()),
            "fail is stricter than cancel"
        );
        assert_eq!(release(&json!({}), &[ok], true), Release::Cancel("its workflow was cancelled".into()));
        assert_eq!(release(&json!({"k": 1}), &[], false), Release::Run(json!({"k": 1})), "a root gets no _deps");
    }

    #[test]
    fn a_workflow_is_running_until_every_step_ended() {
        let counts = |pairs: &[(&str, i64)]| WorkflowCounts {
            total: pairs.iter().map(|p| p.1).sum(),
            by_state: pairs.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
        };
        assert_eq!(Workflow::state_of(false, &counts(&[("completed", 2), ("waiting", 1)])), WorkflowState::Running);
        assert_eq!(Workflow::state_of(false, &counts(&[("completed", 3)])), WorkflowState::Succeeded);
        assert_eq!(Workflow::state_of(false, &counts(&[("completed", 2), ("cancelled", 1)])), WorkflowState::Failed);
        assert_eq!(Workflow::state_of(true, &counts(&[("running", 1)])), WorkflowState::Cancelled);
    }
}
