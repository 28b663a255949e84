//! Every listing the command line prints fits a terminal of 80 columns
//! (docs/cli.md), over a database holding what makes lines long: long job
//! type names, keys and labels, multi-line errors, held and throttled
//! keys, batches, a workflow, grants, variables and a schedule. A listing
//! with nothing in it says so on stderr and prints nothing on stdout.

use crate::common;
use crate::dashboard::populate;

use jobhost::store::grant::NewGrant;
use jobhost::store::{EnqueueParams, FinishOutcome};
use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, OnConflict, RateLimitConfig, ScheduleConfig};
use serde_json::json;

use common::db::{TestDb, jobhost};
use common::{finish, job_config};

const WIDTH: usize = 80;

/// What makes lines long, beside what the dashboard's pages show.
async fn populate_long(db: &TestDb) -> i64 {
    let long_type = "quarterly-revenue-report-for-enterprise-accounts";
    let mut limited = job_config(long_type);
    limited.concurrency = Some(ConcurrencyConfig {
        limit: 2,
        key: KeyTemplate::parse("tenant:{tenant}:region:{region}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    limited.rate_limit =
        Some(RateLimitConfig { limit: 5, period_ms: 1_000, key: KeyTemplate::parse("tenant:{tenant}").unwrap() });
    let mut ticking = job_config("nightly-cleanup-of-expired-sessions-and-tokens");
    ticking.schedule = Some(ScheduleConfig {
        time_zone: "America/Argentina/Buenos_Aires".into(),
        ..ScheduleConfig::new("0 30 2 * * *")
    });
    db.store.job_types_register(&[(limited, "v1".into()), (ticking, "v1".into())]).await.unwrap();
    let tenant = "initech-holdings-international-subsidiary-number-seventeen";
    let payload = json!({"tenant": tenant, "region": "south-america-east-1"});
    let ids = db.store.job_enqueue(&vec![EnqueueParams::new(long_type, payload); 4]).await.unwrap();
    let mut params = common::fetch_params("a-host-with-a-long-name-7f3e9a1c2b4d", &[long_type], 2);
    params.job_types = vec![(long_type.to_string(), 3600)];
    let running = db.store.job_fetch(&params).await.unwrap();
    let run = jobhost::store::RunId { job_id: running[0].id, lease_token: running[0].lease_token };
    assert!(db.store.rate_throttle(run, 155_600).await.unwrap());
    let error = "the ledger service answered 503 Service Unavailable after 30 s while exporting \
                 the quarter's invoices\nretry-after: 120\nrequest id 5f0e9c1a-77b2-4c1d-9a0e-1b2c3d4e5f60";
    db.store.job_finish(vec![finish(&running[1], FinishOutcome::Failed { error: error.into() })]).await.unwrap();
    let grant = NewGrant {
        job_type: long_type.into(),
        origin: "https://ledger.internal.example-enterprise.com:8443".into(),
        methods: vec!["GET".into(), "POST".into(), "PUT".into()],
        secrets: vec!["LEDGER_API_TOKEN_FOR_REPORTS".into(), "LEDGER_SIGNING_KEY".into()],
        ..Default::default()
    };
    db.store.grant_set(&grant).await.unwrap();
    db.store.var_set(long_type, "LEDGER_REGION_FOR_QUARTERLY_EXPORTS", "south-america-east-1").await.unwrap();
    ids[1]
}

/// Runs `args` and checks every line of its stdout against the width.
fn fits(db: &TestDb, args: &[&str]) -> String {
    let out = jobhost(db, args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.trim().is_empty(), "{args:?} printed nothing");
    for line in stdout.lines() {
        assert!(line.chars().count() <= WIDTH, "{args:?} printed {} columns:\n{line}", line.chars().count());
    }
    stdout
}

async fn every_listing_fits(db: TestDb) {
    let (failed, batch, workflow) = populate(&db).await;
    let long_failed = populate_long(&db).await;
    let (failed, batch, workflow, long_failed) =
        (failed.to_string(), batch.to_string(), workflow.to_string(), long_failed.to_string());
    for args in [
        vec!["jobs"],
        vec!["jobs", "--state", "failed"],
        vec!["job", &failed],
        vec!["job", &long_failed],
        vec!["job", &long_failed, "--attempts"],
        vec!["concurrency"],
        vec!["schedules"],
        vec!["stats"],
        vec!["batch", "list"],
        vec!["batch", "show", &batch],
        vec!["workflow", "list"],
        vec!["workflow", "show", &workflow],
        vec!["grants"],
        vec!["var", "list"],
    ] {
        fits(&db, &args);
    }
    // The long error is on a line of its own, cut, not wrapped.
    let jobs = fits(&db, &["jobs", "--state", "failed"]);
    assert!(jobs.lines().any(|line| line.starts_with("          the ledger service answered 503")), "{jobs}");
    // A long head moves the facts to the next line rather than cut them.
    let grants = fits(&db, &["grants"]);
    assert!(grants.lines().any(|line| line.trim_start().starts_with("GET,POST,PUT")), "{grants}");
    let long_job = fits(&db, &["job", &long_failed]);
    assert!(long_job.lines().take(2).any(|line| line.contains("failed, attempt 1 of 3")), "never cut: {long_job}");
    let keys = fits(&db, &["concurrency"]);
    assert!(keys.lines().any(|line| line.starts_with("  throttled ") && line.ends_with("1 throttle")), "{keys}");
}

#[tokio::test]
async fn every_listing_fits_80_columns_on_sqlite() {
    every_listing_fits(TestDb::sqlite().await).await;
}

#[tokio::test]
async fn every_listing_fits_80_columns_on_postgres() {
    every_listing_fits(TestDb::postgres().await).await;
}

/// On an empty database each listing prints nothing on stdout and says
/// why on stderr; with `--json` it prints nothing at all.
#[tokio::test]
async fn an_empty_listing_says_so_on_stderr() {
    let db = TestDb::sqlite().await;
    for (args, said) in [
        (vec!["jobs"], "no jobs match"),
        (vec!["concurrency"], "no keys in use"),
        (vec!["schedules"], "no schedules"),
        (vec!["batch", "list"], "no batches"),
        (vec!["workflow", "list"], "no workflows"),
        (vec!["secret", "list"], "no secrets"),
        (vec!["grants"], "no grants"),
        (vec!["var", "list"], "no variables"),
    ] {
        let out = jobhost(&db, &args);
        assert!(out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(said),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json = jobhost(&db, &[args.as_slice(), &["--json"]].concat());
        assert!(json.stdout.is_empty() && json.stderr.is_empty(), "{args:?} --json");
    }
}
