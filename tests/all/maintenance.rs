//! No row stalls the fleet (DESIGN.md guarantee 13): a row maintenance
//! cannot process is failed alone, with the reason, and every sweep goes on
//! for every other job; and the rows that used to be such rows (over-long
//! keys, huge error histories) are refused or bounded where they are written.

use crate::common;

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

fn delayed(job: &str, payload: serde_json::Value) -> EnqueueParams {
    EnqueueParams { delay_ms: Some(60_000), ..EnqueueParams::new(job, payload) }
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
    let bad_due = db.enqueue_one(delayed("mail", json!({"n": 1}))).await;
    let good_due = db.enqueue_one(delayed("mail", json!({"n": 2}))).await;
    let limited_due = db.enqueue_one(delayed("lim", json!({"key": "a"}))).await;
    // Expired leases: one bad, one good.
    let bad_running = db.enqueue_one(EnqueueParams::new("mail", json!({"n": 3}))).await;
    let good_running = db.enqueue_one(EnqueueParams::new("mail", json!({"n": 4}))).await;
    assert_eq!(db.store.job_fetch(&fetch_params("h", &["mail"], 10)).await.unwrap().len(), 2);
    // A blocked job whose key's holder vanished: the repair frees the slot
    // and the sweep promotes it.
    let holder = db.enqueue_one(EnqueueParams::new("lim", json!({"key": "b"}))).await;
    let blocked = db.enqueue_one(EnqueueParams::new("lim", json!({"key": "b"}))).await;
    assert_eq!(db.state_of(blocked).await, JobState::Blocked);
    db.execute(format!("DELETE FROM jobhost.jobs WHERE id = {holder}")).await;
    refuse_updates_of(&db, &[bad_due, bad_running]).await;

    let later = Utc::now() + chrono::Duration::hours(2);
    let maintenance = jobhost::background::maintenance::Maintenance::new(db.dyn_store(), Default::default()).unwrap();
    let report = maintenance.run_once(Some(later)).await.expect("no sweep fails for one row");
    let mut states = Vec::new();
    for id in [bad_due, good_due, limited_due, bad_running, good_running, blocked] {
        states.push((id, db.state_of(id).await));
    }
    assert_eq!(report.quarantined, 2, "{report:?}; jobs now: {states:?}");
    assert_eq!((report.promoted, report.requeued, report.repaired), (2, 1, 1), "{report:?}");
    for id in [good_due, limited_due, good_running, blocked] {
        assert_eq!(db.state_of(id).await, JobState::Available, "job {id} was processed");
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
    let old = db.enqueue_one(delayed("mail", json!({"n": 0}))).await;
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
    let good = db.enqueue_one(delayed("lim", json!({"key": "a"}))).await;
    let later = Utc::now() + chrono::Duration::hours(2);
    let maintenance = jobhost::background::maintenance::Maintenance::new(db.dyn_store(), Default::default()).unwrap();
    let report = maintenance.run_once(Some(later)).await.unwrap();
    assert_eq!((report.promoted, report.quarantined), (1, 1), "{report:?}");
    assert_eq!(db.state_of(good).await, JobState::Available);
    let failed = db.store.job_get(old).await.unwrap().unwrap().row;
    assert_eq!(failed.state, JobState::Failed);
    assert!(failed.error.unwrap_or_default().contains("index row size"), "the database's reason is kept");
}

/// However many attempts fail, a job keeps the errors of its newest 25,
/// and a huge reason is stored cut; its row stays far from jsonb's limit.
async fn a_job_keeps_only_its_newest_errors(db: TestDb) {
    register(&db).await;
    let id = db.enqueue_one(EnqueueParams::new("mail", json!({}))).await;
    db.execute(format!("UPDATE jobhost.jobs SET max_attempts = 1000 WHERE id = {id}")).await;
    let later = Utc::now() + chrono::Duration::hours(2);
    for round in 0..30 {
        let running = db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap();
        assert_eq!(running.len(), 1, "round {round}");
        let run = jobhost::store::RunId { job_id: running[0].id, lease_token: running[0].lease_token };
        common::confirm_started(&db, &[run]).await;
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
    common::eventually(std::time::Duration::from_secs(60), || async { db.state_of(parent).await == JobState::Failed })
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

/// A job type `lim1` limited to one at a time per `{key}`, with one attempt:
/// the expiry of its lease ends the job, giving back its slot.
async fn register_single_attempt(db: &TestDb) {
    let mut limited = job_config("lim1");
    limited.max_attempts = 1;
    limited.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{key}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    db.store.job_types_register(&[(limited, "d-lim1".into())]).await.unwrap();
}

/// Sets a database-wide `lock_timeout` (as an operator might) and opens a
/// store after it, whose sessions would take it up unless they override it.
async fn store_under_database_lock_timeout(db: &TestDb, timeout: &str) -> jobhost::store::Store {
    let name = db.texts("SELECT current_database()::text").await.remove(0);
    db.execute(format!("ALTER DATABASE {name} SET lock_timeout = '{timeout}'")).await;
    jobhost::store::open(&db.url, 4).await.unwrap()
}

/// An application's open transaction enqueues to key `key` through SQL,
/// holding the key's semaphore row until it commits.
async fn application_holding_key(db: &TestDb, job: &str, key: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut application = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.enqueue($1, jsonb_build_object('key', $2::text))")
        .bind(job)
        .bind(key)
        .execute(&mut *application)
        .await
        .unwrap();
    application
}

/// Issue 32, item 1, as reproduced: with a database-wide `lock_timeout`, a
/// delayed limited job came due while an application's transaction held its
/// key, and maintenance archived it as failed ("could not process this
/// job") on attempt 0. A lock wait says nothing about the row: the due job
/// is left for the next pass, the other due jobs pass the gate meanwhile,
/// and once the application commits it is admitted (here blocked behind
/// the application's job, which took the key's one slot).
#[tokio::test]
async fn a_due_job_whose_key_is_locked_waits_and_is_never_failed() {
    let db = TestDb::postgres().await;
    register(&db).await;
    let store = store_under_database_lock_timeout(&db, "100ms").await;
    let locked = db.enqueue_one(delayed("lim", json!({"key": "q"}))).await;
    let free = db.enqueue_one(delayed("lim", json!({"key": "r"}))).await;
    let plain = db.enqueue_one(delayed("mail", json!({"n": 1}))).await;
    let application = application_holding_key(&db, "lim", "q").await;

    let later = Utc::now() + chrono::Duration::hours(2);
    let maintenance = jobhost::background::maintenance::Maintenance::new(store, Default::default()).unwrap();
    let report = maintenance.run_once(Some(later)).await.expect("a lock wait is not a failed sweep");
    assert_eq!((report.quarantined, report.busy, report.promoted), (0, 1, 2), "{report:?}");
    assert_eq!(db.state_of(locked).await, JobState::Scheduled, "left due for the next pass");
    assert_eq!((db.state_of(free).await, db.state_of(plain).await), (JobState::Available, JobState::Available));

    application.commit().await.unwrap();
    let report = maintenance.run_once(Some(later)).await.unwrap();
    assert_eq!((report.quarantined, report.busy), (0, 0), "{report:?}");
    assert_eq!(db.state_of(locked).await, JobState::Blocked, "admitted through the gate once the lock went");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, 0, "nothing was failed");
}

/// An expired lease whose job has spent its attempts gives its slot back;
/// while an application holds that key, the expiry leaves the job for the
/// next pass (on PostgreSQL it takes the key with SKIP LOCKED and never
/// waits for it) instead of failing it as a row it cannot process. It then
/// ends the job as any expiry does, with the lease's own reason.
#[tokio::test]
async fn an_expiry_that_waits_for_a_lock_fails_nothing_early() {
    let db = TestDb::postgres().await;
    register_single_attempt(&db).await;
    let store = store_under_database_lock_timeout(&db, "100ms").await;
    let id = db.enqueue_one(EnqueueParams::new("lim1", json!({"key": "q"}))).await;
    let run = db.store.job_fetch(&fetch_params("h", &["lim1"], 1)).await.unwrap().remove(0);
    let started = jobhost::store::RunId { job_id: run.id, lease_token: run.lease_token };
    common::confirm_started(&db, &[started]).await;
    let application = application_holding_key(&db, "lim1", "q").await;

    let later = Utc::now() + chrono::Duration::hours(2);
    let maintenance = jobhost::background::maintenance::Maintenance::new(store, Default::default()).unwrap();
    let report = maintenance.run_once(Some(later)).await.unwrap();
    assert_eq!((report.quarantined, report.failed, report.requeued), (0, 0, 0), "{report:?}");
    assert_eq!(db.state_of(id).await, JobState::Running, "still its host's until the expiry can end it");

    application.commit().await.unwrap();
    let report = maintenance.run_once(Some(later)).await.unwrap();
    assert_eq!((report.quarantined, report.failed), (0, 1), "{report:?}");
    let ended = db.store.job_get(id).await.unwrap().unwrap().row;
    assert_eq!(ended.state, JobState::Failed);
    assert!(ended.error.unwrap_or_default().starts_with("lease expired"), "ended by its lease, not by maintenance");
    assert_eq!(db.state_of(id + 1).await, JobState::Available, "the application's job took the freed slot");
}

/// A completion whose child must wait for its key (an application's open
/// transaction enqueuing to it) waits, under a database-wide
/// `lock_timeout` too; before, the timeout made the write fail as a result
/// the database refused, and the host recorded the completed run as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_waits_out_a_lock_under_a_database_wide_lock_timeout() {
    let db = TestDb::postgres().await;
    register(&db).await;
    let store = store_under_database_lock_timeout(&db, "100ms").await;
    let parent = db.enqueue_one(EnqueueParams::new("mail", json!({}))).await;
    let run = store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap().remove(0);
    let application = application_holding_key(&db, "lim", "q").await;
    let child = jobhost::types::ChildJob {
        job: "lim".into(),
        payload: json!({"key": "q"}),
        queue: None,
        priority: None,
        delay_ms: None,
        batch: None,
    };
    let outcome = jobhost::store::FinishOutcome::Completed {
        output: None,
        children: vec![child].into(),
        batches: Default::default(),
        workflows: Default::default(),
        events: Default::default(),
        schedules: Default::default(),
    };
    let finishing = tokio::spawn({
        let store = store.clone();
        let finish = common::finish(&run, outcome);
        async move { store.job_finish(vec![finish]).await }
    });
    // The write is waiting for the application's lock: let it wait longer
    // than the database-wide timeout before the application commits.
    common::eventually(std::time::Duration::from_secs(30), || async {
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'jobhost' AND wait_event_type = 'Lock'
               AND clock_timestamp() - query_start > interval '300 milliseconds'",
        )
        .await
            == 1
    })
    .await;
    application.commit().await.unwrap();
    let written = finishing.await.unwrap().expect("the write waited for the lock instead of failing");
    assert_eq!(written, vec![jobhost::store::FinishResult::Done]);
    assert_eq!(db.state_of(parent).await, JobState::Completed);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs WHERE job = 'lim'").await, 1, "its child");
}

/// What the database says when a statement waited too long or was
/// cancelled is neither a refusal (a bad row, to be failed) nor final: the
/// same statement may pass later. Each error here is the server's own.
#[tokio::test]
async fn waits_and_cancels_are_transient_not_refusals() {
    let db = TestDb::postgres().await;
    register(&db).await;
    db.enqueue_one(EnqueueParams::new("mail", json!({}))).await;
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.jobs FOR UPDATE").execute(&mut *holder).await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let mut error_of = async |setting: &str, statement: &str| {
        sqlx::query(sqlx::AssertSqlSafe(setting.to_string())).execute(&mut *conn).await.unwrap();
        let error = jobhost::store::Error::from(
            sqlx::query(sqlx::AssertSqlSafe(statement.to_string())).execute(&mut *conn).await.unwrap_err(),
        );
        sqlx::query("RESET ALL").execute(&mut *conn).await.unwrap();
        error
    };
    let lock_timeout = error_of("SET lock_timeout = '50ms'", "SELECT 1 FROM jobhost.jobs FOR UPDATE").await;
    let nowait = error_of("SET lock_timeout = 0", "SELECT 1 FROM jobhost.jobs FOR UPDATE NOWAIT").await;
    let statement_timeout = error_of("SET statement_timeout = '50ms'", "SELECT pg_sleep(5)").await;
    for (what, error) in
        [("lock timeout", &lock_timeout), ("nowait", &nowait), ("statement timeout", &statement_timeout)]
    {
        assert!(!error.is_refusal() && error.is_transient(), "{what}: {error}");
    }
    assert!(lock_timeout.is_lock_timeout() && nowait.is_lock_timeout() && !statement_timeout.is_lock_timeout());
    holder.rollback().await.unwrap();

    // The server ends a session idle in a transaction past its timeout.
    let mut idle = db.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL idle_in_transaction_session_timeout = '50ms'").execute(&mut *idle).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *idle).await.unwrap();
    common::eventually(std::time::Duration::from_secs(30), || async {
        db.scalar(format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}")).await == 0
    })
    .await;
    let error = jobhost::store::Error::from(sqlx::query("SELECT 1").execute(&mut *idle).await.unwrap_err());
    assert!(!error.is_refusal(), "an idle-in-transaction timeout: {error}");
}
