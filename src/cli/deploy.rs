//! Components deployed through the database: `deploy`, `undeploy`,
//! `rollback` and `components`. A deploy validates the component exactly
//! as a host loads it before anything is stored, so a component that would
//! not load is refused here, with the reason, and never reaches a host.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use chrono::SecondsFormat;
use clap::Args;

use super::operator::open_existing;
use super::{DbArgs, RuntimeArgs, fail, start_runtime};
use crate::store::deploy::check_size;
use crate::store::{DeployChange, DeployRequest, Deployment, HostRow};

/// How much of a digest the tables show: enough to tell versions apart and
/// to pass to `rollback --to`.
const SHORT_DIGEST: usize = 12;

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// The component file (.wasm).
    file: PathBuf,
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

pub async fn deploy(args: DeployArgs) -> ExitCode {
    let bytes = match std::fs::read(&args.file) {
        Ok(bytes) => bytes,
        Err(error) => return fail(format!("cannot read {}: {error}", args.file.display())),
    };
    if let Err(error) = check_size(&bytes) {
        return fail(format!("{}: {error}", args.file.display()));
    }
    let runtime = match start_runtime(&args.runtime) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let component = match runtime.load_bytes(&args.file, bytes.clone()).await {
        Ok(component) => component,
        Err(error) => return fail(format!("{error}; nothing was deployed")),
    };
    let store = match open_existing(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let name = &component.config.name;
    // The change registers the configuration too, so enqueuers apply it
    // before any host has loaded the version.
    let request = DeployRequest::Deploy { digest: &component.digest, bytes: &bytes, config: &component.config };
    let change = match store.deployment_change(name, request).await {
        Ok(change) => change,
        Err(error) => return fail(error),
    };
    report(name, &change, "deployed");
    ExitCode::SUCCESS
}

#[derive(Debug, Args)]
pub struct UndeployArgs {
    /// The job type.
    job_type: String,
    #[command(flatten)]
    db: DbArgs,
}

pub async fn undeploy(args: UndeployArgs) -> ExitCode {
    change(&args.db, &args.job_type, DeployRequest::Undeploy, "undeployed").await
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The job type.
    job_type: String,
    /// The version to serve: a digest, or its first 8 or more characters,
    /// from `jobhost components --history JOB_TYPE` [default: the version
    /// served before the current one].
    #[arg(long, value_name = "DIGEST")]
    to: Option<String>,
    #[command(flatten)]
    db: DbArgs,
}

pub async fn rollback(args: RollbackArgs) -> ExitCode {
    change(&args.db, &args.job_type, DeployRequest::Rollback { to: args.to.as_deref() }, "rolled back").await
}

async fn change(db: &DbArgs, job_type: &str, request: DeployRequest<'_>, verb: &str) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.deployment_change(job_type, request).await {
        Ok(change) => {
            report(job_type, &change, verb);
            ExitCode::SUCCESS
        }
        Err(error) => fail(error),
    }
}

/// One line saying what changed, for people and for scripts' logs.
fn report(job_type: &str, change: &DeployChange, verb: &str) {
    let version = |d: &Option<String>| d.as_deref().map_or("nothing".to_string(), |d| short(d).to_string());
    if !change.changed {
        println!("{job_type} already serves {}: nothing changed", version(&change.current));
        return;
    }
    match &change.current {
        Some(current) if change.previous.as_ref() == Some(current) => println!(
            "{verb} {job_type}: {} again, its stored bytes repaired; hosts that refused them try again",
            short(current)
        ),
        Some(_) => println!(
            "{verb} {job_type}: {} (was {}); hosts serving `--components db` load it within seconds",
            version(&change.current),
            version(&change.previous)
        ),
        None => {
            println!("{verb} {job_type} (was {}); hosts stop serving it from the database", version(&change.previous))
        }
    }
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(SHORT_DIGEST)]
}

#[derive(Debug, Args)]
pub struct ComponentsArgs {
    /// Show this job type's history of deploys, rollbacks and undeploys instead.
    #[arg(long, value_name = "JOB_TYPE")]
    history: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// One job type as `components` shows it: what is deployed, and which
/// version each live host serves.
#[derive(Debug, serde::Serialize)]
struct TypeVersions {
    job_type: String,
    deployed: Option<Deployment>,
    /// Digest → the live hosts serving it.
    hosts: BTreeMap<String, Vec<String>>,
}

pub async fn components(args: ComponentsArgs) -> ExitCode {
    let store = match open_existing(&args.db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    if let Some(job_type) = &args.history {
        return match store.deployment_history(job_type).await {
            Ok(history) if history.is_empty() => fail(format!("job type {job_type:?} was never deployed")),
            Ok(history) => {
                for entry in &history {
                    if args.json {
                        println!("{}", serde_json::to_string(entry).unwrap_or_default());
                    } else {
                        let at = entry.at.to_rfc3339_opts(SecondsFormat::Secs, true);
                        let digest = entry.digest.as_deref().unwrap_or("-");
                        println!("{at}  {:<8}  {digest}", entry.action.as_str());
                    }
                }
                ExitCode::SUCCESS
            }
            Err(error) => fail(error),
        };
    }
    let (deployed, hosts) = match tokio::try_join!(store.deployments_current(), store.host_list()) {
        Ok(read) => read,
        Err(error) => return fail(error),
    };
    let versions = versions_by_type(deployed, &hosts);
    if versions.is_empty() && !args.json {
        eprintln!(
            "no components: nothing is deployed (jobhost deploy FILE.wasm) and no live host serves one \
             (jobhost run --components DIR)"
        );
    }
    for versions in versions {
        if args.json {
            println!("{}", serde_json::to_string(&versions).unwrap_or_default());
        } else {
            print_versions(&versions);
        }
    }
    ExitCode::SUCCESS
}

/// Every job type deployed or served by a live host, by name.
fn versions_by_type(deployed: Vec<Deployment>, hosts: &[HostRow]) -> Vec<TypeVersions> {
    let mut by_type: BTreeMap<String, TypeVersions> = BTreeMap::new();
    for deployment in deployed {
        let job_type = deployment.job_type.clone();
        by_type.insert(job_type.clone(), TypeVersions { job_type, deployed: Some(deployment), hosts: BTreeMap::new() });
    }
    for host in hosts.iter().filter(|h| h.alive) {
        for (job_type, digest) in &host.digests {
            let versions = by_type.entry(job_type.clone()).or_insert_with(|| TypeVersions {
                job_type: job_type.clone(),
                deployed: None,
                hosts: BTreeMap::new(),
            });
            versions.hosts.entry(digest.clone()).or_default().push(host.id.clone());
        }
    }
    by_type.into_values().collect()
}

/// A line for the type, then a line per version live hosts serve.
fn print_versions(versions: &TypeVersions) {
    match &versions.deployed {
        Some(d) => {
            let how = if d.action == crate::store::DeployAction::Rollback { "rolled back to" } else { "deployed" };
            println!(
                "{}  {how} {}  since {}  {:.1} MB",
                versions.job_type,
                short(&d.digest),
                d.deployed_at.to_rfc3339_opts(SecondsFormat::Secs, true),
                d.size_bytes as f64 / 1e6
            );
        }
        None => println!("{}  not deployed (served from hosts' directories)", versions.job_type),
    }
    if versions.hosts.is_empty() {
        println!("  no live host serves it");
    }
    let deployed = versions.deployed.as_ref().map(|d| d.digest.as_str());
    for (digest, hosts) in &versions.hosts {
        let note = match deployed {
            Some(d) if d != digest => "  (not the deployed version)",
            _ => "",
        };
        println!("  {}  {}{note}", short(digest), hosts.join(", "));
    }
}
