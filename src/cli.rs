//! The `jobhost` command line: flag definitions and the commands behind them.
//! Exit codes: 0 success, 1 a job ran but did not complete, 2 bad input (a
//! component that does not load, a payload that is not JSON) or a host error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::component::{DirectoryWatcher, Registry, RegistryEvent, Runtime, StopSignal, WatcherConfig};
use crate::config::RuntimeConfig;
use crate::types::{JobContext, RunOutcome, RunReport};

/// A durable background-job host whose handlers are WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "jobhost", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More log output (repeat for more); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

impl Cli {
    /// The log filter the flags ask for.
    pub fn log_filter(&self) -> &'static str {
        match self.verbose {
            0 => "warn,jobhost=info",
            1 => "info,jobhost=debug",
            _ => "debug,jobhost=trace",
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load components and print the job configuration each declares.
    Inspect {
        /// Component files (.wasm).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// One JSON object per component, per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
    /// Run one job in a sandbox, without a queue, and print what happened.
    Exec {
        /// The component file (.wasm).
        file: PathBuf,
        /// The job's payload, a JSON document.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// The attempt number the job is told it is on.
        #[arg(long, default_value_t = 1)]
        attempt: u32,
        /// Print the full report as one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
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

/// Settings of the component runtime shared by every command.
#[derive(Debug, Args)]
struct RuntimeArgs {
    /// Memory cap of a run whose component declares none (e.g. 128MiB).
    #[arg(long, value_parser = parse_bytes)]
    default_memory: Option<u64>,
    /// Timeout of a run whose component declares none (e.g. 5m).
    #[arg(long, value_parser = humantime::parse_duration)]
    default_timeout: Option<Duration>,
    /// Where compiled components are cached [default: the user's cache directory].
    #[arg(long, env = "JOBHOST_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile every component afresh instead of using the cache.
    #[arg(long)]
    no_cache: bool,
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
        if self.cache_dir.is_some() {
            config.cache_dir = self.cache_dir.clone();
        }
        if self.no_cache {
            config.cache_dir = None;
        }
        config
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
    runtime.block_on(async {
        match cli.command {
            Command::Inspect { files, json, runtime } => inspect(files, json, &runtime).await,
            Command::Exec { file, payload, attempt, json, runtime } => {
                exec(file, &payload, attempt, json, &runtime).await
            }
            Command::Watch { components, runtime } => watch(components, &runtime).await,
        }
    })
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

fn start_runtime(args: &RuntimeArgs) -> Result<Runtime, ExitCode> {
    Runtime::new(args.config()).map_err(fail)
}

async fn inspect(files: Vec<PathBuf>, json: bool, args: &RuntimeArgs) -> ExitCode {
    let runtime = match start_runtime(args) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let mut code = ExitCode::SUCCESS;
    for file in files {
        match runtime.load_file(&file).await {
            Ok(component) if json => {
                let line = serde_json::json!({
                    "path": component.source,
                    "digest": component.digest,
                    "config": component.config,
                });
                println!("{line}");
            }
            Ok(component) => {
                let config = serde_json::to_string_pretty(&component.config).unwrap_or_default();
                println!(
                    "{} ({}, sha256 {})\n{config}",
                    component.config.name,
                    file.display(),
                    &component.digest[..12]
                );
            }
            Err(error) => code = fail(error),
        }
    }
    code
}

async fn exec(file: PathBuf, payload: &str, attempt: u32, json: bool, args: &RuntimeArgs) -> ExitCode {
    if let Err(error) = serde_json::from_str::<serde_json::Value>(payload) {
        return fail(format!("--payload is not valid JSON: {error}"));
    }
    let runtime = match start_runtime(args) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let component = match runtime.load_file(&file).await {
        Ok(component) => component,
        Err(error) => return fail(error),
    };
    let context = JobContext {
        job_id: 1,
        attempt,
        queue: component.config.queue.clone(),
        enqueued_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        batch_id: None,
        concurrency_key: None,
    };
    let signal = StopSignal::new();
    let interrupt = signal.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupt.stop("interrupted from the terminal");
        }
    });
    let report = runtime.run(&component, &context, payload, signal).await;
    if json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        print_report(&report);
    }
    if report.outcome.is_completed() { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

fn print_report(report: &RunReport) {
    let took = Duration::from_micros(report.elapsed_us);
    match &report.outcome {
        RunOutcome::Completed { output } => {
            println!("completed in {took:?}");
            if let Some(output) = output {
                println!("output: {output}");
            }
        }
        RunOutcome::Retry { reason } => println!("asked to retry after {took:?}: {reason}"),
        RunOutcome::Failed { reason } => println!("failed after {took:?}: {reason}"),
        RunOutcome::Snooze { seconds } => println!("snoozed for {seconds} s after {took:?}"),
        RunOutcome::Crashed { crash } => println!("crashed after {took:?}: {crash}"),
    }
    let effects = &report.effects;
    for line in &effects.logs {
        println!("log [{}] {}", line.level, line.message);
    }
    if let Some((done, total)) = effects.progress {
        println!("progress: {done}/{total}");
    }
    for child in &effects.children {
        println!("enqueued: {} {}", child.job, child.payload);
    }
    for (name, text) in [("stdout", &effects.stdout), ("stderr", &effects.stderr)] {
        if !text.is_empty() {
            println!("{name}:\n{}", text.trim_end());
        }
    }
    if effects.truncated {
        println!("(output was truncated at its bound)");
    }
}

async fn watch(components: PathBuf, args: &RuntimeArgs) -> ExitCode {
    let runtime = match start_runtime(args) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let registry = Arc::new(Registry::new());
    let watcher = match DirectoryWatcher::new(runtime, registry.clone(), WatcherConfig::new(components)) {
        Ok(watcher) => watcher,
        Err(error) => return fail(error),
    };
    let mut events = registry.subscribe();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            match event {
                RegistryEvent::Loaded { name, path, digest, replaced } => {
                    let verb = if replaced.is_some() { "reloaded" } else { "loaded" };
                    println!("{verb} {name} from {} (sha256 {})", path.display(), &digest[..12]);
                }
                RegistryEvent::Rejected { error } => println!("rejected {error}"),
                RegistryEvent::Unloaded { name, path } => println!("unloaded {name} ({} removed)", path.display()),
            }
        }
    });
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        trigger.cancel();
    });
    match watcher.run(shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
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
}
