//! Commands that work on component files without a database: `inspect`,
//! `exec` and `watch`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{RuntimeArgs, fail, start_runtime};
use crate::component::{DirectoryWatcher, Registry, RegistryEvent, StopSignal, WatcherConfig};
use crate::types::{JobContext, RunOutcome, RunReport};

pub async fn inspect(files: Vec<PathBuf>, json: bool, args: &RuntimeArgs) -> ExitCode {
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

pub async fn exec(file: PathBuf, payload: &str, attempt: u32, json: bool, args: &RuntimeArgs) -> ExitCode {
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

pub async fn watch(components: PathBuf, args: &RuntimeArgs) -> ExitCode {
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
