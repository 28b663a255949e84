//! The host command, `jobhost run`: turns its flags into a
//! [`HostConfig`](crate::HostConfig), runs the host until SIGINT or SIGTERM,
//! and stops at once on a second signal. The commands that only read or
//! change the database are in [`super::operator`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::{DbArgs, RuntimeArgs, fail};
use crate::background::maintenance::MaintenanceConfig;
use crate::config::ConfigError;
use crate::worker::WorkerConfig;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where the components to serve come from: a directory, watched for
    /// changes, and/or `db`, the components deployed through the database
    /// (`jobhost deploy`). Give both as `--components DIR --components db`
    /// or `DIR,db`; a directory named `db` is `./db`.
    #[arg(long, env = "JOBHOST_COMPONENTS", value_delimiter = ',', required = true, value_name = "DIR|db")]
    components: Vec<String>,
    #[command(flatten)]
    db: DbArgs,
    /// Jobs run at once on this host.
    #[arg(long, default_value_t = 10, value_parser = super::at_least_one::<usize>)]
    concurrency: usize,
    /// The most jobs leased ahead of free run slots; fewer while runs are
    /// long (see --prefetch-wait) [default: 4 × the concurrency].
    #[arg(long)]
    prefetch: Option<usize>,
    /// How long a job leased ahead may wait for a run slot before it is
    /// handed back; fewer are leased ahead while runs are long.
    #[arg(long, value_parser = super::parse_duration, default_value = "1s")]
    prefetch_wait: Duration,
    /// The most result writes out at once, each on its own connection:
    /// results behind a write out for 100 ms (waiting on a lock, a lost
    /// reply) go out beside it instead of waiting for its answer.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = super::at_least_one::<usize>)]
    result_writes: usize,
    /// The queues to serve, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    queues: Vec<String>,
    /// How often leases are renewed.
    #[arg(long, value_parser = super::parse_duration, default_value = "5s")]
    heartbeat: Duration,
    /// Lease of a job whose type declares no concurrency duration.
    #[arg(long, value_parser = super::parse_duration, default_value = "30s")]
    lease: Duration,
    /// At shutdown, how long running jobs may take before they are handed back.
    #[arg(long, value_parser = super::parse_duration, default_value = "30s")]
    grace: Duration,
    /// How long an idle host waits for a notification before polling.
    #[arg(long, value_parser = super::parse_duration, default_value = "1s")]
    poll: Duration,
    /// Time between maintenance passes (due jobs, expired leases, retention).
    #[arg(long, value_parser = super::parse_duration, default_value = "1s")]
    maintenance_interval: Duration,
    /// How long finished jobs stay in the archive.
    #[arg(long, value_parser = super::parse_duration, default_value = "7days")]
    retention: Duration,
    /// How long the fleet's history (per-minute counts, run times and
    /// queue depth, charted on the dashboard) is kept.
    #[arg(long, value_parser = super::parse_duration, default_value = "7days")]
    history_retention: Duration,
    /// How long the audit trail's rows (who changed what) are kept.
    #[arg(long, value_parser = super::parse_duration, default_value = "90days")]
    audit_retention: Duration,
    /// Do not apply migrations at start.
    #[arg(long)]
    no_migrate: bool,
    /// Also serve the HTTP API, dashboard and metrics on this address
    /// (e.g. 127.0.0.1:8080), as `jobhost serve` does.
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    #[command(flatten)]
    token: super::serve::TokenArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// Export a span per run to this OpenTelemetry collector over OTLP/HTTP
    /// (its base URL, e.g. http://localhost:4318; /v1/traces is appended).
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (a full URL) also turns it on;
    /// the other `OTEL_*` variables (headers, timeout, sampler, service
    /// name) apply.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
}

pub async fn run(args: RunArgs) -> ExitCode {
    let limits = args.db.limits();
    if args.http.is_none() && args.token.given() {
        tracing::warn!("--token and --allow-host mean nothing without --http: this host serves no HTTP");
    }
    let (components, deployed) = match component_sources(&args.components) {
        Ok(sources) => sources,
        Err(message) => return fail(message),
    };
    // A key that is set but malformed stops the host; none at all only
    // stops the runs that need a secret.
    let secret_key = match crate::outbound::secrets::SecretKey::from_environment() {
        Ok(key) => key,
        Err(error) => return fail(error),
    };
    let config = crate::HostConfig {
        database_url: args.db.database_url,
        components,
        deployed,
        migrate: !args.no_migrate,
        runtime: args.runtime.config(),
        worker: WorkerConfig {
            concurrency: args.concurrency,
            prefetch: args.prefetch.unwrap_or_else(|| WorkerConfig::default_prefetch(args.concurrency)),
            prefetch_wait: args.prefetch_wait,
            queues: args.queues,
            heartbeat_interval: args.heartbeat,
            default_lease: args.lease,
            poll_interval: args.poll,
            shutdown_grace: args.grace,
            result_writes: args.result_writes,
            ..WorkerConfig::default()
        },
        maintenance: MaintenanceConfig {
            interval: args.maintenance_interval,
            retention: args.retention,
            history_retention: args.history_retention,
            audit_retention: args.audit_retention,
            ..MaintenanceConfig::default()
        },
        schedules: Default::default(),
        limits,
        http: args.http.map(|listen| args.token.http_config(listen, limits)),
        secret_key,
        otlp: otlp_of(args.otlp_endpoint),
    };
    let shutdown = CancellationToken::new();
    super::signals::stop_on_signals(shutdown.clone());
    match crate::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(crate::host::HostError::Config(error))
        | Err(crate::host::HostError::Runtime(crate::component::RuntimeError::Config(error))) => fail(in_flags(&error)),
        Err(error) => fail(error),
    }
}

/// A setting that cannot work, said in the terms of the flag that sets it,
/// with what to give instead.
fn in_flags(error: &ConfigError) -> String {
    let fix = match error.field {
        "concurrency" | "max_concurrent_runs" => "--concurrency must be between 1 and 10000",
        "queues" => return format!("--queues: {} (e.g. --queues default,mail)", error.reason),
        "heartbeat_interval" => "--heartbeat must be positive (e.g. --heartbeat 5s)",
        "poll_interval" => "--poll must be positive (e.g. --poll 1s)",
        "default_lease" => "--lease must be at least twice --heartbeat (e.g. --lease 30s with --heartbeat 5s)",
        "prefetch_wait" => "--prefetch-wait must be positive (e.g. --prefetch-wait 1s)",
        "result_writes" => "--result-writes must be at least 1",
        "interval" => "--maintenance-interval must be positive (e.g. --maintenance-interval 1s)",
        "max_output_bytes" => "--max-output must be positive (e.g. --max-output 1MiB)",
        "run_budget_bytes" => {
            "--run-budget (default 16MiB) must be at least --max-output: raise --run-budget with it \
             (e.g. --max-output 32MiB --run-budget 64MiB)"
        }
        "max_memory_limit_bytes" => "--max-memory must be between 1MiB and 4GiB",
        "memory_reservation_bytes" => "--memory-reservation must be at least --max-memory (default 1GiB)",
        "default_memory_limit_bytes" => "--default-memory must be at most --max-memory (default 1GiB)",
        "default_timeout" => "--default-timeout must be positive (e.g. --default-timeout 5m)",
        _ => return error.to_string(),
    };
    fix.to_string()
}

/// Where spans go: `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`), or
/// the exporter's own `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; none without either.
fn otlp_of(endpoint: Option<String>) -> Option<crate::telemetry::OtlpConfig> {
    let endpoint = endpoint.filter(|e| !e.trim().is_empty());
    let by_variable = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_ok_and(|e| !e.trim().is_empty());
    (endpoint.is_some() || by_variable).then_some(crate::telemetry::OtlpConfig { endpoint })
}

/// The directory and whether the deployed components are served, from the
/// values of `--components`.
fn component_sources(values: &[String]) -> Result<(Option<PathBuf>, bool), String> {
    let mut dir = None;
    let mut deployed = false;
    for value in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
        if value == "db" {
            if std::path::Path::new("db").is_dir() {
                eprintln!("warning: --components db means the deployed components; for the directory ./db write ./db");
            }
            deployed = true;
        } else if let Some(first) = dir.replace(PathBuf::from(value)) {
            return Err(format!("--components names two directories ({} and {value}): serve one", first.display()));
        }
    }
    if dir.is_none() && !deployed {
        return Err("--components needs a directory, `db`, or both".into());
    }
    Ok((dir, deployed))
}
