//! The `batch` commands: create a batch from a file of jobs, add to an
//! open one, close it, list batches and show one with its progress.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde::Deserialize;

use super::operator::{enqueued_json, enqueued_line, open, open_existing, read_lines};
use super::{DbArgs, fail, fail_store};
use crate::store::{Batch, Callbacks, EnqueueParams, Enqueued, NewBatch};
use crate::text::clip;

/// What to do with batches.
#[derive(Debug, Subcommand)]
pub enum BatchAction {
    /// Create a batch from a file of jobs, all or none, closed unless --open;
    /// prints the batch id, then each member's id.
    Create(CreateArgs),
    /// Add jobs from a file to an open batch, all or none.
    Add {
        /// The batch.
        id: i64,
        #[command(flatten)]
        members: MemberArgs,
    },
    /// Close an open batch: it takes no more jobs and finishes (its callbacks
    /// enqueued) once every member has ended.
    Close {
        /// The batch.
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List batches, newest first, with their progress.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// One JSON object per batch, per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Show one batch: its counts, progress and callbacks.
    Show {
        /// The batch.
        id: i64,
        /// One JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// The members of a `create` or `add`.
#[derive(Debug, Args)]
pub struct MemberArgs {
    /// The jobs, one JSON object per line: {"job": TYPE, "payload": {...}},
    /// optionally "queue", "priority" and "delay" (e.g. "30s"); "-" for stdin.
    #[arg(long)]
    file: PathBuf,
    /// Print {"id": …} per job instead of bare ids.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    db: DbArgs,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// A name for the batch, for people.
    #[arg(long)]
    label: Option<String>,
    /// The job type to enqueue when the batch finishes, however it went.
    #[arg(long)]
    on_finish: Option<String>,
    /// The job type to enqueue when it finishes with no member failed or discarded.
    #[arg(long)]
    on_success: Option<String>,
    /// The job type to enqueue when it finishes with a member failed or discarded.
    #[arg(long)]
    on_failure: Option<String>,
    /// The JSON object each callback's payload starts from; `_batch` (the
    /// id, label and counts) is added.
    #[arg(long)]
    callback_payload: Option<String>,
    /// Leave the batch open: add jobs with `batch add` or `enqueue --batch`,
    /// then `batch close` it. An open batch never finishes.
    #[arg(long)]
    open: bool,
    #[command(flatten)]
    members: MemberArgs,
}

/// One line of a batch file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberLine {
    job: String,
    #[serde(default = "empty_object")]
    payload: serde_json::Value,
    queue: Option<String>,
    priority: Option<i16>,
    #[serde(default, with = "humantime_serde_option")]
    delay: Option<Duration>,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// `"30s"`-style delays in a batch file.
mod humantime_serde_option {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        let text: Option<String> = Option::deserialize(deserializer)?;
        text.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom)).transpose()
    }
}

pub async fn run(action: BatchAction) -> ExitCode {
    match action {
        BatchAction::Create(args) => create(args).await,
        BatchAction::Add { id, members } => add(id, members).await,
        BatchAction::Close { id, db } => close(id, &db).await,
        BatchAction::List { limit, json, db } => list(limit, json, &db).await,
        BatchAction::Show { id, json, db } => show(id, json, &db).await,
    }
}

async fn create(args: CreateArgs) -> ExitCode {
    let callback_payload = match args.callback_payload.as_deref().map(serde_json::from_str).transpose() {
        Ok(payload) => payload,
        Err(error) => return fail(format!("--callback-payload is not valid JSON: {error}")),
    };
    let (members, lines) = match read_members(&args.members.file) {
        Ok(read) => read,
        Err(code) => return code,
    };
    let batch = NewBatch {
        label: args.label,
        callbacks: Callbacks { on_finish: args.on_finish, on_success: args.on_success, on_failure: args.on_failure },
        callback_payload,
        open: args.open,
    };
    let store = match open(&args.members.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.batch_create(&batch, &members).await {
        Ok((id, outcomes)) => {
            if args.members.json {
                println!("{}", serde_json::json!({ "batch": id }));
            } else {
                println!("batch {id}");
            }
            print_outcomes(&outcomes, args.members.json);
            ExitCode::SUCCESS
        }
        Err(error) => fail_member(error, &members, &lines),
    }
}

async fn add(id: i64, args: MemberArgs) -> ExitCode {
    let (members, lines) = match read_members(&args.file) {
        Ok((members, lines)) => {
            (members.into_iter().map(|m| EnqueueParams { batch_id: Some(id), ..m }).collect::<Vec<_>>(), lines)
        }
        Err(code) => return code,
    };
    let store = match open_existing(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.job_enqueue_outcomes(&members).await {
        Ok(outcomes) => {
            print_outcomes(&outcomes, args.json);
            ExitCode::SUCCESS
        }
        Err(error) => fail_member(error, &members, &lines),
    }
}

fn print_outcomes(outcomes: &[Enqueued], json: bool) {
    for outcome in outcomes {
        if json {
            println!("{}", enqueued_json(*outcome));
        } else {
            println!("{}", enqueued_line(*outcome));
        }
    }
}

/// Every line a member, with the file's line number of each; a bad line
/// stops everything before anything is stored, naming the line.
fn read_members(path: &Path) -> Result<(Vec<EnqueueParams>, Vec<usize>), ExitCode> {
    let read = read_lines(path, |line, number| {
        let member: MemberLine = serde_json::from_str(line)
            .map_err(|e| fail(format!("line {number} is not a job ({{\"job\": TYPE, \"payload\": {{...}}}}): {e}")))?;
        if !member.payload.is_object() {
            return Err(fail(format!(
                "line {number}: the payload must be a JSON object, got {}",
                crate::store::enqueue::json_kind(&member.payload)
            )));
        }
        let params = EnqueueParams {
            queue: member.queue,
            priority: member.priority,
            delay_ms: member.delay.map(|d| d.as_millis() as u64),
            ..EnqueueParams::new(member.job, member.payload)
        };
        Ok((params, number))
    })?;
    Ok(read.into_iter().unzip())
}

/// A refusal of the whole file, naming the first line of the job type the
/// store does not know (the store names the type, not the line).
fn fail_member(error: crate::store::Error, members: &[EnqueueParams], lines: &[usize]) -> ExitCode {
    if let crate::store::Error::UnknownJobType(job) = &error
        && let Some(at) = members.iter().position(|member| &member.job == job)
    {
        return fail(format!("line {}: {error}", lines[at]));
    }
    fail_store(error)
}

async fn close(id: i64, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.batch_close(id).await {
        Ok(true) => {
            println!("batch {id} closed: it finishes once every member has ended");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("batch {id} was closed already");
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
    let batches = match store.batch_list(limit).await {
        Ok(batches) => batches,
        Err(error) => return fail(error),
    };
    for batch in &batches {
        if json {
            println!("{}", serde_json::to_string(batch).unwrap_or_default());
        } else {
            println!("{}", list_line(batch));
        }
    }
    super::say_if_none(
        batches.len(),
        json,
        "no batches: `jobhost batch create --file FILE` makes one (see docs/batches.md)",
    );
    ExitCode::SUCCESS
}

/// One batch in 80 columns: id, state, a progress bar, ended of total,
/// failures, and as much of the label as fits.
fn list_line(batch: &Batch) -> String {
    let c = &batch.counts;
    let failures = c.failed + c.discarded;
    let failures = if failures > 0 { format!(" {failures} failed") } else { String::new() };
    let line = format!(
        "{:>7}  {:<9} {} {:>4}  {}/{}{failures}",
        batch.id,
        batch.state.as_str(),
        bar(batch.progress, 16),
        percent(batch.progress),
        c.ended(),
        c.total
    );
    match batch.label.as_deref() {
        Some(label) if line.chars().count() + 4 <= WIDTH => {
            let room = WIDTH - line.chars().count() - 2;
            format!("{line}  {}", clip(label, room))
        }
        _ => line,
    }
}

/// The terminal width the tables fit.
pub(super) const WIDTH: usize = 80;

async fn show(id: i64, json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let batch = match store.batch_get(id).await {
        Ok(Some(batch)) => batch,
        Ok(None) => return fail(format!("batch {id} does not exist")),
        Err(error) => return fail(error),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&batch).unwrap_or_default());
    } else {
        print!("{}", details(&batch));
    }
    ExitCode::SUCCESS
}

/// A batch in full, for a terminal.
fn details(batch: &Batch) -> String {
    let c = &batch.counts;
    // The label takes what is left of 80 columns, clipped with an ellipsis.
    let head = format!("batch {}", batch.id);
    let state = batch.state.as_str();
    let room = 80usize.saturating_sub(head.chars().count() + state.chars().count() + 5);
    let label = batch.label.as_deref().map(|l| format!(" {:?}", crate::text::clip(l, room))).unwrap_or_default();
    let mut text = format!("{head}{label}: {state}\n");
    // The percentage right-aligned, as the list's, so the figures line up.
    text +=
        &format!("  {} {:>4}  {} of {} ended\n", bar(batch.progress, 40), percent(batch.progress), c.ended(), c.total);
    text += &format!(
        "  pending {}  running {}  completed {}  failed {}  discarded {}  cancelled {}\n",
        c.pending, c.running, c.completed, c.failed, c.discarded, c.cancelled
    );
    for (kind, job) in batch.callbacks.named() {
        let fate = match (batch.callback_jobs.get(kind), batch.callback_errors.get(kind)) {
            (Some(id), _) => format!("enqueued as job {id}"),
            (None, Some(error)) => format!("refused: {error}"),
            (None, None) if batch.finished_at.is_some() => "not due".to_string(),
            (None, None) => match kind {
                "on_success" => "if it finishes with no member failed or discarded",
                "on_failure" => "if it finishes with a member failed or discarded",
                _ => "when it finishes",
            }
            .to_string(),
        };
        text += &format!("  {kind} {job}: {fate}\n");
    }
    let time = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    text += &format!("  created {}", time(batch.created_at));
    if let Some(closed) = batch.closed_at {
        text += &format!(", closed {}", time(closed));
    }
    if let Some(finished) = batch.finished_at {
        text += &format!("\n  finished {}", time(finished));
    }
    text + "\n"
}

/// A bar of `width` cells for a fraction from 0 to 1.
pub(super) fn bar(progress: f64, width: usize) -> String {
    let filled = ((progress.clamp(0.0, 1.0) * width as f64).floor() as usize).min(width);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(width - filled))
}

/// Whole percent, rounded down (so 100% means done), past float noise.
pub(super) fn percent(progress: f64) -> String {
    format!("{}%", (progress.clamp(0.0, 1.0) * 100.0 + 1e-9).floor() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BatchCounts, BatchState};

    fn batch(label: &str, progress: f64) -> Batch {
        Batch {
            id: 1234567,
            label: Some(label.into()),
            state: BatchState::Closed,
            counts: BatchCounts { total: 100000, completed: 45000, failed: 12000, ..Default::default() },
            progress,
            callbacks: Callbacks::default(),
            callback_payload: serde_json::json!({}),
            callback_jobs: Default::default(),
            callback_errors: Default::default(),
            created_at: chrono::Utc::now(),
            closed_at: None,
            finished_at: None,
        }
    }

    #[test]
    fn details_fit_80_columns_and_say_which_callbacks_are_conditional() {
        let mut long = batch("a nightly import of every account we have, and then some more of them", 0.57);
        long.callbacks = Callbacks {
            on_finish: Some("report".into()),
            on_success: Some("celebrate".into()),
            on_failure: Some("page_someone".into()),
        };
        let text = details(&long);
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "{} columns: {line}", line.chars().count());
        }
        assert!(text.starts_with("batch 1234567 \"a nightly import of every account we have"), "{text}");
        assert!(text.lines().next().unwrap().ends_with("…\": closed"), "{text}");
        assert!(text.contains("on_finish report: when it finishes\n"), "{text}");
        assert!(text.contains("on_success celebrate: if it finishes with no member failed or discarded\n"), "{text}");
        assert!(text.contains("on_failure page_someone: if it finishes with a member failed or discarded\n"), "{text}");
        let short = details(&batch("nightly", 0.5));
        assert!(short.starts_with("batch 1234567 \"nightly\": closed\n"), "{short}");
    }

    #[test]
    fn a_list_line_fits_80_columns_and_its_bar_is_to_scale() {
        let line = list_line(&batch("a nightly import of every account we have", 0.57));
        assert!(line.chars().count() <= 80, "{} columns: {line}", line.chars().count());
        assert!(line.contains("[#########-------]  57%"), "{line}");
        assert!(line.contains("57000/100000 12000 failed  a nightl…"), "{line}");
        assert_eq!(line.chars().count(), 80, "the label takes the room left");
        assert_eq!(bar(0.0, 4), "[----]");
        assert_eq!(bar(1.0, 4), "[####]");
    }

    #[test]
    fn details_fit_80_columns() {
        let now = chrono::Utc::now();
        let finished = Batch { closed_at: Some(now), finished_at: Some(now), ..batch("x", 0.5) };
        for line in details(&finished).lines() {
            assert!(line.chars().count() <= 80, "{line}");
        }
    }
}
