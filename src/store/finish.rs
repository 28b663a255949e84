//! The finish rules, decided once for every backend: which results of a
//! batch are current, what each run's end does to its job (archived, or
//! back to wait, and with which error), which children are enqueued with
//! it, and which runs may be deferred. The outcome is a [`FinishPlan`]; a
//! backend only writes it (`Backend::plan_write`), matching each
//! run on its lease token.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::batch::{Callbacks, PreparedBatch, check_callbacks};
use super::enqueue::{Configs, EnqueueLimits, PreparedJob, job_names, prepare_registered};
use super::job::{EnqueueParams, FetchParams, FetchedJob, Finish, FinishOutcome, FinishResult, JobState, LockedKeys};
use super::workflow::{NewWorkflow, PreparedWorkflow, prepare as prepare_workflow, prepare_grown};
use super::{Backend, Result, RunId};
use crate::schedule_spec::ScheduleChange;
use crate::types::{BatchRequest, ChildBatch, ChildEvent, ChildJob, JsonText, StepTarget, WorkflowEffects};

/// Writes a batch of results and, when `next` asks for any, leases jobs to
/// the writing host in the same transaction. Returns one result per input,
/// in order, and the leased jobs.
///
/// # Errors
/// The database failing; the batch is then not written at all.
pub(crate) async fn finish(
    backend: &(impl Backend + ?Sized),
    finishes: Vec<Finish>,
    next: Option<&FetchParams>,
    locked: LockedKeys,
) -> Result<(Vec<FinishResult>, Vec<FetchedJob>)> {
    let (runs, order) = current_runs(finishes);
    let names = child_names(&runs);
    let configs = if names.is_empty() { Configs::new() } else { backend.configs_read(&names).await? };
    let changed = changed_schedules(&runs);
    let held = match locked {
        LockedKeys::Defer if !changed.is_empty() => backend.keyed_schedules_held(&changed).await?,
        _ => HashSet::new(),
    };
    let plan = FinishPlan::new(runs, &configs, backend.limits(), locked, &held);
    let written = backend.plan_write(&plan, next).await?;
    if !written.deferred.is_empty() {
        tracing::debug!(
            results = written.deferred.len(),
            "results deferred: their keys are locked by another transaction"
        );
    }
    Ok((order.results(&plan.results(&written)), written.leased))
}

/// What a backend writes for one batch of results: every run's end, and
/// the children of the completed ones. Each entry names its run; a run
/// whose lease token no longer matches is written as nothing at all.
#[derive(Debug)]
pub struct FinishPlan {
    /// Runs that end for good: to the archive.
    pub endings: Vec<Ending>,
    /// Runs whose jobs go back to wait: scheduled, or available at once.
    pub requeues: Vec<Requeue>,
    /// The children of the completed runs, each naming its parent: written
    /// in the same transaction, and only for a parent whose ending was
    /// (guarantee 9).
    pub children: Vec<PreparedJob>,
    /// The batches the completed runs opened, each with its parent and its
    /// members, created closed in the same transaction, only for a parent
    /// whose ending was written.
    pub batches: Vec<(i64, PreparedBatch)>,
    /// The workflows the completed runs opened, each with its parent,
    /// created in the same transaction, only for a parent whose ending was
    /// written.
    pub workflows: Vec<(i64, PreparedWorkflow)>,
    /// The completed runs' own workflows, grown by the steps they added:
    /// written before their endings, each only while its run's lease still
    /// matches, so the ending's count-down finds the new steps in place.
    pub growths: Vec<Growth>,
    /// The events the completed runs sent, each with its run's job: sent
    /// in the same transaction, only for a run whose ending was written.
    pub events: Vec<(i64, ChildEvent)>,
    /// The changes the completed runs made to keyed schedules, each with
    /// its run's job, in the order the run made them: written in the same
    /// transaction, only for a run whose ending was written.
    pub schedules: Vec<(i64, ScheduleChange)>,
    /// Runs left out of this write because a schedule they change is held
    /// by another transaction ([`LockedKeys::Defer`]): deferred, as a run
    /// whose key is held is, and written later, waiting for the row.
    pub held_back: HashSet<i64>,
    /// Runs holding a concurrency key, or in a batch, whose write is left
    /// out while another transaction holds that key's semaphore or that
    /// batch's row ([`LockedKeys::Defer`]); empty when the write waits instead.
    pub deferrable: Vec<RunId>,
    /// The jobs of runs holding a concurrency key, or in a batch, whose
    /// write waits for those locks instead ([`LockedKeys::Wait`]): a backend
    /// with row locks takes their job rows, keys and batches in the lock
    /// order every path that ends a job follows, before it writes.
    pub lock_first: Vec<i64>,
    /// Every run's job, in the order results are reported.
    order: Vec<i64>,
}

/// The steps a completed run adds to the workflow its job is a step of.
#[derive(Debug)]
pub struct Growth {
    /// The run's job.
    pub job_id: i64,
    /// The run's lease token: the steps are added only while it still matches.
    pub lease_token: i64,
    /// The steps, named as the run gave them (stored as `STEP/NAME`),
    /// dependencies first, each `after` among them.
    pub steps: PreparedWorkflow,
}

/// A run that ends for good.
#[derive(Debug, Serialize)]
pub struct Ending {
    /// The job.
    pub id: i64,
    /// The run's lease token: the job is moved only while it still matches.
    pub lease_token: i64,
    /// `completed`, `failed` or `cancelled`.
    pub state: JobState,
    /// The guest's output, for a completed run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<JsonText>,
    /// The error added to the job's errors, for a run that did not complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorEntry>,
    /// The attempt's log, kept with the archived job.
    pub log: serde_json::Value,
    /// The latest progress; the job's earlier one stays when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<serde_json::Value>,
}

/// A run whose job goes back to wait.
#[derive(Debug, Serialize)]
pub struct Requeue {
    /// The job.
    pub id: i64,
    /// The run's lease token: the job is moved only while it still matches.
    pub lease_token: i64,
    /// How long it waits: scheduled after this, available at once for 0.
    pub delay_ms: i64,
    /// 1 when the attempt is given back (a snooze, a hand-back), else 0.
    pub refund: i32,
    /// The error added to the job's errors, for a retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorEntry>,
    /// The latest progress; the job's earlier one stays when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<serde_json::Value>,
}

/// One attempt's error as a job keeps it. The backend adds the time (`at`)
/// from the clock it writes with.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorEntry {
    /// The attempt that failed.
    pub attempt: i32,
    /// Why.
    pub error: String,
    /// The attempt's log lines and captured output.
    pub log: serde_json::Value,
}

/// What a backend wrote of a [`FinishPlan`].
#[derive(Debug, Default)]
pub struct Written {
    /// The jobs whose run was written: its lease still matched.
    pub written: HashSet<i64>,
    /// The jobs whose run was left out because another transaction holds
    /// its key (only among [`FinishPlan::deferrable`]).
    pub deferred: HashSet<i64>,
    /// The jobs leased to the writing host in the same transaction.
    pub leased: Vec<FetchedJob>,
}

impl FinishPlan {
    /// Plans the current runs of a batch (see [`current_runs`]). `configs`
    /// holds the registered types of their children (`child_names`);
    /// `held`, the schedules another transaction holds, whose changers
    /// are held back.
    pub fn new(
        runs: Vec<Finish>,
        configs: &Configs,
        limits: &EnqueueLimits,
        locked: LockedKeys,
        held: &HashSet<(String, String)>,
    ) -> FinishPlan {
        let mut plan = FinishPlan {
            endings: Vec::new(),
            requeues: Vec::new(),
            children: Vec::new(),
            batches: Vec::new(),
            workflows: Vec::new(),
            growths: Vec::new(),
            events: Vec::new(),
            schedules: Vec::new(),
            held_back: HashSet::new(),
            deferrable: Vec::new(),
            lock_first: Vec::new(),
            order: Vec::with_capacity(runs.len()),
        };
        for run in runs {
            plan.order.push(run.id);
            if !held.is_empty() && schedule_keys(&run).any(|key| held.contains(&key)) {
                plan.held_back.insert(run.id);
                continue;
            }
            if grows(&run) {
                // Its growth is checked against its lease before its
                // ending is written: the ending must not be deferred.
                plan.lock_first.push(run.id);
            } else if run.concurrency_key.is_some() || run.batch_id.is_some() {
                match locked {
                    LockedKeys::Defer => plan.deferrable.push(run.run()),
                    LockedKeys::Wait => plan.lock_first.push(run.id),
                }
            }
            plan.push(run, configs, limits);
        }
        plan
    }

    /// The archive-or-requeue decision for one run.
    fn push(&mut self, run: Finish, configs: &Configs, limits: &EnqueueLimits) {
        let Finish { id, lease_token, attempt, outcome, log, progress, batch_id, traceparent, .. } = run;
        let entry = |error: String, log: &serde_json::Value| ErrorEntry { attempt, error, log: log.clone() };
        let (delay_ms, refund, error) = match outcome {
            FinishOutcome::Completed { output, children, batches, workflows, events, schedules } => {
                let parent = Parent { id, batch_id, traceparent };
                let prepared = prepare_children(parent, &children, &batches, configs, limits)
                    .and_then(|children| Ok((children, prepare_workflows(&workflows, configs, limits)?)))
                    .and_then(|prepared| check_schedule_changes(&schedules, configs).map(|()| prepared));
                let (state, output, error) = match prepared {
                    Ok(((prepared, opened), (created, grown))) => {
                        self.children.extend(prepared);
                        self.batches.extend(opened.into_iter().map(|batch| (id, batch)));
                        self.workflows.extend(created.into_iter().map(|workflow| (id, workflow)));
                        if let Some(steps) = grown {
                            self.growths.push(Growth { job_id: id, lease_token, steps });
                        }
                        self.events.extend(events.iter().map(|event| (id, event.clone())));
                        self.schedules.extend(schedules.iter().map(|change| (id, change.clone())));
                        (JobState::Completed, output, None)
                    }
                    Err(problem) => (JobState::Failed, None, Some(entry(problem, &log))),
                };
                self.endings.push(Ending { id, lease_token, state, output, error, log, progress });
                return;
            }
            FinishOutcome::Failed { error } => {
                let error = Some(entry(error, &log));
                self.endings.push(Ending {
                    id,
                    lease_token,
                    state: JobState::Failed,
                    output: None,
                    error,
                    log,
                    progress,
                });
                return;
            }
            FinishOutcome::Cancelled { reason } => {
                let error = Some(entry(reason, &log));
                let state = JobState::Cancelled;
                self.endings.push(Ending { id, lease_token, state, output: None, error, log, progress });
                return;
            }
            FinishOutcome::Retry { error, delay_ms } => (delay_ms, 0, Some(entry(error, &log))),
            FinishOutcome::Snooze { delay_ms } => (delay_ms, 1, None),
            FinishOutcome::Release { .. } => (0, 1, None),
        };
        let delay_ms = i64::try_from(delay_ms).unwrap_or(i64::MAX / 2);
        self.requeues.push(Requeue { id, lease_token, delay_ms, refund, error, progress });
    }

    /// The children of the runs whose ending was written, borrowed: a
    /// child's payload may be large, and the plan outlives the write.
    pub fn children_of(&self, written: &HashSet<i64>) -> Vec<&PreparedJob> {
        self.children.iter().filter(|c| c.parent_id.is_some_and(|p| written.contains(&p))).collect()
    }

    /// The batches opened by the runs whose ending was written.
    pub fn batches_of(&self, written: &HashSet<i64>) -> Vec<&PreparedBatch> {
        self.batches.iter().filter(|(parent, _)| written.contains(parent)).map(|(_, batch)| batch).collect()
    }

    /// The workflows opened by the runs whose ending was written.
    pub fn workflows_of(&self, written: &HashSet<i64>) -> Vec<&PreparedWorkflow> {
        self.workflows.iter().filter(|(parent, _)| written.contains(parent)).map(|(_, workflow)| workflow).collect()
    }

    /// The events sent by the runs whose ending was written, each with its run's job.
    pub fn events_of(&self, written: &HashSet<i64>) -> impl Iterator<Item = &(i64, ChildEvent)> {
        self.events.iter().filter(|(parent, _)| written.contains(parent))
    }

    /// The schedules the planned runs change, each once, in (type, key) order.
    pub fn changed_schedules(&self) -> Vec<(String, String)> {
        sorted_once(self.schedules.iter().map(|(_, change)| change.schedule()))
    }

    /// The schedule changes made by the runs whose ending was written, in order.
    pub fn schedules_of(&self, written: &HashSet<i64>) -> impl Iterator<Item = &ScheduleChange> {
        self.schedules.iter().filter(|(parent, _)| written.contains(parent)).map(|(_, change)| change)
    }

    /// Whether the plan writes anything beyond the runs themselves.
    pub fn has_children(&self) -> bool {
        !self.children.is_empty()
            || !self.batches.is_empty()
            || !self.workflows.is_empty()
            || !self.growths.is_empty()
            || !self.events.is_empty()
            || !self.schedules.is_empty()
    }

    /// One result per planned run, in order.
    fn results(&self, written: &Written) -> Vec<FinishResult> {
        self.order
            .iter()
            .map(|id| match () {
                () if written.deferred.contains(id) || self.held_back.contains(id) => FinishResult::Deferred,
                () if written.written.contains(id) => FinishResult::Done,
                () => FinishResult::Duplicate,
            })
            .collect()
    }
}

/// The run whose children are prepared.
#[derive(Debug, Clone)]
struct Parent {
    id: i64,
    /// The batch the parent is a member of.
    batch_id: Option<i64>,
    /// The run's trace context, which its children carry.
    traceparent: Option<String>,
}

/// Prepares a completed run's children, and the batches it opened with
/// the children it added to them. A child that cannot be enqueued (unknown
/// type, bad payload) or a batch that cannot be created (an unknown
/// callback type) would fail the whole transaction; instead its parent
/// fails with the reason, and nothing is lost: the parent can be retried
/// once the type exists.
fn prepare_children(
    parent: Parent,
    children: &[ChildJob],
    batches: &[BatchRequest],
    configs: &Configs,
    limits: &EnqueueLimits,
) -> Result<(Vec<PreparedJob>, Vec<PreparedBatch>), String> {
    let mut opened = batches
        .iter()
        .map(|request| {
            let callbacks = Callbacks {
                on_finish: request.on_finish.clone(),
                on_success: request.on_success.clone(),
                on_failure: request.on_failure.clone(),
            };
            check_callbacks(&callbacks, &request.callback_payload, configs, limits)
                .map_err(|problem| format!("could not open a batch: {problem}"))?;
            Ok(PreparedBatch {
                label: request.label.clone(),
                callbacks,
                callback_payload: request.callback_payload.clone(),
                open: false,
                members: Vec::new(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut own = Vec::new();
    for child in children {
        let params = EnqueueParams::child_traced(parent.id, child.clone(), parent.traceparent.clone());
        let prepared = prepare_registered(params, configs, limits)
            .map_err(|problem| format!("could not enqueue a child job: {problem}"))?;
        // A child is not planned by its key (docs/rate-limits.md): it is
        // written after its parent's ending gave back its slots, and rate
        // keys come before semaphores in the lock order. Its fetch counts it.
        let prepared = PreparedJob { rate: None, ..prepared };
        match child.batch {
            None => own.push(prepared),
            Some(ChildBatch::Parent) => {
                let batch_id = parent.batch_id.ok_or("could not enqueue a child job: this job is in no batch")?;
                own.push(PreparedJob { batch_id: Some(batch_id), batch_by_member: true, ..prepared });
            }
            Some(ChildBatch::Opened(n)) => opened
                .get_mut(n as usize)
                .ok_or_else(|| format!("could not enqueue a child job: this run opened no batch {n}"))?
                .members
                .push(prepared),
        }
    }
    Ok((own, opened))
}

/// Whether a run completes adding steps to its own workflow.
fn grows(run: &Finish) -> bool {
    matches!(&run.outcome, FinishOutcome::Completed { workflows, .. }
        if workflows.steps.iter().any(|s| s.target == StepTarget::Current))
}

/// Prepares the workflows a completed run opened (those it added steps
/// to; one with none is not created) and the steps it added to its own,
/// with the rules a workflow's creation applies. Like a child, a workflow
/// or step that cannot be written fails its parent with the reason.
fn prepare_workflows(
    effects: &WorkflowEffects,
    configs: &Configs,
    limits: &EnqueueLimits,
) -> Result<(Vec<PreparedWorkflow>, Option<PreparedWorkflow>), String> {
    if effects.is_empty() {
        return Ok((Vec::new(), None));
    }
    let mut opened: Vec<NewWorkflow> =
        effects.opened.iter().map(|w| NewWorkflow { label: w.label.clone(), steps: Vec::new() }).collect();
    let mut grown = NewWorkflow::default();
    for request in &effects.steps {
        let steps = match request.target {
            StepTarget::Current => &mut grown.steps,
            StepTarget::Opened(n) => {
                &mut opened.get_mut(n as usize).ok_or_else(|| format!("could not add a step: no workflow {n}"))?.steps
            }
        };
        steps.push(request.step.clone());
    }
    let created = opened
        .iter()
        .filter(|w| !w.steps.is_empty())
        .map(|w| prepare_workflow(w, configs, limits).map_err(|e| format!("could not create a workflow: {e}")))
        .collect::<Result<Vec<_>, String>>()?;
    let grown = match grown.steps.is_empty() {
        true => None,
        false => Some(
            prepare_grown(&grown, configs, limits).map_err(|e| format!("could not add steps to its workflow: {e}"))?,
        ),
    };
    Ok((created, grown))
}

/// Checks that the schedules a completed run creates or replaces are of
/// job types registered now: their fields and a tick's job were checked
/// at the call ([`crate::component`]'s `schedules` imports), against the
/// types as the host knew them then. Like a child, one whose type is gone
/// fails its run with the reason instead of the whole transaction.
fn check_schedule_changes(changes: &[ScheduleChange], configs: &Configs) -> Result<(), String> {
    match changes.iter().find(|change| matches!(change, ScheduleChange::Set(_)) && !configs.contains_key(change.job()))
    {
        Some(change) => Err(format!("could not write a schedule: job: no job type {:?} is registered", change.job())),
        None => Ok(()),
    }
}

/// The schedules (job type, key) a completed run changes.
fn schedule_keys(run: &Finish) -> impl Iterator<Item = (String, String)> + '_ {
    let changes = match &run.outcome {
        FinishOutcome::Completed { schedules, .. } => &schedules[..],
        _ => &[],
    };
    changes.iter().map(ScheduleChange::schedule)
}

/// The schedules the completed runs among `runs` change, each once, in
/// (type, key) order: the order a write locks them in.
fn changed_schedules(runs: &[Finish]) -> Vec<(String, String)> {
    sorted_once(runs.iter().flat_map(schedule_keys))
}

fn sorted_once(schedules: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    let once: std::collections::BTreeSet<(String, String)> = schedules.collect();
    once.into_iter().collect()
}

/// The job types of every child that the completed runs among `runs`
/// enqueue, of the callbacks of the batches they open, and of the
/// schedules they write, each once.
fn child_names(runs: &[Finish]) -> Vec<String> {
    job_names(runs.iter().flat_map(|f| match &f.outcome {
        FinishOutcome::Completed { children, batches, workflows, schedules, .. } => {
            let callbacks = batches.iter().flat_map(|b| [&b.on_finish, &b.on_success, &b.on_failure]);
            let steps = workflows.steps.iter().map(|s| s.step.job.as_str());
            let scheduled = schedules.iter().filter_map(|c| match c {
                ScheduleChange::Set(schedule) => Some(schedule.job.as_str()),
                _ => None,
            });
            children
                .iter()
                .map(|c| c.job.as_str())
                .chain(callbacks.flatten().map(String::as_str))
                .chain(steps)
                .chain(scheduled)
                .collect()
        }
        _ => Vec::new(),
    }))
}

/// Takes the superseded results out of a batch: a host whose result writes
/// kept failing while its lease ran out may lease the job again and end up
/// holding both runs' results. Lease tokens only grow, so only the run with
/// a job's newest token can still hold its lease; older runs (and repeats
/// of one run) are duplicates without being written. Returns the runs to
/// write, in input order, and where each input's result will be.
pub fn current_runs(finishes: Vec<Finish>) -> (Vec<Finish>, InputOrder) {
    let mut newest: HashMap<i64, i64> = HashMap::new();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Backoff, JobConfig};
    use std::sync::Arc;

    fn run(id: i64, lease_token: i64) -> Finish {
        Finish {
            concurrency_key: None,
            id,
            lease_token,
            attempt: 1,
            outcome: FinishOutcome::Failed { error: "x".into() },
            log: serde_json::Value::Null,
            progress: None,
            batch_id: None,
            traceparent: None,
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

    fn completed(id: i64, children: Vec<ChildJob>) -> Finish {
        let outcome = FinishOutcome::Completed {
            output: None,
            children: Arc::from(children),
            batches: Default::default(),
            workflows: Default::default(),
            events: Default::default(),
            schedules: Default::default(),
        };
        Finish { outcome, concurrency_key: Some("k".into()), ..run(id, id * 10) }
    }

    fn child(job: &str, payload: serde_json::Value) -> ChildJob {
        ChildJob { job: job.into(), payload, queue: None, priority: None, delay_ms: None, batch: None }
    }

    fn configs() -> Configs {
        let config = JobConfig {
            name: "mail".into(),
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
        Configs::from([("mail".to_string(), config)])
    }

    #[test]
    fn a_parent_whose_child_cannot_be_enqueued_fails_with_the_reason_and_enqueues_none() {
        let runs = vec![
            completed(1, vec![child("mail", serde_json::json!({})), child("ghost", serde_json::json!({}))]),
            completed(2, vec![child("mail", serde_json::json!({"n": 1}))]),
        ];
        let plan = FinishPlan::new(runs, &configs(), &EnqueueLimits::default(), LockedKeys::Wait, &HashSet::new());
        let states: Vec<_> = plan.endings.iter().map(|e| (e.id, e.state)).collect();
        assert_eq!(states, [(1, JobState::Failed), (2, JobState::Completed)]);
        let reason = &plan.endings[0].error.as_ref().unwrap().error;
        assert!(reason.starts_with("could not enqueue a child job: unknown job type \"ghost\""), "{reason}");
        assert_eq!(plan.children.len(), 1);
        assert_eq!(plan.children[0].parent_id, Some(2));
        assert!(plan.deferrable.is_empty(), "a batch that waits defers nothing");
    }

    #[test]
    fn only_the_children_of_written_parents_are_written() {
        let runs = vec![completed(1, vec![child("mail", serde_json::json!({}))]), completed(2, vec![])];
        let plan = FinishPlan::new(runs, &configs(), &EnqueueLimits::default(), LockedKeys::Defer, &HashSet::new());
        assert_eq!(plan.deferrable.len(), 2);
        assert!(plan.children_of(&HashSet::from([2])).is_empty());
        assert_eq!(plan.children_of(&HashSet::from([1])).len(), 1);
    }

    #[test]
    fn a_snooze_and_a_hand_back_refund_the_attempt_and_a_retry_keeps_its_error() {
        let snooze = Finish { outcome: FinishOutcome::Snooze { delay_ms: 5 }, ..run(1, 1) };
        let release = Finish { outcome: FinishOutcome::Release { reason: "stop".into() }, ..run(2, 1) };
        let retry = Finish { outcome: FinishOutcome::Retry { error: "boom".into(), delay_ms: 7 }, ..run(3, 1) };
        let plan = FinishPlan::new(
            vec![snooze, release, retry],
            &Configs::new(),
            &EnqueueLimits::default(),
            LockedKeys::Wait,
            &HashSet::new(),
        );
        let requeues: Vec<_> = plan
            .requeues
            .iter()
            .map(|r| (r.id, r.delay_ms, r.refund, r.error.as_ref().map(|e| e.error.as_str())))
            .collect();
        assert_eq!(requeues, [(1, 5, 1, None), (2, 0, 1, None), (3, 7, 0, Some("boom"))]);
        let written = Written { written: HashSet::from([1, 3]), deferred: HashSet::from([2]), leased: Vec::new() };
        assert_eq!(plan.results(&written), [FinishResult::Done, FinishResult::Deferred, FinishResult::Done]);
    }
}
