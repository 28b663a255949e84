//! Commands that work on component files without a database: `inspect`,
//! `exec` (which may read a fleet's grants, secrets and variables) and `watch`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::{Exit, RuntimeArgs, fail, start_runtime};
use crate::component::{DirectoryWatcher, Registry, RegistryEvent, StopSignal, WatcherConfig};
use crate::types::{JobContext, RunOutcome, RunReport, StepTarget};

/// Prints each file's validated configuration as one JSON object per line
/// (snake_case keys mirroring the WIT record), or the error on stderr.
pub async fn inspect(files: Vec<PathBuf>, pretty: bool, args: &RuntimeArgs) -> ExitCode {
    let runtime = match start_runtime(args) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let mut code = ExitCode::SUCCESS;
    for file in files {
        match runtime.load_file(&file).await {
            Ok(component) => {
                let config = &component.config;
                let config = config.document();
                let text = if pretty { serde_json::to_string_pretty(&config) } else { serde_json::to_string(&config) };
                println!("{}", text.unwrap_or_default());
            }
            Err(error) => code = fail(error),
        }
    }
    code
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The component file (.wasm).
    file: PathBuf,
    /// The job's payload, a JSON document.
    #[arg(long, default_value = "{}")]
    payload: String,
    /// The attempt number the job is told it is on.
    #[arg(long, default_value_t = 1)]
    attempt: u32,
    /// Print the full report (outcome, output, logs, children) as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// A fleet's database whose outbound grants, secrets (opened with
    /// JOBHOST_SECRET_KEY) and variables the run gets, as a host's runs
    /// do; without one, a run reads none, and every request is refused.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

pub async fn exec(args: ExecArgs) -> ExitCode {
    let ExecArgs { file, payload, attempt, json, database_url, runtime } = args;
    // Refused as an enqueue would refuse it, so `exec` runs only what a worker could.
    match serde_json::from_str::<serde_json::Value>(&payload) {
        Err(error) => return fail(format!("--payload is not valid JSON: {error}")),
        Ok(serde_json::Value::Object(_)) => {}
        Ok(other) => {
            let kind = crate::store::enqueue::json_kind(&other);
            return fail(format!(
                "--payload must be a JSON object, as every job's payload is (e.g. '{{\"name\": \"Ada\"}}'), got {kind}"
            ));
        }
    }
    let runtime = match start_runtime(&runtime) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let component = match runtime.load_file(&file).await {
        Ok(component) => component,
        Err(error) => return fail(error),
    };
    let runtime = match (database_url, component.config.outbound.is_empty()) {
        (Some(url), false) => match fleet_sources(runtime, &url).await {
            Ok(runtime) => {
                eprintln!("note: the run gets the grants, secrets and variables of the fleet at --database-url");
                runtime
            }
            Err(code) => return code,
        },
        (Some(url), true) => match fleet_sources(runtime, &url).await {
            Ok(runtime) => runtime,
            Err(code) => return code,
        },
        (None, false) => {
            eprintln!(
                "note: {} declares outbound HTTP, but without --database-url (or DATABASE_URL) this run reads \
                 no grants or secrets, so every request is refused",
                component.config.name
            );
            runtime
        }
        (None, true) => runtime,
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
        traceparent: None,
    };
    let signal = StopSignal::new();
    let interrupt = signal.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupt.stop("interrupted from the terminal");
        }
    });
    let report = runtime.run(&component, &context, &payload, signal).await;
    if json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        print_report(&report);
    }
    if report.outcome.is_completed() { ExitCode::SUCCESS } else { Exit::JobFailed.into() }
}

/// `runtime`, with the grants, secrets and variables of the fleet at `url`
/// read as a host reads them.
async fn fleet_sources(runtime: crate::component::Runtime, url: &str) -> Result<crate::component::Runtime, ExitCode> {
    let store = crate::store::open_existing(url, 2, crate::store::EnqueueLimits::default()).await.map_err(fail)?;
    let key = crate::outbound::secrets::SecretKey::from_environment().map_err(fail)?;
    Ok(runtime
        .with_grants(crate::component::grants_from(store.clone()))
        .with_secrets(crate::component::secrets_from(store.clone(), key))
        .with_variables(crate::component::variables_from(store)))
}

/// The job's output goes to stdout (nothing else does, so it can be piped);
/// how the run went, its log lines and the guest's own output go to stderr.
fn print_report(report: &RunReport) {
    // Whole milliseconds (two decimals under 10 ms): the run's own time.
    let took = match report.elapsed_us {
        us if us < 10_000 => format!("{:.2} ms", us as f64 / 1000.0),
        us => format!("{} ms", us / 1000),
    };
    let effects = &report.effects;
    for line in &effects.logs {
        eprintln!("log [{}] {}", line.level, line.message);
    }
    for (name, text) in [("stdout", &effects.stdout), ("stderr", &effects.stderr)] {
        if !text.is_empty() {
            eprintln!("guest {name}:\n{}", text.trim_end());
        }
    }
    if let Some((done, total)) = effects.progress {
        eprintln!("progress: {done}/{total}");
    }
    for child in &effects.children {
        eprintln!("enqueued (written when the job completes): {} {}", child.job, child.payload);
    }
    for added in &effects.workflows.steps {
        let workflow = match added.target {
            StepTarget::Current => "its own workflow".to_string(),
            StepTarget::Opened(n) => format!("opened workflow {n}"),
        };
        let step = &added.step;
        eprintln!(
            "step added to {workflow} (written when the job completes): {} {} {}",
            step.name, step.job, step.payload
        );
    }
    if effects.truncated {
        eprintln!("(output was truncated at its bound)");
    }
    match &report.outcome {
        RunOutcome::Completed { output } => {
            eprintln!("completed in {took}");
            if let Some(output) = output {
                println!("{output}");
            }
        }
        RunOutcome::Retry { reason } => eprintln!("job error after {took}: retry: {reason}"),
        RunOutcome::Failed { reason } => eprintln!("job error after {took}: fail: {reason}"),
        RunOutcome::Snooze { seconds } => eprintln!("job asked to snooze {seconds} s after {took}"),
        RunOutcome::Throttled { retry_after_ms } => {
            eprintln!("job was throttled after {took}: its key waits {retry_after_ms} ms")
        }
        RunOutcome::Crashed { crash } => eprintln!("job {crash} (ran {took})"),
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
