//! Components deployed through the database, against real `jobhost run`
//! processes with no components directory (`--components db`), each with
//! its own artifact cache: they share nothing but the database. What the
//! hosts serve is read from their fleet rows, and every wait is for state
//! the database shows.

use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use jobhost::component::digest_of;
use jobhost::store::DeployRequest;
use serde_json::Value;

use common::db::{TestDb, jobhost, on_both_backends};
use common::fleet::{Host, ONE_FLEET, drained, host_command};
use common::proxy::{Proxy, server_address, url_via};
use common::{eventually, guest};

const WITHIN: Duration = Duration::from_secs(60);

/// A host serving only the deployed components (`--components db`).
fn deployed_host(db: &TestDb, cache: &Path) -> Host {
    Host::start(&mut host_command(&db.url, Path::new("db"), cache))
}

fn run_ok(db: &TestDb, args: &[&str]) -> String {
    let output = jobhost(db, args);
    assert!(output.status.success(), "jobhost {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn deploy(db: &TestDb, guest_name: &str) -> String {
    let file = guest(guest_name);
    run_ok(db, &["deploy", file.to_str().unwrap()])
}

fn digest_of_guest(name: &str) -> String {
    digest_of(&std::fs::read(guest(name)).unwrap())
}

/// Waits until `host` reports serving `job` with the component `digest`.
async fn serving(db: &TestDb, host: &Host, job: &str, digest: &str) {
    let sql = format!(
        "SELECT count(*) FROM jobhost.hosts WHERE id LIKE '{}' AND digests->>'{job}' = '{digest}'",
        host.id_pattern()
    );
    eventually(WITHIN, || async { db.scalar(&sql).await == 1 }).await;
}

async fn enqueue(db: &TestDb, job: &str, payload: &str) -> i64 {
    run_ok(db, &["enqueue", job, "--payload", payload]).trim().parse().expect("the job's id")
}

async fn output_of(db: &TestDb, id: i64) -> Value {
    let sql = format!("SELECT count(*) FROM jobhost.archive WHERE id = {id} AND state = 'completed'");
    eventually(WITHIN, || async { db.scalar(&sql).await == 1 }).await;
    let output = db.dialect("output::text", "output");
    let text = db.texts(format!("SELECT {output} FROM jobhost.archive WHERE id = {id}")).await;
    serde_json::from_str(&text[0]).unwrap()
}

async fn two_hosts_without_a_shared_directory_serve_what_is_deployed(db: TestDb) {
    let _fleet = ONE_FLEET.lock().await;
    let (cache_a, cache_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Nothing deployed and no host yet: the listing says so, and how to change that.
    let empty = jobhost(&db, &["components"]);
    assert!(empty.status.success() && empty.stdout.is_empty());
    let said = String::from_utf8_lossy(&empty.stderr);
    assert!(said.contains("no components: nothing is deployed (jobhost deploy FILE.wasm)"), "{said}");
    let mut a = deployed_host(&db, cache_a.path());
    let mut b = deployed_host(&db, cache_b.path());
    let said = deploy(&db, "hello");
    let digest = digest_of_guest("hello");
    assert!(said.starts_with(&format!("deployed hello: {} (was nothing)", &digest[..12])), "{said}");
    serving(&db, &a, "hello", &digest).await;
    serving(&db, &b, "hello", &digest).await;

    // Each cached the compiled form under the digest.
    for cache in [&cache_a, &cache_b] {
        let cached: Vec<_> = std::fs::read_dir(cache.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(cached.iter().any(|n| n.to_string_lossy().starts_with(&digest)), "{cached:?}");
    }
    let ids: Vec<i64> = {
        let mut ids = Vec::new();
        for i in 0..20 {
            ids.push(enqueue(&db, "hello", &format!("{{\"name\": \"n{i}\"}}")).await);
        }
        ids
    };
    drained(&db, WITHIN).await;
    for id in ids {
        assert_eq!(output_of(&db, id).await["greeting"].as_str().map(|g| g.starts_with("hello, n")), Some(true));
    }

    // `components` shows the deployed version and both hosts on it.
    let listing = run_ok(&db, &["components"]);
    let mut lines = listing.lines();
    let first = lines.next().unwrap_or_default();
    assert!(first.starts_with(&format!("hello  deployed {}  since ", &digest[..12])), "{listing}");
    let hosts_line = lines.next().unwrap_or_default();
    assert!(hosts_line.starts_with(&format!("  {}  ", &digest[..12])), "{listing}");
    assert_eq!(hosts_line.matches(", ").count(), 1, "two hosts on it: {listing}");
    assert!(!listing.contains("not the deployed version"), "{listing}");
    let json: Value = serde_json::from_str(run_ok(&db, &["components", "--json"]).trim()).unwrap();
    assert_eq!(json["deployed"]["digest"], digest);
    assert_eq!(json["hosts"][&digest].as_array().map(Vec::len), Some(2), "{json}");

    // Undeployed, both stop serving it.
    let said = run_ok(&db, &["undeploy", "hello"]);
    assert!(said.starts_with("undeployed hello"), "{said}");
    for host in [&a, &b] {
        let sql = format!(
            "SELECT count(*) FROM jobhost.hosts WHERE id LIKE '{}' AND digests->>'hello' IS NULL",
            host.id_pattern()
        );
        eventually(WITHIN, || async { db.scalar(&sql).await == 1 }).await;
    }
    a.stop().await;
    b.stop().await;
}

async fn a_new_version_replaces_the_old_one_while_its_job_finishes_and_rolls_back(db: TestDb) {
    let _fleet = ONE_FLEET.lock().await;
    let cache = tempfile::tempdir().unwrap();
    let mut host = deployed_host(&db, cache.path());
    let (v1, v2) = (digest_of_guest("hello"), digest_of_guest("hello_v2"));
    deploy(&db, "hello");
    serving(&db, &host, "hello", &v1).await;

    // A v1 job in flight while v2 is deployed finishes on v1.
    let slow = enqueue(&db, "hello", r#"{"name": "slow", "delay_ms": 15000}"#).await;
    let running = format!("SELECT count(*) FROM jobhost.jobs WHERE id = {slow} AND state = 'running'");
    eventually(WITHIN, || async { db.scalar(&running).await == 1 }).await;
    let said = deploy(&db, "hello_v2");
    assert!(said.starts_with(&format!("deployed hello: {} (was {})", &v2[..12], &v1[..12])), "{said}");
    serving(&db, &host, "hello", &v2).await;
    let fresh = enqueue(&db, "hello", r#"{"name": "fresh"}"#).await;
    assert_eq!(output_of(&db, fresh).await["version"], 2);
    assert_eq!(db.scalar(&running).await, 1, "the v1 job still runs after v2 took over");
    assert_eq!(output_of(&db, slow).await["greeting"], "hello, slow", "finished on v1");

    // Deploying what is served changes nothing.
    let again = deploy(&db, "hello_v2");
    assert!(again.contains("already serves"), "{again}");

    // A rollback serves v1 again; a second one undoes the first.
    let said = run_ok(&db, &["rollback", "hello"]);
    assert!(said.starts_with(&format!("rolled back hello: {} (was {})", &v1[..12], &v2[..12])), "{said}");
    serving(&db, &host, "hello", &v1).await;
    let after = enqueue(&db, "hello", r#"{"name": "after"}"#).await;
    assert_eq!(output_of(&db, after).await["greeting"], "hello, after");
    // The fleet's registered configuration is v1's again (v2 declares
    // priority -1), though v2 was registered after it.
    let registered = db.texts("SELECT digest FROM jobhost.job_types WHERE name = 'hello'").await;
    assert_eq!(registered, std::slice::from_ref(&v1));
    assert_eq!(db.scalar(format!("SELECT CAST(priority AS BIGINT) FROM jobhost.archive WHERE id = {after}")).await, 0);
    let listing = run_ok(&db, &["components"]);
    assert!(listing.starts_with(&format!("hello  rolled back to {}", &v1[..12])), "{listing}");
    run_ok(&db, &["rollback", "hello", "--to", &v2[..10]]);
    serving(&db, &host, "hello", &v2).await;

    let history = run_ok(&db, &["components", "--history", "hello"]);
    let actions: Vec<&str> = history.lines().map(|l| l.split_whitespace().nth(1).unwrap_or_default()).collect();
    assert_eq!(actions, ["rollback", "rollback", "deploy", "deploy"], "{history}");
    assert!(history.lines().next().unwrap_or_default().ends_with(&v2), "{history}");

    // Refused rollbacks say why and change nothing.
    let refused = jobhost(&db, &["rollback", "hello", "--to", "0123456789"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no version of \"hello\""), "{refused:?}");
    let never = jobhost(&db, &["rollback", "sleep"]);
    assert!(String::from_utf8_lossy(&never.stderr).contains("never deployed"), "{never:?}");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.deployments").await, 4);
    host.stop().await;
}

fn refused(output: &Output, says: &str) {
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(says), "{stderr}");
    assert!(stderr.contains("nothing was deployed") || stderr.contains("cannot read"), "{stderr}");
}

async fn a_bad_upload_is_refused_and_a_bad_row_never_replaces_a_good_version(db: TestDb) {
    let _fleet = ONE_FLEET.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"\0asm but not really").unwrap();
    refused(&jobhost(&db, &["deploy", garbage.to_str().unwrap()]), "not a valid WebAssembly component");
    let misconfigured = guest("misconfigured");
    refused(&jobhost(&db, &["deploy", misconfigured.to_str().unwrap()]), "invalid configuration");
    let missing = dir.path().join("missing.wasm");
    refused(&jobhost(&db, &["deploy", missing.to_str().unwrap()]), "cannot read");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.deployments").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.component_sources").await, 0);

    // A row whose bytes do not match its digest (a bad restore, a hand
    // edit: here v1's bytes under v2's digest) is refused by the host,
    // which keeps serving the good version.
    let cache = tempfile::tempdir().unwrap();
    let mut host = deployed_host(&db, cache.path());
    let v1 = digest_of_guest("hello");
    deploy(&db, "hello");
    serving(&db, &host, "hello", &v1).await;
    let claimed = digest_of_guest("hello_v2");
    let bytes = hex(&std::fs::read(guest("hello")).unwrap());
    let (blob, now) = (db.dialect("decode('{}', 'hex')", "X'{}'"), db.dialect("now()", "0"));
    let blob = blob.replace("{}", &bytes);
    db.execute(format!(
        "INSERT INTO jobhost.component_sources (digest, job_type, bytes, config, uploaded_at)
         SELECT '{claimed}', 'hello', {blob}, config, {now} FROM jobhost.component_sources WHERE digest = '{v1}'"
    ))
    .await;
    db.execute(format!(
        "INSERT INTO jobhost.deployments (job_type, digest, action, at) VALUES ('hello', '{claimed}', 'deploy', {now})"
    ))
    .await;
    // A later good deploy shows the host has looked past the bad row.
    deploy(&db, "sleep");
    serving(&db, &host, "sleep", &digest_of_guest("sleep")).await;
    serving(&db, &host, "hello", &v1).await;
    let id = enqueue(&db, "hello", r#"{"name": "still"}"#).await;
    assert_eq!(output_of(&db, id).await["greeting"], "hello, still");

    // Deploying the real version of that digest repairs the row, and the
    // host, told of a new entry, loads it.
    let said = deploy(&db, "hello_v2");
    assert!(said.contains("its stored bytes repaired"), "{said}");
    serving(&db, &host, "hello", &claimed).await;
    host.stop().await;
}

/// A host cut off from the database (its connections, the listener's
/// among them, neither answer nor close) while a new version is deployed
/// keeps serving the old one, and serves the new one once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_during_a_deploy_serves_the_new_version_once_back() {
    let _fleet = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let proxy = Proxy::start(server_address()).await;
    let cache = tempfile::tempdir().unwrap();
    let mut host = Host::start(&mut host_command(&url_via(&db.url, proxy.port()), Path::new("db"), cache.path()));
    let (v1, v2) = (digest_of_guest("hello"), digest_of_guest("hello_v2"));
    deploy(&db, "hello");
    serving(&db, &host, "hello", &v1).await;
    proxy.freeze();
    // Deployed straight to the server: the host hears nothing of it.
    deploy(&db, "hello_v2");
    proxy.thaw();
    serving(&db, &host, "hello", &v2).await;
    let id = enqueue(&db, "hello", r#"{"name": "back"}"#).await;
    assert_eq!(output_of(&db, id).await["version"], 2);
    host.stop().await;
}

/// A type both a file and the deployments provide is served by one of
/// them at a time, and the other takes over when the first goes.
async fn a_file_and_a_deployment_of_one_type_take_turns(db: TestDb) {
    let _fleet = ONE_FLEET.lock().await;
    let (dir, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sources = format!("{},db", dir.path().display());
    let mut host = Host::start(&mut host_command(&db.url, Path::new(&sources), cache.path()));
    let (v1, v2) = (digest_of_guest("hello"), digest_of_guest("hello_v2"));
    deploy(&db, "hello");
    serving(&db, &host, "hello", &v1).await;
    // The file arrives while the deployment serves: it waits, and takes
    // over when the type is undeployed.
    std::fs::copy(guest("hello_v2"), dir.path().join("hello.wasm")).unwrap();
    run_ok(&db, &["undeploy", "hello"]);
    serving(&db, &host, "hello", &v2).await;
    // Deployed again while the file serves: the deployment waits, and
    // takes over when the file is removed.
    deploy(&db, "hello");
    let listing = run_ok(&db, &["components"]);
    assert!(listing.contains("(not the deployed version)"), "{listing}");
    std::fs::remove_file(dir.path().join("hello.wasm")).unwrap();
    serving(&db, &host, "hello", &v1).await;
    host.stop().await;
}

/// Changes to one type from many operators at once are decided one after
/// another, each on the history the last one left: no entry repeats the
/// version before it (two deploys of a new version racing would both add
/// one), and the newest entry is what the type serves.
async fn concurrent_changes_to_a_type_are_decided_one_after_another(db: TestDb) {
    let versions: Vec<(String, Vec<u8>)> = ["hello", "hello_v2"]
        .iter()
        .map(|name| {
            let bytes = std::fs::read(guest(name)).unwrap();
            (digest_of(&bytes), bytes)
        })
        .collect();
    let mut changes = Vec::new();
    for round in 0..40 {
        let store = db.store.clone();
        let (digest, bytes) = versions[round % 2].clone();
        let config = common::job_config("hello");
        changes.push(tokio::spawn(async move {
            let request = if round % 5 == 4 {
                DeployRequest::Rollback { to: None }
            } else {
                DeployRequest::Deploy { digest: &digest, bytes: &bytes, config: &config }
            };
            match store.deployment_change("hello", request).await {
                Ok(change) => change.changed,
                // A rollback before anything was deployed twice.
                Err(jobhost::store::Error::DeployRefused(_)) => false,
                Err(error) => panic!("{error}"),
            }
        }));
    }
    let mut changed = 0;
    for change in changes {
        changed += i64::from(change.await.unwrap());
    }
    let history = db.store.deployment_history("hello").await.unwrap();
    assert_eq!(history.len() as i64, changed, "one entry per change reported");
    for pair in history.windows(2) {
        assert_ne!(pair[0].digest, pair[1].digest, "an entry repeats the version before it: {history:?}");
    }
    let current = db.store.deployments_current().await.unwrap();
    assert_eq!(current.len(), 1);
    assert_eq!(Some(&current[0].digest), history[0].digest.as_ref());
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.component_sources").await, 2);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

on_both_backends!(
    two_hosts_without_a_shared_directory_serve_what_is_deployed,
    a_new_version_replaces_the_old_one_while_its_job_finishes_and_rolls_back,
    a_bad_upload_is_refused_and_a_bad_row_never_replaces_a_good_version,
    concurrent_changes_to_a_type_are_decided_one_after_another,
    a_file_and_a_deployment_of_one_type_take_turns,
);
