//! The `workflow` commands: create a workflow from a file, list workflows,
//! show one step by step, cancel one.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use super::batch::{WIDTH, bar, percent};
use super::operator::{open, open_existing};
use super::{DbArgs, fail, fail_store};
use crate::store::{NewWorkflow, StepState, Workflow};
use crate::text::clip;

/// What to do with workflows.
#[derive(Debug, Subcommand)]
pub enum WorkflowAction {
    /// Create a workflow from a JSON file, all or none: its steps that wait
    /// for nothing are enqueued at once, each other one when the steps it
    /// waits for have ended. Prints the workflow's id, then each step
    /// enqueued with its job's id.
    Create {
        /// {"label": ..., "steps": [{"name", "job", "payload", "after": [...], ...}]}
        /// (docs/workflows.md); "-" for stdin.
        #[arg(long)]
        file: PathBuf,
        /// One JSON object instead of lines.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List workflows, newest first, with how far each has come.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// One JSON object per workflow, per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Show one workflow: each step's state, job and dependencies, in
    /// dependency order.
    Show {
        /// The workflow.
        id: i64,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Cancel a workflow: its waiting steps end as cancelled, and its
    /// released steps are cancelled as `cancel` does (a running one by its host).
    Cancel {
        /// The workflow.
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
}

pub async fn run(action: WorkflowAction) -> ExitCode {
    match action {
        WorkflowAction::Create { file, json, db } => create(&file, json, &db).await,
        WorkflowAction::List { limit, json, db } => list(limit, json, &db).await,
        WorkflowAction::Show { id, json, db } => show(id, json, &db).await,
        WorkflowAction::Cancel { id, db } => cancel(id, &db).await,
    }
}

/// The file as a workflow; a bad file stops everything before anything is stored.
fn read_workflow(path: &Path) -> Result<NewWorkflow, ExitCode> {
    let text =
        if path.as_os_str() == "-" { std::io::read_to_string(std::io::stdin()) } else { std::fs::read_to_string(path) }
            .map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| fail(format!("{} is not a workflow ({{\"steps\": [...]}}): {e}", path.display())))
}

async fn create(file: &Path, json: bool, db: &DbArgs) -> ExitCode {
    let workflow = match read_workflow(file) {
        Ok(workflow) => workflow,
        Err(code) => return code,
    };
    let store = match open(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.workflow_create(&workflow).await {
        Ok(created) => {
            if json {
                println!("{}", serde_json::json!({ "workflow": created.id, "released": created.released }));
            } else {
                println!("workflow {}", created.id);
                for (step, job) in &created.released {
                    println!("{step} {job}");
                }
            }
            ExitCode::SUCCESS
        }
        Err(error) => fail_store(error),
    }
}

async fn list(limit: i64, json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let workflows = match store.workflow_list(limit).await {
        Ok(workflows) => workflows,
        Err(error) => return fail(error),
    };
    for workflow in &workflows {
        if json {
            println!("{}", serde_json::to_string(workflow).unwrap_or_default());
        } else {
            println!("{}", list_line(workflow));
        }
    }
    super::say_if_none(
        workflows.len(),
        json,
        "no workflows: `jobhost workflow create --file FILE` makes one (see docs/workflows.md)",
    );
    ExitCode::SUCCESS
}

fn progress(workflow: &Workflow) -> f64 {
    let c = &workflow.counts;
    if c.total == 0 { 1.0 } else { c.ended() as f64 / c.total as f64 }
}

/// One workflow in 80 columns: id, state, a progress bar, ended of total,
/// steps that did not complete, and as much of the label as fits.
fn list_line(workflow: &Workflow) -> String {
    let c = &workflow.counts;
    let unsuccessful = c.unsuccessful();
    let unsuccessful = if unsuccessful > 0 { format!(" {unsuccessful} not completed") } else { String::new() };
    let line = format!(
        "{:>7}  {:<9} {} {:>4}  {}/{}{unsuccessful}",
        workflow.id,
        workflow.state.as_str(),
        bar(progress(workflow), 16),
        percent(progress(workflow)),
        c.ended(),
        c.total
    );
    match workflow.label.as_deref() {
        Some(label) if line.chars().count() + 4 <= WIDTH => {
            let room = WIDTH - line.chars().count() - 2;
            format!("{line}  {}", clip(label, room))
        }
        _ => line,
    }
}

async fn show(id: i64, json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let workflow = match store.workflow_get(id).await {
        Ok(Some(workflow)) => workflow,
        Ok(None) => return fail(format!("workflow {id} does not exist")),
        Err(error) => return fail(error),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&workflow).unwrap_or_default());
    } else {
        print!("{}", details(&workflow));
    }
    ExitCode::SUCCESS
}

/// A workflow step by step, for a terminal of [`WIDTH`] columns: each
/// step's name, state, job and what it waits for (a policy other than
/// `cancel` in brackets), and why a step did not complete.
fn details(workflow: &Workflow) -> String {
    let c = &workflow.counts;
    let label = workflow.label.as_deref().map(|l| format!(" {:?}", clip(l, 40))).unwrap_or_default();
    let mut text = format!("workflow {}{label}: {}\n", workflow.id, workflow.state.as_str());
    text += &format!(
        "  {} {:>4}  {} of {} steps ended\n",
        bar(progress(workflow), 40),
        percent(progress(workflow)),
        c.ended(),
        c.total
    );
    text += &format!("  {:<24} {:<9} {:>9}  {}\n", "STEP", "STATE", "JOB", "AFTER");
    for step in &workflow.steps {
        let job = step.job_id.map(|id| id.to_string()).unwrap_or_else(|| "-".into());
        let after: Vec<String> = step
            .after
            .iter()
            .map(|d| match d.if_failed {
                crate::store::IfFailed::Cancel => d.step.clone(),
                policy => format!("{} ({})", d.step, policy.as_str()),
            })
            .collect();
        let line = format!("  {:<24} {:<9} {:>9}  ", clip(&step.name, 24), step.state.as_str(), job);
        let room = WIDTH.saturating_sub(line.chars().count());
        text += format!("{line}{}", clip(&after.join(", "), room)).trim_end();
        text.push('\n');
        if let (Some(error), true) = (&step.error, step.state.is_final() && step.state != StepState::Completed) {
            text += &format!("    {}\n", clip(&error.replace('\n', " "), WIDTH - 4));
        }
        if let Some(wait) = &step.wait {
            text += &format!("    waits: {}\n", clip(&wait.describe(chrono::Utc::now()), WIDTH - 11));
        }
    }
    let time = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    text += &format!("  created {}", time(workflow.created_at));
    if let Some(cancelled) = workflow.cancelled_at {
        text += &format!(", cancelled {}", time(cancelled));
    }
    if let Some(finished) = workflow.finished_at {
        text += &format!(", finished {}", time(finished));
    }
    text + "\n"
}

async fn cancel(id: i64, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.workflow_cancel(id).await {
        Ok(Some(done)) => {
            println!(
                "workflow {id} cancelled: {} waiting steps and {} jobs cancelled, {} running jobs asked to stop",
                done.waiting_cancelled, done.jobs_cancelled, done.cancel_requested
            );
            ExitCode::SUCCESS
        }
        Ok(None) => fail(format!("workflow {id} does not exist")),
        Err(error) => fail_store(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::workflow::{StepDependency, WorkflowCounts, WorkflowStep};
    use crate::store::{IfFailed, WorkflowState};

    fn step(name: &str, state: StepState, after: &[(&str, IfFailed)]) -> WorkflowStep {
        WorkflowStep {
            name: name.into(),
            job: "resize".into(),
            job_id: Some(123456789),
            state,
            after: after.iter().map(|(s, p)| StepDependency { step: s.to_string(), if_failed: *p }).collect(),
            error: (state == StepState::Failed).then(|| "the image could not be read: ".repeat(5)),
            ended_at: None,
            wait: None,
        }
    }

    fn workflow() -> Workflow {
        let many: Vec<(String, IfFailed)> = (0..40).map(|i| (format!("resize-{i}"), IfFailed::Cancel)).collect();
        let many: Vec<(&str, IfFailed)> = many.iter().map(|(s, p)| (s.as_str(), *p)).collect();
        Workflow {
            id: 1234567,
            label: Some("the album of a very long summer holiday by the sea".into()),
            state: WorkflowState::Running,
            counts: WorkflowCounts {
                total: 4,
                by_state: [("completed".to_string(), 1), ("failed".into(), 1), ("waiting".into(), 2)].into(),
            },
            created_at: chrono::Utc::now(),
            cancelled_at: None,
            finished_at: None,
            steps: vec![
                step("resize-1", StepState::Completed, &[]),
                step("a-step-with-a-very-long-name-indeed", StepState::Failed, &[]),
                step("page", StepState::Waiting, &many),
                WorkflowStep {
                    wait: Some(crate::store::wait::StepWait {
                        key: Some("order.confirmed.by-a-customer-who-takes-their-time".into()),
                        matching: [("order_id".to_string(), "42424242424242".to_string())].into(),
                        armed_at: Some(chrono::Utc::now()),
                        due_at: Some(chrono::Utc::now() + chrono::Duration::hours(71)),
                        on_timeout: IfFailed::Fail,
                        ended_by: None,
                        event_id: None,
                        match_later: None,
                    }),
                    ..step("email", StepState::Waiting, &[("page", IfFailed::Run)])
                },
            ],
        }
    }

    #[test]
    fn a_list_line_and_the_details_fit_80_columns() {
        let wf = workflow();
        let line = list_line(&wf);
        assert!(line.chars().count() <= 80, "{line}");
        assert!(line.contains("2/4 1 not completed"), "{line}");
        let text = details(&wf);
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "{} columns: {line}", line.chars().count());
        }
        assert!(text.contains("page (run)"), "{text}");
        assert!(text.contains("resize-0, resize-1"), "{text}");
        assert!(text.contains("    the image could not be read"), "the failed step's error: {text}");
        assert!(text.contains("    waits: event order.confirmed"), "the waiting step's wait: {text}");
    }
}
