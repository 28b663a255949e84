//! The operator commands: `migrate`, `enqueue`, `jobs`, `job`, `stats`,
//! `retry`, `cancel`, `queue pause`/`resume` and `concurrency`
//! (`batch` is in [`super::batch`], `schedules` in [`super::schedule`]). Each opens
//! the database, does one thing and exits; none runs jobs (that is the host
//! command, in [`super::run`]).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;

use super::{DbArgs, Exit, fail, fail_store};
use crate::store::{Cancel, EnqueueParams, Enqueued, JobFilter, JobState, Store};

/// Payload lines inserted per transaction by `enqueue --file`.
const BULK_CHUNK: usize = 5_000;

/// Opens the database for commands that add work (`enqueue`, `batch
/// create`, `workflow create`): an embedded file is created and migrated, as
/// a host would, so none is left half made; a server's database must have
/// been migrated (`jobhost migrate`), which these commands do not do to it.
pub(super) async fn open(db: &DbArgs) -> Result<Store, ExitCode> {
    let store = crate::store::open_with(&db.database_url, 2, db.limits()).await.map_err(fail)?.acting_as(cli_actor());
    match store.schema_present().await {
        Ok(true) => Ok(store),
        Ok(false) if db.database_url.starts_with("sqlite:") => match store.schema_migrate().await {
            Ok(()) => Ok(store),
            Err(error) => Err(fail(error)),
        },
        Ok(false) => Err(no_schema(&store)),
        Err(error) => Err(fail(error)),
    }
}

/// Opens the database for commands that read or change what is there
/// already: a mistyped file name is reported, not created, and a database
/// without jobhost's schema is named with the command that makes it.
pub(super) async fn open_existing(db: &DbArgs) -> Result<Store, ExitCode> {
    let store =
        crate::store::open_existing(&db.database_url, 2, db.limits()).await.map_err(fail)?.acting_as(cli_actor());
    match store.schema_present().await {
        Ok(true) => Ok(store),
        Ok(false) => Err(no_schema(&store)),
        Err(error) => Err(fail(error)),
    }
}

/// The audit trail's actor of a command: the OS user at this machine.
pub(super) fn cli_actor() -> crate::store::audit::Actor {
    crate::store::audit::Actor::os_user(crate::store::audit::Via::Cli)
}

fn no_schema(store: &Store) -> ExitCode {
    fail(format!(
        "{} has no jobhost schema yet: run `jobhost migrate` first (a host started with `jobhost run` migrates too)",
        store.location()
    ))
}

pub async fn migrate(db: &DbArgs) -> ExitCode {
    let store = match crate::store::open_with(&db.database_url, 2, db.limits()).await.map_err(fail) {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.schema_migrate().await {
        Ok(()) => {
            println!("migrations applied");
            ExitCode::SUCCESS
        }
        Err(error) => fail(error),
    }
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The job type.
    job: String,
    /// The payload, a JSON object.
    #[arg(long, conflicts_with = "file")]
    payload: Option<String>,
    /// A file of payloads, one JSON object per line, enqueued in bulk ("-" for stdin).
    #[arg(long)]
    file: Option<PathBuf>,
    /// The queue, instead of the job type's.
    #[arg(long)]
    queue: Option<String>,
    /// The priority, instead of the job type's (lower runs first).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i16>,
    /// Run no earlier than this long from now (e.g. 30s, 5m).
    #[arg(long, value_parser = super::parse_duration, conflicts_with = "at", allow_hyphen_values = true)]
    delay: Option<Duration>,
    /// Run no earlier than this time (RFC 3339 with its zone, e.g. 2026-12-24T18:00:00Z).
    #[arg(long, value_parser = super::parse_time)]
    at: Option<DateTime<Utc>>,
    /// Add the job to this open batch as a member.
    #[arg(long)]
    batch: Option<i64>,
    /// The W3C trace context the job's run joins (00-TRACE-SPAN-FLAGS), as
    /// a CI step or a script inside a trace passes it on.
    #[arg(long, env = "TRACEPARENT", value_name = "TRACEPARENT")]
    traceparent: Option<String>,
    /// Print {"id": …} per job instead of bare ids.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    wait: WaitArgs,
    #[command(flatten)]
    db: DbArgs,
}

/// Waiting for a job to end.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Wait for the job to end and print its output; the exit code tells how
    /// it ended: 0 completed, 1 failed, 4 discarded, 5 cancelled, 6 not
    /// ended within --timeout.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits (e.g. 30s, 10m).
    #[arg(long, value_parser = super::parse_duration, default_value = "30s", requires = "wait")]
    timeout: Duration,
}

impl EnqueueArgs {
    fn params(&self, payload: serde_json::Value) -> EnqueueParams {
        EnqueueParams {
            queue: self.queue.clone(),
            priority: self.priority,
            run_at: self.at,
            delay_ms: self.delay.map(|d| d.as_millis() as u64),
            batch_id: self.batch,
            traceparent: self.traceparent.clone(),
            ..EnqueueParams::new(self.job.clone(), payload)
        }
    }
}

fn parse_payload(text: &str, what: &str) -> Result<serde_json::Value, ExitCode> {
    serde_json::from_str(text).map_err(|e| fail(format!("{what} is not valid JSON: {e}")))
}

pub async fn enqueue(args: EnqueueArgs) -> ExitCode {
    if args.wait.wait && args.file.is_some() {
        return fail("--wait waits for one job: give --payload, not --file");
    }
    let jobs = match &args.file {
        None => match parse_payload(args.payload.as_deref().unwrap_or("{}"), "--payload") {
            Ok(payload) => vec![args.params(payload)],
            Err(code) => return code,
        },
        Some(path) => match read_payload_lines(path) {
            Ok(payloads) => payloads.into_iter().map(|p| args.params(p)).collect(),
            Err(code) => return code,
        },
    };
    let store = match open(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let mut last = None;
    for chunk in jobs.chunks(BULK_CHUNK) {
        match store.job_enqueue_outcomes(chunk).await {
            Ok(outcomes) => {
                for outcome in outcomes {
                    if args.json {
                        println!("{}", enqueued_json(outcome));
                    } else {
                        println!("{}", enqueued_line(outcome));
                    }
                    last = Some(outcome.id());
                }
            }
            Err(error) => return fail_store(error),
        }
    }
    match last {
        Some(id) if args.wait.wait => wait_for(&store, id, args.wait.timeout).await,
        _ => ExitCode::SUCCESS,
    }
}

/// Waits for a job to end, prints its output (or its last error, on
/// stderr), and exits with a code telling how it ended.
async fn wait_for(store: &Store, id: i64, timeout: Duration) -> ExitCode {
    let job = match store.job_wait(id, timeout).await {
        Ok(Some(job)) => job,
        Ok(None) => {
            eprintln!("job {id} did not end within {}", humantime::format_duration(timeout));
            return Exit::WaitTimedOut.into();
        }
        Err(error) => return fail(error),
    };
    let output = job.output.as_ref().map_or("null".to_string(), |o| o.to_string());
    println!("{output}");
    if let Some(error) = &job.row.error {
        eprintln!("job {id} {}: {error}", job.row.state);
    }
    match job.row.state {
        JobState::Completed => Exit::Success,
        JobState::Failed => Exit::JobFailed,
        JobState::Discarded => Exit::JobDiscarded,
        _ => Exit::JobCancelled,
    }
    .into()
}

/// A new job is its bare id, so scripts can capture it; a duplicate (not
/// an error: exit code 0) names the job that holds its key.
pub(super) fn enqueued_line(outcome: Enqueued) -> String {
    match outcome {
        Enqueued::New(id) => id.to_string(),
        Enqueued::Duplicate(id) => format!("duplicate of {id}"),
        Enqueued::Replaced(id) => format!("duplicate of {id} (its payload replaced)"),
    }
}

pub(super) fn enqueued_json(outcome: Enqueued) -> serde_json::Value {
    match outcome {
        Enqueued::New(id) => serde_json::json!({ "id": id }),
        Enqueued::Duplicate(id) => serde_json::json!({ "id": id, "duplicate": true }),
        Enqueued::Replaced(id) => serde_json::json!({ "id": id, "duplicate": true, "replaced": true }),
    }
}

/// Every line a JSON payload; a bad line stops everything before anything
/// is enqueued, naming the line.
fn read_payload_lines(path: &Path) -> Result<Vec<serde_json::Value>, ExitCode> {
    read_lines(path, |line, number| parse_payload(line, &format!("line {number}")))
}

/// Each non-blank line of a file ("-" for stdin) read by `parse`, given the
/// line and its 1-based number; the first error stops the reading.
pub(super) fn read_lines<T>(
    path: &Path,
    mut parse: impl FnMut(&str, usize) -> Result<T, ExitCode>,
) -> Result<Vec<T>, ExitCode> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        match std::fs::File::open(path) {
            Ok(file) => Box::new(std::io::BufReader::new(file)),
            Err(error) => return Err(fail(format!("cannot read {}: {error}", path.display()))),
        }
    };
    let mut read = Vec::new();
    for (number, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
        if !line.trim().is_empty() {
            read.push(parse(&line, number + 1)?);
        }
    }
    Ok(read)
}

#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Only jobs in this state.
    #[arg(long, value_parser = parse_state)]
    state: Option<JobState>,
    /// Only jobs of this type.
    #[arg(long)]
    job: Option<String>,
    /// Only jobs of this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only jobs with this rendered concurrency key.
    #[arg(long)]
    key: Option<String>,
    /// Only members of this batch.
    #[arg(long)]
    batch: Option<i64>,
    /// At most this many.
    #[arg(long, default_value_t = 100, value_parser = super::at_least_one::<i64>)]
    limit: i64,
    /// One JSON object per job, per line.
    #[arg(long)]
    json: bool,
    /// With --json: each job's whole document (payload, output, log,
    /// attempts), as `jobhost job ID --json` prints it, one per line as it
    /// is read; at most 1000 (--limit).
    #[arg(long, requires = "json")]
    full: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// The most jobs `jobs --json --full` prints: each is read whole, one at a time.
const MAX_FULL_JOBS: i64 = 1000;

fn parse_state(name: &str) -> Result<JobState, String> {
    JobState::parse(name).ok_or_else(|| {
        let names: Vec<_> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown state {name:?}; one of {}", names.join(", "))
    })
}

pub async fn jobs(args: JobsArgs) -> ExitCode {
    if args.full && args.limit > MAX_FULL_JOBS {
        return fail(format!(
            "--full reads each job whole: at most {MAX_FULL_JOBS} at once (--limit), then the next page with \
             --state/--job filters or the API's cursor"
        ));
    }
    let store = match open_existing(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let filter = JobFilter {
        state: args.state,
        job: args.job,
        queue: args.queue,
        concurrency_key: args.key,
        batch_id: args.batch,
        limit: args.limit,
        ..JobFilter::default()
    };
    let rows = match store.job_list(&filter).await {
        Ok(rows) => rows,
        Err(error) => return fail(error),
    };
    for row in &rows {
        if args.full {
            match store.job_get(row.id).await {
                Ok(Some(detail)) => println!("{}", job_document(&detail)),
                // Archived and pruned since the listing: nothing to print.
                Ok(None) => {}
                Err(error) => return fail(error),
            }
        } else if args.json {
            println!("{}", serde_json::to_string(row).unwrap_or_default());
        } else {
            for line in job_lines(row) {
                println!("{line}");
            }
        }
    }
    super::say_if_none(rows.len(), args.json, "no jobs match");
    ExitCode::SUCCESS
}

/// A job in a listing within 80 columns: id, state, type, queue and
/// attempts; then its error, if any, on an indented line of its own, on
/// one line however many the error has (`jobhost job ID` shows it whole).
fn job_lines(row: &crate::store::JobRow) -> Vec<String> {
    let line = format!("{:>8}  {:<10} {:<20} {:<12} attempt {}", row.id, row.state, row.job, row.queue, row.attempts);
    let mut lines = vec![crate::text::clip(&line, 80)];
    if let Some(error) = &row.error {
        let error = error.split_whitespace().collect::<Vec<_>>().join(" ");
        lines.push(crate::text::clip(&format!("{:10}{error}", ""), 80));
    }
    lines
}

/// A job's whole document on one line, with its attempts: what `GET
/// /api/jobs/ID` answers.
fn job_document(detail: &crate::store::JobDetail) -> String {
    serde_json::to_string(&crate::attempts::with_attempts(detail)).unwrap_or_default()
}

/// How `jobhost job ID` shows the job.
#[derive(Debug, Clone, Copy)]
pub enum JobView {
    /// For a person, within 80 columns.
    Text,
    /// Its attempts as a timeline.
    Attempts,
    /// The API's document, pretty-printed.
    Json,
}

pub async fn job(id: i64, view: JobView, wait: &WaitArgs, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    if wait.wait {
        return wait_for(&store, id, wait.timeout).await;
    }
    match store.job_get(id).await {
        Ok(Some(detail)) => {
            match view {
                JobView::Attempts => print!("{}", crate::attempts::lines(&crate::attempts::of(&detail))),
                JobView::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&crate::attempts::with_attempts(&detail)).unwrap_or_default()
                ),
                JobView::Text => {
                    for line in super::job_view::lines(&detail) {
                        println!("{line}");
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Ok(None) => fail(format!("job {id} does not exist")),
        Err(error) => fail(error),
    }
}

pub async fn stats(json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let stats = match store.job_stats().await {
        Ok(stats) => stats,
        Err(error) => return fail(error),
    };
    if json {
        println!("{}", serde_json::to_string(&stats).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    for (state, count) in &stats.states {
        println!("{state:<10} {count}");
    }
    for (queue, states) in &stats.queues {
        let counts: Vec<String> = states.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let paused = if stats.paused_queues.contains(queue) { " (paused)" } else { "" };
        for line in crate::text::wrap_list(&format!("queue {queue}{paused}:"), &counts, 80) {
            println!("{line}");
        }
    }
    for queue in stats.paused_queues.iter().filter(|q| !stats.queues.contains_key(*q)) {
        println!("queue {queue} (paused): empty");
    }
    if let Some(secs) = stats.oldest_available_secs {
        println!("oldest available job has waited {secs:.1} s");
    }
    println!("hosts alive: {}", stats.hosts_alive);
    for host in &stats.hosts_silent {
        println!(
            "host presumed dead: {} (silent {:.1} s, heartbeat every {} ms)",
            host.id, host.silent_secs, host.heartbeat_ms
        );
    }
    for down in &stats.watchers_down {
        println!(
            "warning: host {} is not watching its components directory (rescanning on an interval): {}",
            down.host, down.error
        );
    }
    for mixed in &stats.mixed_components {
        let served: Vec<String> = mixed
            .digests
            .iter()
            .map(|(digest, hosts)| format!("{} by {}", digest.get(..12).unwrap_or(digest), hosts.join(", ")))
            .collect();
        println!(
            "warning: type {} is served with {} different components: {}",
            mixed.job,
            mixed.digests.len(),
            served.join("; ")
        );
    }
    ExitCode::SUCCESS
}

pub async fn retry(id: i64, db: &DbArgs) -> ExitCode {
    operate(db, |store| async move {
        store.job_retry(id).await?;
        Ok(format!("job {id} will run again"))
    })
    .await
}

pub async fn cancel(id: i64, db: &DbArgs) -> ExitCode {
    operate(db, |store| async move {
        Ok(match store.job_cancel(id).await? {
            Cancel::Cancelled => format!("job {id} cancelled"),
            Cancel::Requested => {
                format!("job {id} is running: its host stops it within two heartbeats and archives it as cancelled")
            }
        })
    })
    .await
}

pub async fn queue_pause(queue: &str, pause: bool, db: &DbArgs) -> ExitCode {
    if let Err(reason) = crate::types::check_name(queue) {
        return fail(format!("queue {reason}"));
    }
    let queue = queue.to_string();
    operate(db, |store| async move {
        let changed = if pause { store.queue_pause(&queue).await? } else { store.queue_resume(&queue).await? };
        Ok(match (pause, changed) {
            (true, true) => format!("queue {queue} paused: no host leases from it; running jobs finish"),
            (true, false) => format!("queue {queue} was paused already"),
            (false, true) => format!("queue {queue} resumed"),
            (false, false) => format!("queue {queue} was not paused"),
        })
    })
    .await
}

/// Runs one operator action and prints what it did.
async fn operate<F, Fut>(db: &DbArgs, action: F) -> ExitCode
where
    F: FnOnce(Store) -> Fut,
    Fut: std::future::Future<Output = crate::store::Result<String>>,
{
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match action(store).await {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(error) => fail_store(error),
    }
}

pub async fn concurrency(json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let keys = match store.semaphore_list().await {
        Ok(keys) => keys,
        Err(error) => return fail(error),
    };
    for key in &keys {
        if json {
            println!("{}", serde_json::to_string(key).unwrap_or_default());
            continue;
        }
        for line in key_lines(key) {
            println!("{line}");
        }
    }
    let rate_keys = match store.rate_key_list().await {
        Ok(keys) => keys,
        Err(error) => return fail(error),
    };
    for key in &rate_keys {
        if json {
            println!("{}", serde_json::to_string(key).unwrap_or_default());
        } else {
            for line in rate_key_lines(key) {
                println!("{line}");
            }
        }
    }
    super::say_if_none(
        keys.len() + rate_keys.len(),
        json,
        "no keys in use: no concurrency key has holders or blocked jobs, and no rate key counts starts or a throttle",
    );
    ExitCode::SUCCESS
}

/// A concurrency key within 80 columns: its slots and blocked jobs on the
/// first line (the key shortened if it must be), then each holder on a line
/// of its own (its host, or its state while no host has it).
fn key_lines(key: &crate::store::concurrency::KeyStatus) -> Vec<String> {
    const WIDTH: usize = 80;
    let limit = key.limit.map_or("none".to_string(), |l| l.to_string());
    let oldest = key.oldest_blocked_secs.map_or(String::new(), |secs| format!(", oldest waited {secs:.1} s"));
    let rest = format!("{}/{limit} slots, {} blocked{oldest}", key.holders, key.blocked);
    let mut lines = key_head(&key.job, &key.key, &rest);
    for holder in &key.holding {
        let line = match &holder.host_id {
            Some(host) => format!("  {} on {host}", holder.id),
            None => format!("  {} ({})", holder.id, holder.state),
        };
        lines.push(crate::text::clip(&line, WIDTH));
    }
    lines
}

/// A rate key within 80 columns: its starts in the window against its
/// limit on the first line (the key shortened if it must be), then its
/// throttle in force and what it sent back on a second, indented line.
fn rate_key_lines(key: &crate::store::rate::RateKeyStatus) -> Vec<String> {
    const WIDTH: usize = 80;
    let rest = match (key.limit, key.period_ms) {
        (Some(limit), Some(period_ms)) => {
            format!("{}/{limit} starts in {}", key.starts_in_window, crate::text::millis(period_ms))
        }
        _ => "no rate limit".to_string(),
    };
    let mut lines = key_head(&key.job, &key.key, &rest);
    // The throttle's end is in `--json`.
    let mut facts = Vec::new();
    if let Some(secs) = key.throttled_secs {
        facts.push(format!("throttled {secs:.1} s more"));
    }
    facts.push(format!("{} sent back", key.sent_back));
    facts.push(crate::text::count(key.throttles, "throttle", "throttles"));
    lines.push(crate::text::clip(&format!("  {}", facts.join(", ")), WIDTH));
    lines
}

/// A key's first line, `TYPE "KEY": REST`, with the key shortened to fit
/// 80 columns; when the type's name leaves too little room for the key,
/// the type and key take a line and `REST` the next, indented.
fn key_head(job: &str, key: &str, rest: &str) -> Vec<String> {
    const WIDTH: usize = 80;
    const MIN_KEY: usize = 12;
    let room = WIDTH.saturating_sub(job.chars().count() + 5 + rest.chars().count());
    if room >= MIN_KEY || room >= key.chars().count() {
        return vec![format!("{job} {:?}: {rest}", crate::text::clip(key, room))];
    }
    let room = WIDTH.saturating_sub(job.chars().count() + 3).max(MIN_KEY);
    vec![crate::text::clip(&format!("{job} {:?}", crate::text::clip(key, room)), WIDTH), format!("  {rest}")]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::concurrency::{Holder, KeyStatus};

    #[test]
    fn a_key_with_a_long_name_and_holders_on_long_host_names_fits_80_columns() {
        let holder = |id, host: Option<&str>| Holder {
            id,
            state: if host.is_some() { "running" } else { "available" }.into(),
            host_id: host.map(str::to_string),
        };
        let key = KeyStatus {
            job: "sync_account".into(),
            key: "account:4f1d2c3b-9a8e-4b7c-8d6e-5f4a3b2c1d0e/region:eu-central-1/tenant:acme".into(),
            limit: Some(2),
            holders: 2,
            holding: vec![
                holder(812, Some("worker-eu-central-1a.internal.example.com-4411-a1b2c3d4")),
                holder(813, None),
            ],
            blocked: 37,
            oldest_blocked_secs: Some(4.25),
        };
        let lines = key_lines(&key);
        for line in &lines {
            assert!(line.chars().count() <= 80, "{} columns: {line}", line.chars().count());
        }
        assert!(lines[0].starts_with("sync_account \"account:4f1d"), "{}", lines[0]);
        assert!(lines[0].ends_with("…\": 2/2 slots, 37 blocked, oldest waited 4.2 s"), "{}", lines[0]);
        assert_eq!(lines[1], "  812 on worker-eu-central-1a.internal.example.com-4411-a1b2c3d4");
        assert_eq!(lines[2], "  813 (available)");
    }
}
