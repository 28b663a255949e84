//! No row stalls the fleet (DESIGN.md guarantee 13): a row maintenance
//! cannot process is failed alone, with the reason, and every sweep goes on
//! for every other job; and the rows that used to be such rows (over-long
//! keys, huge error histories) are refused or bounded where they are written.

mod common;

use chrono::Utc;
use jobhost::store::{EnqueueParams, JobState};
use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, OnConflict};
use serde_json::json;

use common::db::{Backend, TestDb, on_both_backends};
use common::{fetch_params, job_config};

async fn register(db: &TestDb) {
    let mut limited = job_config("lim");
    limited.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{key}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    db.store.job_types_register(&[(job_config("mail"), "d-mail".into()), (limited, "d-lim".into())]).await.unwrap();
}

async fn enqueue(db: &TestDb, params: EnqueueParams) -> i64 {
    db.store.job_enqueue(&[params]).await.unwrap()[0]
}

fn delayed(job: &str, payload: serde_json::Value) -> EnqueueParams {
    EnqueueParams { delay_ms: Some(60_000), ..EnqueueParams::new(job, payload) }
}

async fn state_of(db: &TestDb, id: i64) -> JobState {
    db.store.job_get(id).await.unwrap().expect("job exists").row.state
}

/// Makes the database refuse every change to these jobs' rows, standing in
/// for a row no sweep can process (a key past an index's size limit written
/// by an older version, a value past a column's range): before the fix, any
/// set-based sweep that touched it failed whole, on every host, every pass.
async fn refuse_updates_of(db: &TestDb, ids: &[i64]) {
    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    match db.backend {
        Backend::Postgres => {
            db.execute(
                "CREATE FUNCTION jobhost.refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN RAISE EXCEPTION 'planted: this row cannot be processed'; END $$",
            )
            .await;
            db.execute(format!(
                "CREATE TRIGGER refuse BEFORE UPDATE ON jobhost.jobs FOR EACH ROW
                 WHEN (OLD.id IN ({list})) EXECUTE FUNCTION jobhost.refuse_update()"
            ))
            .await;
        }
        Backend::Sqlite => {
            db.execute(format!(
                "CREATE TRIGGER refuse BEFORE UPDATE ON jobs WHEN OLD.id IN ({list})
                 BEGIN SELECT RAISE(ABORT, 'planted: this row cannot be processed'); END"
            ))
            .await;
        }
    }
}

async fn one_bad_row_never_stalls_a_sweep(db: TestDb) {
    register(&db).await;
    // Due jobs: one that cannot be processed among good ones, limited and not.
    let bad_due = enqueue(&db, delayed("mail", json!({"n": 1}))).await;
    let good_due = enqueue(&db, delayed("mail", json!({"n": 2}))).await;
    let limited_due = enqueue(&db, delayed("lim", json!({"key": "a"}))).await;
    // Expired leases: one bad, one good.
    let bad_running = enqueue(&db, EnqueueParams::new("mail", json!({"n": 3}))).await;
    let good_running = enqueue(&db, EnqueueParams::new("mail", json!({"n": 4}))).await;
    assert_eq!(db.store.job_fetch(&fetch_params("h", &["mail"], 10)).await.unwrap().len(), 2);
    // A blocked job whose key's holder vanished: the repair frees the slot
    // and the sweep promotes it.
    let holder = enqueue(&db, EnqueueParams::new("lim", json!({"key": "b"}))).await;
    let blocked = enqueue(&db, EnqueueParams::new("lim", json!({"key": "b"}))).await;
    assert_eq!(state_of(&db, blocked).await, JobState::Blocked);
    db.execute(format!("DELETE FROM jobhost.jobs WHERE id = {holder}")).await;
    refuse_updates_of(&db, &[bad_due, bad_running]).await;

    let later = Utc::now() + chrono::Duration::hours(2);
    let maintenance = jobhost::maintenance::Maintenance::new(db.dyn_store(), Default::default()).unwrap();
    let report = maintenance.run_once(Some(later)).await.expect("no sweep fails for one row");
    let mut states = Vec::new();
    for id in [bad_due, good_due, limited_due, bad_running, good_running, blocked] {
        states.push((id, state_of(&db, id).await));
    }
    assert_eq!(report.quarantined, 2, "{report:?}; jobs now: {states:?}");
    assert_eq!((report.promoted, report.requeued, report.repaired), (2, 1, 1), "{report:?}");
    for id in [good_due, limited_due, good_running, blocked] {
        assert_eq!(state_of(&db, id).await, JobState::Available, "job {id} was processed");
    }
    for id in [bad_due, bad_running] {
        let job = db.store.job_get(id).await.unwrap().unwrap();
        assert_eq!(job.row.state, JobState::Failed, "the bad row is failed where operators see it");
        let reason = job.row.error.unwrap_or_default();
        assert!(reason.contains("maintenance could not process this job"), "{reason}");
        assert!(reason.contains("planted: this row cannot be processed"), "the database's reason is kept: {reason}");
    }
    let again = maintenance.run_once(Some(later)).await.expect("the next pass runs clean");
    assert_eq!(again.quarantined, 0);
}

/// The issue's own reproduction, on the schema before the key limit: a
/// delayed job whose key is past the index's size limit was accepted and
/// then failed the due sweep of every host. Such a row, left by an older
/// version, is now failed alone; the enqueue paths refuse new ones.
#[tokio::test]
async fn an_over_long_key_is_refused_at_enqueue_and_an_old_one_is_failed_alone() {
    let db = TestDb::postgres().await;
    register(&db).await;
    let long_key = "k".repeat(3_000);
    let error = db.store.job_enqueue(&[delayed("lim", json!({ "key": long_key }))]).await.unwrap_err();
    assert!(error.to_string().contains("more than the most a key may have, 1024 bytes"), "{error}");
    let refused = sqlx::query("SELECT jobhost.enqueue('lim', jsonb_build_object('key', repeat('k', 3000)))")
        .execute(db.pool())
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("concurrency_key_at_most_1024_bytes"), "{refused}");

    // A row written before the limit existed.
    db.execute("ALTER TABLE jobhost.jobs DROP CONSTRAINT concurrency_key_at_most_1024_bytes").await;
    let old = enqueue(&db, delayed("mail", json!({"n": 0}))).await;
    db.execute(format!(
        "UPDATE jobhost.jobs SET job = 'lim', concurrency_key = (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200))
         WHERE id = {old}"
    ))
    .await;
    db.execute(
        "ALTER TABLE jobhost.jobs ADD CONSTRAINT concurrency_key_at_most_1024_bytes
         CHECK (octet_length(concurrency_key) <= 1024) NOT VALID",
    )
    .await;
    let good = enqueue(&db, delayed("lim", json!({"key": "a"}))).await;
    let later = Utc::now() + chrono::Duration::hours(2);
    let maintenance = jobhost::maintenance::Maintenance::new(db.dyn_store(), Default::default()).unwrap();
    let report = maintenance.run_once(Some(later)).await.unwrap();
    assert_eq!((report.promoted, report.quarantined), (1, 1), "{report:?}");
    assert_eq!(state_of(&db, good).await, JobState::Available);
    let failed = db.store.job_get(old).await.unwrap().unwrap().row;
    assert_eq!(failed.state, JobState::Failed);
    assert!(failed.error.unwrap_or_default().contains("index row size"), "the database's reason is kept");
}

/// However many attempts fail, a job keeps the errors of its newest 25,
/// and a huge reason is stored cut; its row stays far from jsonb's limit.
async fn a_job_keeps_only_its_newest_errors(db: TestDb) {
    register(&db).await;
    let id = enqueue(&db, EnqueueParams::new("mail", json!({}))).await;
    db.execute(format!("UPDATE jobhost.jobs SET max_attempts = 1000 WHERE id = {id}")).await;
    let later = Utc::now() + chrono::Duration::hours(2);
    for round in 0..30 {
        let running = db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap();
        assert_eq!(running.len(), 1, "round {round}");
        // An expired lease on a job with attempts left appends an error and requeues it.
        assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (1, 0), "round {round}");
    }
    let errors = db.dialect("jsonb_array_length(errors)::bigint", "json_array_length(errors)");
    assert_eq!(db.scalar(format!("SELECT {errors} FROM jobhost.jobs WHERE id = {id}")).await, 25);
    let first_kept = db.dialect("(errors->0->>'attempt')::bigint", "errors->>'$[0].attempt'");
    assert_eq!(
        db.scalar(format!("SELECT {first_kept} FROM jobhost.jobs WHERE id = {id}")).await,
        6,
        "the newest are kept"
    );
    db.store.job_cancel(id).await.unwrap();
    assert_eq!(db.scalar(format!("SELECT {errors} FROM jobhost.archive WHERE id = {id}")).await, 25);
}

/// A payload past the limit is refused with the sizes named, at the Rust
/// enqueue and at a guest's enqueue call; nothing is stored.
async fn payloads_past_the_limit_are_refused_at_every_enqueue_path(db: TestDb) {
    register(&db).await;
    let big = |bytes: usize| json!({ "blob": "x".repeat(bytes) });
    let error = db.store.job_enqueue(&[EnqueueParams::new("mail", big(2 << 20))]).await.unwrap_err();
    assert!(matches!(error, jobhost::store::Error::PayloadTooLarge { max: 1_048_576, .. }), "{error}");
    assert!(error.to_string().contains("more than the largest accepted, 1048576 bytes"), "{error}");
    db.store.job_enqueue(&[EnqueueParams::new("mail", big(1 << 19))]).await.expect("half a MiB fits");

    let small = jobhost::store::EnqueueLimits { max_payload_bytes: 1024 };
    let store = jobhost::store::open_with(&db.url, 2, small).await.unwrap();
    let error = store.job_enqueue(&[EnqueueParams::new("mail", big(2000))]).await.unwrap_err();
    assert!(matches!(error, jobhost::store::Error::PayloadTooLarge { max: 1024, .. }), "{error}");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 1, "nothing more was stored");

    // A guest's child past its host's limit: the guest gets the error at the call.
    let host = common::TestHost::start(&db, &["fanout", "hello"], |config| config.limits = small).await;
    let parent = db
        .store
        .job_enqueue(&[EnqueueParams::new("fanout", json!({"count": 1, "child": { "name": "x".repeat(2000) }}))])
        .await
        .unwrap()[0];
    common::eventually(std::time::Duration::from_secs(60), || async {
        state_of(&db, parent).await == JobState::Failed
    })
    .await;
    let reason = db.store.job_get(parent).await.unwrap().unwrap().row.error.unwrap_or_default();
    assert!(reason.contains("more than the largest accepted, 1024 bytes"), "{reason}");
    assert!(reason.starts_with("payload is"), "refused at the guest's call, not at completion: {reason}");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'hello'").await, 0);
    host.stop().await;
}

on_both_backends!(
    one_bad_row_never_stalls_a_sweep,
    a_job_keeps_only_its_newest_errors,
    payloads_past_the_limit_are_refused_at_every_enqueue_path,
);

/// The SQL enqueue holds payloads to the database's setting, 1 MiB unless
/// `jobhost.max_payload_bytes` says otherwise.
#[tokio::test]
async fn the_sql_enqueue_refuses_payloads_past_the_databases_setting() {
    let db = TestDb::postgres().await;
    register(&db).await;
    let mut conn = db.pool().acquire().await.unwrap();
    let enqueue = "SELECT jobhost.enqueue('mail', jsonb_build_object('blob', repeat('x', 2000000)))";
    let refused = sqlx::query(enqueue).execute(&mut *conn).await.unwrap_err();
    assert!(refused.to_string().contains("more than the largest accepted, 1048576 bytes"), "{refused}");
    sqlx::query("SET jobhost.max_payload_bytes = '4194304'").execute(&mut *conn).await.unwrap();
    sqlx::query(enqueue).execute(&mut *conn).await.expect("accepted under a larger setting");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 1);
}
