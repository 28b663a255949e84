//! The `jobhost` command line: flag definitions and the commands behind them.
//! Exit codes are an [`Exit`].
//!
//! Flags shared by several commands are defined here; the commands live in
//! `run` (the one that runs jobs), `serve` (the HTTP server alone; both
//! stop through `signals`), `operator` (the commands that read or change
//! the database and exit), `deploy` (components deployed through the
//! database) and `components` (the commands that work on component files
//! without a database).

mod audit;
mod batch;
mod components;
mod deploy;
mod event;
mod grant;
mod job_view;
mod new;
mod operator;
mod run;
mod schedule;
mod secret;
mod serve;
mod signals;
mod token;
mod variable;
mod webhook;
mod workflow;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::component::Runtime;
use crate::config::RuntimeConfig;

/// How a command ended, as its exit code tells scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// It did what was asked (a waited-for job completed).
    Success = 0,
    /// A job ran but did not complete (a waited-for one failed).
    JobFailed = 1,
    /// Bad input (a component that does not load, a payload that is not
    /// JSON, an unknown job type) or a host error (a host task that
    /// panicked among them).
    Error = 2,
    /// A concurrency limit refused the job (`on_conflict = raise`).
    LimitReached = 3,
    /// A waited-for job was discarded.
    JobDiscarded = 4,
    /// A waited-for job was cancelled.
    JobCancelled = 5,
    /// A waited-for job did not end within the wait.
    WaitTimedOut = 6,
    /// A host stopped by a second SIGINT or SIGTERM: 128 + SIGINT, as a
    /// shell reports a process interrupted by Ctrl-C.
    Forced = 130,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

/// A durable background-job host whose handlers are WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "jobhost", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More log output (repeat for more); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// How log lines are written to stderr: `text` for people, `json` (one
    /// object per line, with the run's job id, type, attempt and host on
    /// every line about a run) for log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The form of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

impl Cli {
    /// The log filter the flags ask for.
    pub fn log_filter(&self) -> &'static str {
        // `exec` and `watch` print each guest log line and each load in
        // their own report: the logs would say it all a second time.
        let reports_itself = matches!(self.command, Command::Exec(_) | Command::Watch { .. });
        match self.verbose {
            0 if reports_itself => "warn,jobhost::guest=off",
            0 => "warn,jobhost=info",
            1 => "info,jobhost=debug",
            _ => "debug,jobhost=trace",
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a host: serve the components in a directory from the database's queues.
    Run(Box<run::RunArgs>),
    /// Serve the HTTP API, the dashboard and Prometheus metrics, without
    /// running jobs (`run --http` serves them from a worker host).
    Serve(serve::ServeArgs),
    /// Apply database migrations and exit.
    Migrate(DbArgs),
    /// Enqueue a job (or, with --file, one job per line of JSON payloads); prints the ids.
    Enqueue(operator::EnqueueArgs),
    /// List jobs, newest first.
    Jobs(operator::JobsArgs),
    /// Show one job: payload, attempts and errors, log, output and progress
    /// (live while it runs); or, with --wait, wait for it to end.
    Job {
        /// The job's id.
        id: i64,
        /// Print its attempts as a timeline (host, start, run time, how
        /// each ended, its error, the wait before the next), and nothing else.
        #[arg(long, conflicts_with_all = ["wait", "json"])]
        attempts: bool,
        /// The whole document `GET /api/jobs/ID` answers, as JSON.
        #[arg(long, conflicts_with = "wait")]
        json: bool,
        #[command(flatten)]
        wait: operator::WaitArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Batches of jobs: counted as their members end, with callback jobs
    /// enqueued once when the last one has.
    Batch {
        #[command(subcommand)]
        action: batch::BatchAction,
    },
    /// Workflows: steps that wait for other steps and receive their outputs.
    Workflow {
        #[command(subcommand)]
        action: workflow::WorkflowAction,
    },
    /// Events: sent by applications, operators or webhooks, each ending the
    /// durable waits of workflow steps it matches.
    #[command(visible_alias = "events")]
    Event {
        #[command(subcommand)]
        action: event::EventAction,
    },
    /// Schedules made at run time, one per job type and key: add, set,
    /// pause, resume, remove, trigger, backfill, list, show.
    Schedule {
        #[command(subcommand)]
        action: schedule::ScheduleAction,
    },
    /// Inbound webhooks: signed requests to /hooks/NAME become events.
    Webhook {
        #[command(subcommand)]
        action: webhook::WebhookAction,
    },
    /// Counts by state and queue, the oldest wait, and live hosts.
    Stats {
        /// One JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Run a failed, discarded or cancelled job again, or a scheduled one now.
    Retry {
        /// The job's id.
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Cancel a job: at once when scheduled, available or blocked; a running
    /// one is stopped by its host within two heartbeats and archived as cancelled.
    Cancel {
        /// The job's id.
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Pause or resume a queue: no host leases a job from a paused queue
    /// (running jobs finish); `stats` shows which are paused.
    Queue {
        #[command(subcommand)]
        action: QueueAction,
    },
    /// Per concurrency key: its limit, the jobs holding its slots (and their
    /// hosts), how many jobs are blocked and how long the oldest has waited.
    /// Then per rate key counting starts now: its starts in the window
    /// against its limit, and a throttle in force (docs/rate-limits.md).
    Concurrency {
        /// One JSON object per key, one per line (a rate key's has `starts_in_window`).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Every schedule: per scheduled job type, its cron expression and
    /// zone, the last tick enqueued, the next tick, and whether a live host
    /// serves it (without one it does not tick); then the schedules made at
    /// run time, by type and key.
    Schedules {
        /// One JSON object per job type, one per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Validate a component as a host loads it and store it in the database:
    /// every host serving `--components db` loads it within seconds, and it
    /// replaces the type's version fleet-wide (running jobs finish on theirs).
    Deploy(deploy::DeployArgs),
    /// Stop serving a job type from the database (hosts unload it; its jobs wait).
    Undeploy(deploy::UndeployArgs),
    /// Serve an earlier deployed version of a job type again.
    Rollback(deploy::RollbackArgs),
    /// Each job type's deployed version and the version every live host serves.
    Components(deploy::ComponentsArgs),
    /// Let a job type's runs send HTTP requests to an origin its component
    /// declares (both must allow a request); obeyed from each host's next run.
    Grant(grant::GrantArgs),
    /// Take back a grant of outbound HTTP.
    Revoke(grant::RevokeArgs),
    /// The grants of outbound HTTP, by job type and origin.
    Grants(grant::GrantsArgs),
    /// Secrets outbound requests may carry: sealed with the hosts' key,
    /// never shown, and given to a guest only as a placeholder.
    Secret {
        #[command(subcommand)]
        action: secret::SecretAction,
    },
    /// The audit trail: who changed what, when and from where.
    Audit(audit::AuditArgs),
    /// Named tokens with roles, for the HTTP API and the dashboard.
    Token {
        #[command(subcommand)]
        action: token::TokenAction,
    },
    /// Plain variables of a job type, given to its runs' environment in clear.
    Var {
        #[command(subcommand)]
        action: variable::VarAction,
    },
    /// Load components and print the validated configuration each declares,
    /// one JSON object per line.
    Inspect {
        /// Component files (.wasm).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Indent the JSON.
        #[arg(long)]
        pretty: bool,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
    /// Run one job in a sandbox, without a queue: its output on stdout, its
    /// logs and how it went on stderr; non-zero exit unless it completed.
    Exec(components::ExecArgs),
    /// Write a ready-to-build handler project: its source, the WIT, a build
    /// script, a sample payload.
    New(new::NewArgs),
    /// Follow a directory of components, printing what loads, reloads, fails
    /// and unloads, until interrupted.
    Watch {
        /// The directory of components.
        #[arg(long, env = "JOBHOST_COMPONENTS")]
        components: PathBuf,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
}

/// What to do with a queue.
#[derive(Debug, Subcommand)]
enum QueueAction {
    /// Stop every host from leasing jobs of this queue.
    Pause {
        /// The queue's name.
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Let hosts lease jobs of this queue again.
    Resume {
        /// The queue's name.
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// Where the database is.
#[derive(Debug, Args, Clone)]
struct DbArgs {
    /// The database: sqlite://PATH for the embedded file (several hosts on
    /// one machine may share it), or postgres://USER@HOST/DB for a fleet.
    #[arg(long, env = "DATABASE_URL", default_value = crate::store::DEFAULT_DATABASE_URL)]
    database_url: String,
    /// The largest payload an enqueue accepts, as JSON text (e.g. 4MiB); for
    /// `run`, the largest a running job may give a child [default: 1MiB].
    #[arg(long, env = "JOBHOST_MAX_PAYLOAD", value_parser = parse_bytes)]
    max_payload: Option<u64>,
}

impl DbArgs {
    fn limits(&self) -> crate::store::EnqueueLimits {
        let mut limits = crate::store::EnqueueLimits::default();
        if let Some(bytes) = self.max_payload {
            limits.max_payload_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        limits
    }
}

/// Settings of the component runtime shared by every command.
#[derive(Debug, Args)]
struct RuntimeArgs {
    /// Memory cap of a run whose component declares none (e.g. 128MiB).
    #[arg(long, value_parser = parse_bytes)]
    default_memory: Option<u64>,
    /// Timeout of a run whose component declares none (e.g. 5m).
    #[arg(long, value_parser = parse_duration)]
    default_timeout: Option<Duration>,
    /// The largest memory cap a component may declare (e.g. 256MiB); every
    /// slot of the instance pool is sized to it [default: 1GiB].
    #[arg(long, value_parser = parse_bytes)]
    max_memory: Option<u64>,
    /// Address space reserved for each memory slot of the instance pool, at
    /// least --max-memory. Without it each slot reserves 4GiB and guests need
    /// no bounds checks; with it a high --concurrency reserves far less, and
    /// guests' memory accesses are checked explicitly (somewhat slower).
    #[arg(long, value_parser = parse_bytes)]
    memory_reservation: Option<u64>,
    /// Where compiled components are cached [default: the user's cache directory].
    #[arg(long, env = "JOBHOST_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile every component afresh instead of using the cache.
    #[arg(long)]
    no_cache: bool,
    /// The largest output a run may return, as JSON text (e.g. 4MiB); a
    /// larger one fails the job without retry [default: 1MiB].
    #[arg(long, env = "JOBHOST_MAX_OUTPUT", value_parser = parse_bytes)]
    max_output: Option<u64>,
    /// The most bytes one run may make the host hold: children's payloads,
    /// log lines, kept stdout and stderr, and the output [default: 16MiB].
    #[arg(long, env = "JOBHOST_RUN_BUDGET", value_parser = parse_bytes)]
    run_budget: Option<u64>,
    /// The most bytes of outbound HTTP bodies, sent and received together,
    /// one run may move; past it the request fails in the guest [default: 64MiB].
    #[arg(long, env = "JOBHOST_OUTBOUND_BUDGET", value_parser = parse_bytes)]
    outbound_budget: Option<u64>,
}

impl RuntimeArgs {
    fn config(&self) -> RuntimeConfig {
        let mut config = RuntimeConfig::default();
        if let Some(bytes) = self.default_memory {
            config.default_memory_limit_bytes = bytes;
        }
        if let Some(timeout) = self.default_timeout {
            config.default_timeout = timeout;
        }
        if let Some(bytes) = self.max_memory {
            config.max_memory_limit_bytes = bytes;
        }
        config.memory_reservation_bytes = self.memory_reservation;
        if self.cache_dir.is_some() {
            config.cache_dir = self.cache_dir.clone();
        }
        if self.no_cache {
            config.cache_dir = None;
        }
        if let Some(bytes) = self.max_output {
            config.max_output_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        if let Some(bytes) = self.run_budget {
            config.run_budget_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        if let Some(bytes) = self.outbound_budget {
            config.outbound_budget_bytes = bytes;
        }
        config
    }
}

/// Parses a duration (`30s`, `5m`, `2h 30m`, `7days`), saying the expected
/// form when it is not one: humantime's own errors ("expected number at
/// 0") do not.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    if text.trim_start().starts_with('-') {
        return Err("must not be negative: give a duration such as 30s, 5m, 2h or 7days".to_string());
    }
    const FORM: &str = "give one such as 30s, 5m, 2h or 7days";
    humantime::parse_duration(text).map_err(|error| match error {
        // Names the units it knows; the other errors only point at a character.
        humantime::DurationError::UnknownUnit { .. } => format!("{error}: {FORM}"),
        _ => format!("not a duration: {FORM}"),
    })
}

/// Parses a time for `--at`: RFC 3339 with its zone, saying so when it is not.
fn parse_time(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(text.trim()).map(|t| t.with_timezone(&chrono::Utc)).map_err(|e| {
        format!("not a time ({e}): give an RFC 3339 time with its zone, such as 2026-12-24T18:00:00Z or 2026-12-24T19:00:00+01:00")
    })
}

/// Parses a count that must be at least 1: a flag where 0 would do
/// nothing, or stall a host, is refused by name before anything starts.
fn at_least_one<T>(text: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + From<u8>,
{
    match text.parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        _ => Err("must be a whole number, at least 1 (e.g. 10)".to_string()),
    }
}

/// Parses `1048576`, `512KiB`, `64MiB` or `1GiB`.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| format!("{text:?} is not a size like 64MiB"))?;
    let scale = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?}; use B, KiB, MiB or GiB")),
    };
    number.checked_mul(scale).ok_or_else(|| format!("{text:?} is too large"))
}

/// Runs a parsed command line to its exit code.
pub fn main(cli: Cli) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => return fail(format!("cannot start the async runtime: {error}")),
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(*args).await,
            Command::Serve(args) => serve::serve(args).await,
            Command::Migrate(db) => operator::migrate(&db).await,
            Command::Enqueue(args) => operator::enqueue(args).await,
            Command::Jobs(args) => operator::jobs(args).await,
            Command::Job { id, attempts, json, wait, db } => {
                let view = match (attempts, json) {
                    (true, _) => operator::JobView::Attempts,
                    (_, true) => operator::JobView::Json,
                    _ => operator::JobView::Text,
                };
                operator::job(id, view, &wait, &db).await
            }
            Command::Batch { action } => batch::run(action).await,
            Command::Workflow { action } => workflow::run(action).await,
            Command::Event { action } => event::run(action).await,
            Command::Schedule { action } => schedule::run(action).await,
            Command::Webhook { action } => webhook::run(action).await,
            Command::Stats { json, db } => operator::stats(json, &db).await,
            Command::Retry { id, db } => operator::retry(id, &db).await,
            Command::Cancel { id, db } => operator::cancel(id, &db).await,
            Command::Queue { action: QueueAction::Pause { name, db } } => operator::queue_pause(&name, true, &db).await,
            Command::Queue { action: QueueAction::Resume { name, db } } => {
                operator::queue_pause(&name, false, &db).await
            }
            Command::Concurrency { json, db } => operator::concurrency(json, &db).await,
            Command::Schedules { json, db } => schedule::schedules(json, &db).await,
            Command::Deploy(args) => deploy::deploy(args).await,
            Command::Undeploy(args) => deploy::undeploy(args).await,
            Command::Rollback(args) => deploy::rollback(args).await,
            Command::Components(args) => deploy::components(args).await,
            Command::Grant(args) => grant::grant(args).await,
            Command::Revoke(args) => grant::revoke(args).await,
            Command::Grants(args) => grant::grants(args).await,
            Command::Secret { action } => secret::run(action).await,
            Command::Var { action } => variable::run(action).await,
            Command::Audit(args) => audit::run(args).await,
            Command::Token { action } => token::run(action).await,
            Command::Inspect { files, pretty, runtime } => components::inspect(files, pretty, &runtime).await,
            Command::Exec(args) => components::exec(args).await,
            Command::Watch { components, runtime } => components::watch(components, &runtime).await,
            Command::New(args) => new::new(args),
        }
    });
    // A compile abandoned at shutdown may still run on a blocking thread;
    // the command is done, so it is not waited for.
    runtime.shutdown_background();
    code
}

/// A listing that found nothing says so, and what would put something
/// there, on stderr, so a script reading stdout sees no line (and `--json`
/// prints nothing at all).
fn say_if_none(shown: usize, json: bool, explanation: &str) {
    if shown == 0 && !json {
        eprintln!("{explanation}");
    }
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    Exit::Error.into()
}

/// A store error, with exit code 3 when a concurrency limit refused the job
/// (`on_conflict = raise`), so scripts can tell "full" from "broken".
fn fail_store(error: crate::store::Error) -> ExitCode {
    if matches!(error, crate::store::Error::LimitReached(_)) {
        eprintln!("error: {error}");
        return Exit::LimitReached.into();
    }
    fail(error)
}

fn start_runtime(args: &RuntimeArgs) -> Result<Runtime, ExitCode> {
    Runtime::new(args.config()).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("MiB").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
