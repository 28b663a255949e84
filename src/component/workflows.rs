//! The `workflows` imports (WIT 0.5.0): a run opens workflows and adds
//! steps to them, or to the workflow its job is a step of. Each step is
//! checked at the call on the run's own terms (names, dependencies, JSON,
//! the run's limits and byte budget) and by the fleet's enqueue rules (the
//! [`ChildCheck`], without a limit's room: a step is gated when it is
//! released, not now), then held for the completion transaction, so a run
//! that fails or is lost adds nothing.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::component::bindings::{EnqueueOptions, NewStep as WitStep, StepOf, WitIfFailed, WitStepWait, WorkflowRef};
use crate::component::budget::RunBudget;
use crate::component::children::{ChildCheck, ChildProbe};
use crate::step::{
    DEPS_FAILED_KEY, DEPS_KEY, Dependency, IfFailed, MAX_GROWN_STEP_NAME_BYTES, MAX_WORKFLOW_LABEL_BYTES,
    MAX_WORKFLOW_STEPS, NewStep, Wait, check_step_name,
};
use crate::types::{ChildJob, StepRequest, StepTarget, WorkflowEffects, WorkflowRequest};

/// Most workflows one run may open.
const WORKFLOW_LIMIT: usize = 16;

/// The workflow step a job is, as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStep {
    /// The workflow's id.
    pub workflow_id: i64,
    /// The step's name.
    pub name: String,
}

/// Asks the store which workflow step a job is (`None`: it is none). An
/// `Err` is the message the guest receives.
pub type StepLookup =
    Arc<dyn Fn(i64) -> Pin<Box<dyn Future<Output = Result<Option<JobStep>, String>> + Send>> + Send + Sync>;

/// What one run knows of its workflows.
#[derive(Default)]
pub struct RunWorkflows {
    /// The run's job.
    job_id: i64,
    /// How to find the job's step; `current` is refused without one.
    lookup: Option<StepLookup>,
    /// The store's answer for the job's step, once asked: an error too, so
    /// a guest asking in a loop while the database fails sends one query.
    step: Option<Result<Option<JobStep>, String>>,
    /// The names added so far, per workflow.
    names: HashMap<StepTarget, HashSet<String>>,
}

impl RunWorkflows {
    /// A run of `job_id` that finds its step through `lookup`.
    pub fn new(job_id: i64, lookup: Option<StepLookup>) -> Self {
        RunWorkflows { job_id, lookup, ..RunWorkflows::default() }
    }

    /// The job's step, asked of the store once per run, whatever it answers.
    async fn step(&mut self) -> Result<Option<JobStep>, String> {
        if let Some(step) = &self.step {
            return step.clone();
        }
        let Some(lookup) = self.lookup.clone() else {
            return Err("this host cannot tell which workflow step a job is (it runs without a queue)".to_string());
        };
        let step = lookup(self.job_id).await;
        self.step = Some(step.clone());
        step
    }
}

impl From<WitIfFailed> for IfFailed {
    fn from(policy: WitIfFailed) -> Self {
        match policy {
            WitIfFailed::Cancel => IfFailed::Cancel,
            WitIfFailed::Run => IfFailed::Run,
            WitIfFailed::Fail => IfFailed::Fail,
        }
    }
}

/// What the workflow imports reach of a run, and no more (a narrow view,
/// as wasi:http's `WasiHttpView` is of a store's data): the run's workflow
/// state, the requests held for its completion, its byte budget, and the
/// rules every child of the run passes.
pub trait WorkflowRun: Send {
    /// The parts of the run the imports change.
    fn workflow_parts(&mut self) -> WorkflowParts<'_>;
    /// A child from a guest's call, checked on the run's own terms.
    ///
    /// # Errors
    /// The message the guest receives.
    fn child_of(&self, job: String, payload: String, options: EnqueueOptions) -> Result<ChildJob, String>;
    /// The fleet's check of a child, where the run has one.
    fn child_check(&self) -> Option<ChildCheck>;
}

/// The parts of a run the workflow imports change.
pub struct WorkflowParts<'a> {
    /// What the run knows of its workflows.
    pub state: &'a mut RunWorkflows,
    /// The workflows and steps held for the completion transaction.
    pub held: &'a mut WorkflowEffects,
    /// What the run may still make the host hold.
    pub budget: &'a RunBudget,
}

/// `workflows.current-step`: the workflow step the run's job is, if any.
pub async fn current_step(run: &mut impl WorkflowRun) -> Result<Option<StepOf>, String> {
    let step = run.workflow_parts().state.step().await;
    step.map(|s| s.map(|s| StepOf { workflow_id: s.workflow_id as u64, name: s.name }))
}

/// `workflows.open`: a workflow held for the completion, by its number.
pub fn open_workflow(run: &mut impl WorkflowRun, label: Option<String>) -> Result<u32, String> {
    let parts = run.workflow_parts();
    {
        let opened = &parts.held.opened;
        if opened.len() >= WORKFLOW_LIMIT {
            return Err(format!("a run may open at most {WORKFLOW_LIMIT} workflows"));
        }
        if label.as_ref().is_some_and(|l| l.len() > MAX_WORKFLOW_LABEL_BYTES) {
            return Err(format!("a workflow's label is at most {MAX_WORKFLOW_LABEL_BYTES} bytes"));
        }
        let held = label.as_ref().map_or(0, String::len);
        if !parts.budget.try_take(held) {
            return Err(parts.budget.refusal("this workflow", held));
        }
        parts.held.opened.push(WorkflowRequest { label });
        Ok((parts.held.opened.len() - 1) as u32)
    }
}

/// `workflows.add-step`: a step, checked on the run's terms and the
/// fleet's, held for the completion.
pub async fn add_step(run: &mut impl WorkflowRun, workflow: WorkflowRef, step: WitStep) -> Result<(), String> {
    {
        let target = match workflow {
            WorkflowRef::Current => {
                let Some(own) = run.workflow_parts().state.step().await? else {
                    return Err("this job is not a workflow step".to_string());
                };
                let stored = own.name.len() + 1 + step.name.len();
                if stored > MAX_GROWN_STEP_NAME_BYTES {
                    return Err(format!(
                        "step {:?} would be stored as {:?}/{:?}, {stored} bytes, more than {MAX_GROWN_STEP_NAME_BYTES}",
                        step.name, own.name, step.name
                    ));
                }
                StepTarget::Current
            }
            WorkflowRef::Opened(n) if (n as usize) < run.workflow_parts().held.opened.len() => StepTarget::Opened(n),
            WorkflowRef::Opened(n) => return Err(format!("this run opened no workflow {n}")),
        };
        if run.workflow_parts().held.steps.len() >= MAX_WORKFLOW_STEPS {
            return Err(format!("a run may add at most {MAX_WORKFLOW_STEPS} steps"));
        }
        check_step_name(&step.name)?;
        let parts = run.workflow_parts();
        let names = parts.state.names.get(&target);
        if names.is_some_and(|n| n.contains(&step.name)) {
            return Err(format!("this run added a step named {:?} to that workflow already", step.name));
        }
        let mut after = Vec::with_capacity(step.after.len());
        for dep in &step.after {
            if !names.is_some_and(|n| n.contains(&dep.step)) {
                return Err(format!(
                    "step {:?} waits for {:?}, which this run has not added to that workflow before it",
                    step.name, dep.step
                ));
            }
            if after.iter().any(|d: &Dependency| d.step == dep.step) {
                return Err(format!("step {:?} names {:?} twice", step.name, dep.step));
            }
            after.push(Dependency { step: dep.step.clone(), if_failed: dep.if_failed.map(IfFailed::from) });
        }
        let wait = step.wait.map(wait_of).transpose()?;
        let held = step.name.len() + step.job.len() + step.payload.len();
        let EnqueueOptions { queue, priority, delay_ms } = step.options;
        let child = run.child_of(step.job, step.payload, EnqueueOptions { queue, priority, delay_ms })?;
        if child.payload.get(DEPS_KEY).is_some() || child.payload.get(DEPS_FAILED_KEY).is_some() {
            return Err(format!("its payload has {DEPS_KEY:?} or {DEPS_FAILED_KEY:?}, which its release writes"));
        }
        if let Some(wait) = &wait {
            // A grown step waits for this run's step, whose output may
            // hold what its match names; an opened one for its `after`.
            let after = target == StepTarget::Current || !after.is_empty();
            crate::store::wait::prepare(wait, &child.payload, after)
                .map_err(|e| format!("step {:?}: {e}", step.name))?;
        }
        check_step_job(run.child_check(), &child).await?;
        // Held for the completion transaction; `child_of` checked the budget.
        let parts = run.workflow_parts();
        parts.budget.try_take(held);
        parts.state.names.entry(target).or_default().insert(step.name.clone());
        let ChildJob { job, payload, queue, priority, delay_ms, .. } = child;
        let new = NewStep {
            queue,
            priority,
            delay_ms,
            after,
            if_failed: step.if_failed.map(IfFailed::from),
            wait,
            ..NewStep::new(step.name, job, payload)
        };
        run.workflow_parts().held.steps.push(StepRequest { target, step: new });
        Ok(())
    }
}

/// A step's wait as the WIT declares it, in the host's terms (checked
/// with its match templates by the caller, as a workflow file's is).
fn wait_of(declared: WitStepWait) -> Result<Wait, String> {
    let wait = match declared {
        WitStepWait::SleepMs(ms) => Wait::sleep_ms(ms),
        WitStepWait::UntilMs(ms) => {
            let until = i64::try_from(ms)
                .ok()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .ok_or_else(|| format!("a wait's until-ms, {ms}, is not an instant the host can hold"))?;
            Wait { until: Some(until), ..Wait::default() }
        }
        WitStepWait::Event(event) => {
            let mut matching = std::collections::BTreeMap::new();
            for (field, template) in event.match_fields {
                if matching.insert(field.clone(), template).is_some() {
                    return Err(format!("a wait matches field {field:?} twice"));
                }
            }
            Wait {
                event: Some(event.key),
                matching,
                timeout_ms: event.timeout_ms,
                on_timeout: event.on_timeout.map(IfFailed::from),
                lookback_ms: event.lookback_ms,
                ..Wait::default()
            }
        }
    };
    Ok(wait)
}

/// The fleet's enqueue rules for a step's job (its type exists, its
/// payload and options pass), without a limit's room.
async fn check_step_job(check: Option<ChildCheck>, child: &ChildJob) -> Result<(), String> {
    let Some(check) = check else {
        return Ok(());
    };
    let probe = ChildProbe { child: child.clone(), earlier: Default::default(), at_release: true };
    check(probe).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A guest asking for its step in a loop while the database fails
    /// costs one query, and reads the same error each time.
    #[tokio::test]
    async fn a_failed_lookup_is_asked_once_per_run() {
        let asked = Arc::new(AtomicUsize::new(0));
        let lookup: StepLookup = Arc::new({
            let asked = asked.clone();
            move |_| {
                asked.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Err("the database is unreachable".to_string()) })
            }
        });
        let mut run = RunWorkflows::new(7, Some(lookup));
        for _ in 0..100 {
            assert_eq!(run.step().await.unwrap_err(), "the database is unreachable");
        }
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    }
}
