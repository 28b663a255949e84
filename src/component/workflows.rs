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

use crate::component::bindings::{self, EnqueueOptions, NewStep as WitStep, StepOf, WitIfFailed, WorkflowRef};
use crate::component::sandbox::{ChildProbe, SandboxState};
use crate::step::{
    DEPS_FAILED_KEY, DEPS_KEY, Dependency, IfFailed, MAX_GROWN_STEP_NAME_BYTES, MAX_WORKFLOW_LABEL_BYTES,
    MAX_WORKFLOW_STEPS, NewStep, check_step_name,
};
use crate::types::{ChildJob, StepRequest, StepTarget, WorkflowRequest};

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
    /// The job's step, once asked.
    step: Option<Option<JobStep>>,
    /// The names added so far, per workflow.
    names: HashMap<StepTarget, HashSet<String>>,
}

impl RunWorkflows {
    /// A run of `job_id` that finds its step through `lookup`.
    pub fn new(job_id: i64, lookup: Option<StepLookup>) -> Self {
        RunWorkflows { job_id, lookup, ..RunWorkflows::default() }
    }

    /// The job's step, asked of the store once per run.
    async fn step(&mut self) -> Result<Option<JobStep>, String> {
        if let Some(step) = &self.step {
            return Ok(step.clone());
        }
        let Some(lookup) = self.lookup.clone() else {
            return Err("this host cannot tell which workflow step a job is (it runs without a queue)".to_string());
        };
        let step = lookup(self.job_id).await?;
        self.step = Some(step.clone());
        Ok(step)
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

impl bindings::jobhost::job::workflows::Host for SandboxState {
    async fn current_step(&mut self) -> wasmtime::Result<Result<Option<StepOf>, String>> {
        let step = self.workflows.step().await;
        Ok(step.map(|s| s.map(|s| StepOf { workflow_id: s.workflow_id as u64, name: s.name })))
    }

    fn open(&mut self, label: Option<String>) -> wasmtime::Result<Result<u32, String>> {
        Ok(self.open_workflow(label))
    }

    async fn add_step(&mut self, workflow: WorkflowRef, step: WitStep) -> wasmtime::Result<Result<(), String>> {
        Ok(self.add_step(workflow, step).await)
    }
}

impl SandboxState {
    fn open_workflow(&mut self, label: Option<String>) -> Result<u32, String> {
        let opened = &self.effects.workflows.opened;
        if opened.len() >= WORKFLOW_LIMIT {
            return Err(format!("a run may open at most {WORKFLOW_LIMIT} workflows"));
        }
        if label.as_ref().is_some_and(|l| l.len() > MAX_WORKFLOW_LABEL_BYTES) {
            return Err(format!("a workflow's label is at most {MAX_WORKFLOW_LABEL_BYTES} bytes"));
        }
        let held = label.as_ref().map_or(0, String::len);
        if !self.budget.try_take(held) {
            return Err(self.budget.refusal("this workflow", held));
        }
        self.effects.workflows.opened.push(WorkflowRequest { label });
        Ok((self.effects.workflows.opened.len() - 1) as u32)
    }

    /// A step, checked on the run's terms and the fleet's, held for the completion.
    async fn add_step(&mut self, workflow: WorkflowRef, step: WitStep) -> Result<(), String> {
        let target = match workflow {
            WorkflowRef::Current => {
                let Some(own) = self.workflows.step().await? else {
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
            WorkflowRef::Opened(n) if (n as usize) < self.effects.workflows.opened.len() => StepTarget::Opened(n),
            WorkflowRef::Opened(n) => return Err(format!("this run opened no workflow {n}")),
        };
        if self.effects.workflows.steps.len() >= MAX_WORKFLOW_STEPS {
            return Err(format!("a run may add at most {MAX_WORKFLOW_STEPS} steps"));
        }
        check_step_name(&step.name)?;
        let names = self.workflows.names.get(&target);
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
        let held = step.name.len() + step.job.len() + step.payload.len();
        let EnqueueOptions { queue, priority, delay_ms } = step.options;
        let child = self.child_of(step.job, step.payload, EnqueueOptions { queue, priority, delay_ms })?;
        if child.payload.get(DEPS_KEY).is_some() || child.payload.get(DEPS_FAILED_KEY).is_some() {
            return Err(format!("its payload has {DEPS_KEY:?} or {DEPS_FAILED_KEY:?}, which its release writes"));
        }
        self.check_step_job(&child).await?;
        // Held for the completion transaction; `child_of` checked the budget.
        self.budget.try_take(held);
        self.workflows.names.entry(target).or_default().insert(step.name.clone());
        let ChildJob { job, payload, queue, priority, delay_ms, .. } = child;
        let new = NewStep {
            queue,
            priority,
            delay_ms,
            after,
            if_failed: step.if_failed.map(IfFailed::from),
            ..NewStep::new(step.name, job, payload)
        };
        self.effects.workflows.steps.push(StepRequest { target, step: new });
        Ok(())
    }

    /// The fleet's enqueue rules for a step's job (its type exists, its
    /// payload and options pass), without a limit's room.
    async fn check_step_job(&mut self, child: &ChildJob) -> Result<(), String> {
        let Some(check) = self.child_check.clone() else {
            return Ok(());
        };
        let probe = ChildProbe { child: child.clone(), earlier: Default::default(), at_release: true };
        check(probe).await.map(|_| ())
    }
}
