//! The durable queue against a real PostgreSQL: enqueue, fetch, leases,
//! completion, retries and the guarantees they carry (DESIGN.md 5, 6, 8, 9, 10).

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use jobhost::store::{
    EnqueueParams, FinishOutcome, FinishResult, JobFilter, JobState, LeaseRenew, LeaseRenewal, RunId, StrayLease,
};
use jobhost::types::ChildJob;
use serde_json::json;

use common::db::{Backend, TestDb, on_both_backends};
use common::{TestHost, completed, eventually, fetch_params, finish, job_config};

const WITHIN: Duration = Duration::from_secs(30);

async fn with_types(db: TestDb, names: &[&str]) -> TestDb {
    let types: Vec<_> = names.iter().map(|n| (job_config(n), format!("digest-{n}"))).collect();
    db.store.job_types_register(&types).await.unwrap();
    db
}

/// Two jobs of type `job`, enqueued and leased to host "h".
async fn two_running(db: &TestDb, job: &str) -> Vec<jobhost::store::FetchedJob> {
    let jobs = [EnqueueParams::new(job, json!({})), EnqueueParams::new(job, json!({}))];
    db.store.job_enqueue(&jobs).await.unwrap();
    db.store.job_fetch(&fetch_params("h", &[job], 2)).await.unwrap()
}

async fn payloads_are_stored_as_json_documents(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let payload = json!({"to": "ada@example.com", "n": 3});
    db.store.job_enqueue(&[EnqueueParams::new("mail", payload.clone())]).await.unwrap();
    let is_object = db.dialect("jsonb_typeof(payload) = 'object'", "json_type(payload) = 'object'");
    let field_n = db.dialect("(payload->>'n')::bigint", "payload->>'n'");
    assert_eq!(db.scalar(&format!("SELECT count(*) FROM jobhost.jobs WHERE {is_object}")).await, 1);
    assert_eq!(db.scalar(&format!("SELECT {field_n} FROM jobhost.jobs")).await, 3);
    // A JSON string holding JSON is refused, not stored (guarantee 8).
    let encoded = EnqueueParams::new("mail", json!(payload.to_string()));
    let error = db.store.job_enqueue(&[encoded]).await.unwrap_err();
    assert!(error.to_string().contains("must be a JSON object"), "{error}");
    let fetched = db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap();
    assert_eq!(fetched[0].payload, payload);
}

async fn a_bulk_enqueue_returns_ids_in_input_order(db: TestDb) {
    let db = with_types(db, &["mail", "other"]).await;
    let jobs: Vec<_> =
        (0..500).map(|i| EnqueueParams::new(if i % 3 == 0 { "other" } else { "mail" }, json!({ "i": i }))).collect();
    let ids = db.store.job_enqueue(&jobs).await.unwrap();
    assert_eq!(ids.len(), jobs.len());
    for (i, id) in ids.iter().enumerate().step_by(37) {
        let stored = db.store.job_get(*id).await.unwrap().unwrap();
        assert_eq!((stored.row.job.as_str(), &stored.payload), (jobs[i].job.as_str(), &jobs[i].payload), "id {id}");
    }
}

async fn unknown_job_types_and_bad_payloads_enqueue_nothing(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let batch = [EnqueueParams::new("mail", json!({})), EnqueueParams::new("nope", json!({}))];
    let error = db.store.job_enqueue(&batch).await.unwrap_err();
    assert!(error.to_string().contains("unknown job type \"nope\""), "{error}");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0, "all or none");
}

async fn concurrent_fetchers_never_share_a_job(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let jobs: Vec<_> = (0..2000).map(|i| EnqueueParams::new("mail", json!({"i": i}))).collect();
    db.store.job_enqueue(&jobs).await.unwrap();
    let fetchers: Vec<_> = (0..8)
        .map(|w| {
            let store = db.dyn_store();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    let batch = store.job_fetch(&fetch_params(&format!("host-{w}"), &["mail"], 7)).await.unwrap();
                    if batch.is_empty() {
                        return seen;
                    }
                    seen.extend(batch.iter().map(|j| (j.id, j.lease_token)));
                }
            })
        })
        .collect();
    let mut ids = HashSet::new();
    let mut tokens = HashSet::new();
    for fetcher in fetchers {
        for (id, token) in fetcher.await.unwrap() {
            assert!(ids.insert(id), "job {id} handed out twice");
            assert!(tokens.insert(token), "lease token {token} reused");
        }
    }
    assert_eq!(ids.len(), 2000);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'running'").await, 2000);
}

async fn fetch_follows_priority_then_time_and_serves_only_loaded_types(db: TestDb) {
    let db = with_types(db, &["a", "b"]).await;
    let low = EnqueueParams { priority: Some(5), ..EnqueueParams::new("a", json!({"n": "low"})) };
    let high = EnqueueParams { priority: Some(-5), ..EnqueueParams::new("a", json!({"n": "high"})) };
    let other = EnqueueParams::new("b", json!({"n": "other type"}));
    db.store.job_enqueue(&[low, other, high]).await.unwrap();
    let fetched = db.store.job_fetch(&fetch_params("h", &["a"], 10)).await.unwrap();
    let mut names: Vec<_> = fetched.iter().map(|j| (j.id, j.payload["n"].as_str().unwrap().to_string())).collect();
    names.sort();
    assert_eq!(names.len(), 2, "type b is not loaded here");
    let first = db.store.job_fetch(&fetch_params("h2", &["b"], 1)).await.unwrap();
    assert_eq!(first[0].job, "b");
    // Order: the single-slot fetch of a fresh pair takes the higher priority.
    db.store
        .job_enqueue(&[
            EnqueueParams { priority: Some(1), ..EnqueueParams::new("a", json!({"n": 1})) },
            EnqueueParams { priority: Some(0), ..EnqueueParams::new("a", json!({"n": 0})) },
        ])
        .await
        .unwrap();
    let next = db.store.job_fetch(&fetch_params("h", &["a"], 1)).await.unwrap();
    assert_eq!(next[0].payload["n"], 0);
}

/// A run's `started_at` is set again when its guest starts late, through
/// its current lease only: one batch of notes, each matched on its run.
async fn a_late_start_is_recorded_for_the_current_run_only(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let two = [EnqueueParams::new("mail", json!({})), EnqueueParams::new("mail", json!({}))];
    db.store.job_enqueue(&two).await.unwrap();
    let jobs = db.store.job_fetch(&fetch_params("host", &["mail"], 2)).await.unwrap();
    let run = |job: &jobhost::store::FetchedJob| RunId { job_id: job.id, lease_token: job.lease_token };
    db.execute(db.dialect(
        "UPDATE jobhost.jobs SET started_at = started_at - interval '1 hour'",
        "UPDATE jobs SET started_at = started_at - 3600000",
    ))
    .await;
    let started_before_enqueued = "SELECT count(*) FROM jobhost.jobs WHERE started_at < enqueued_at";
    let stale = RunId { lease_token: jobs[0].lease_token + 1, ..run(&jobs[0]) };
    db.store.lease_started(&[stale, run(&jobs[1])]).await.unwrap();
    assert_eq!(db.scalar(started_before_enqueued).await, 1, "another lease token changes nothing");
    db.store.lease_started(&[run(&jobs[0])]).await.unwrap();
    assert_eq!(db.scalar(started_before_enqueued).await, 0, "each current run's start is now");
}

async fn a_stale_lease_token_completes_nothing(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    db.store.job_enqueue(&[EnqueueParams::new("mail", json!({}))]).await.unwrap();
    let first = db.store.job_fetch(&fetch_params("slow-host", &["mail"], 1)).await.unwrap().remove(0);
    // The first host goes silent; by the database's clock an hour later its lease has expired.
    let later = Utc::now() + chrono::Duration::hours(1);
    assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (1, 0));
    let second = db.store.job_fetch(&fetch_params("new-host", &["mail"], 1)).await.unwrap().remove(0);
    assert_eq!(second.id, first.id);
    assert_ne!(second.lease_token, first.lease_token);

    // The first host's late result is a duplicate: nothing changes, no child is written.
    let child = ChildJob {
        job: "mail".into(),
        payload: json!({"child": true}),
        queue: None,
        priority: None,
        delay_ms: None,
        batch: None,
    };
    let late = FinishOutcome::Completed {
        output: None,
        children: vec![child].into(),
        batches: Default::default(),
        workflows: Default::default(),
        events: Default::default(),
        schedules: Default::default(),
    };
    assert_eq!(db.store.job_finish(vec![finish(&first, late)]).await.unwrap(), [FinishResult::Duplicate]);
    let retry = FinishOutcome::Retry { error: "late".into(), delay_ms: 0 };
    assert_eq!(db.store.job_finish(vec![finish(&first, retry)]).await.unwrap(), [FinishResult::Duplicate]);
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'running' AND host_id = 'new-host'").await,
        1
    );
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 1, "no child from the stale completion");

    assert_eq!(db.store.job_finish(vec![finish(&second, completed())]).await.unwrap(), [FinishResult::Done]);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await, 1);
    // A repeated completion with the right token is a duplicate too: exactly once.
    assert_eq!(db.store.job_finish(vec![finish(&second, completed())]).await.unwrap(), [FinishResult::Duplicate]);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, 1);
}

/// The probe a host sends to learn whether result writes pass again goes
/// the way of a result write and changes nothing: not a running job, not
/// its lease, not the archive.
async fn a_result_write_probe_changes_nothing(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let running = two_running(&db, "mail").await;
    let leases = "SELECT string_agg(id || ':' || lease_token || ':' || attempt, ',' ORDER BY id) FROM jobhost.jobs";
    let before = db.texts(leases).await;
    db.store.result_write_probe().await.expect("the probe is written");
    assert_eq!(db.texts(leases).await, before, "the running jobs and their leases are as they were");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, 0, "nothing archived");
    let results = db.store.job_finish(running.iter().map(|job| finish(job, completed())).collect()).await.unwrap();
    assert_eq!(results, [FinishResult::Done, FinishResult::Done], "their results are written as before");
}

/// A host whose result writes failed while its lease ran out may lease the
/// job again and write both runs' results in one batch. Only the newer
/// lease's result counts: the stale one is a duplicate and writes no child,
/// whichever way each run ended.
async fn a_stale_result_batched_with_the_current_one_is_a_duplicate(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let child = ChildJob {
        job: "mail".into(),
        payload: json!({"child": true}),
        queue: None,
        priority: None,
        delay_ms: None,
        batch: None,
    };
    let stale_completion = || FinishOutcome::Completed {
        output: None,
        children: vec![child.clone()].into(),
        batches: Default::default(),
        workflows: Default::default(),
        events: Default::default(),
        schedules: Default::default(),
    };
    let retry = || FinishOutcome::Retry { error: "again".into(), delay_ms: 3_600_000 };
    for (round, current) in [retry(), completed()].into_iter().enumerate() {
        let id = db.store.job_enqueue(&[EnqueueParams::new("mail", json!({"round": round}))]).await.unwrap()[0];
        let first = db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap().remove(0);
        let later = Utc::now() + chrono::Duration::hours(1);
        assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (1, 0), "round {round}");
        let second = db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap().remove(0);
        assert_eq!((first.id, second.id), (id, id));
        // Either order in the batch: the newer lease decides.
        let batch = if round == 0 {
            vec![finish(&first, stale_completion()), finish(&second, current)]
        } else {
            vec![finish(&second, current), finish(&first, stale_completion())]
        };
        let results = db.store.job_finish(batch).await.unwrap();
        let expected = if round == 0 {
            [FinishResult::Duplicate, FinishResult::Done]
        } else {
            [FinishResult::Done, FinishResult::Duplicate]
        };
        assert_eq!(results, expected, "round {round}");
        let children = db.scalar(&format!("SELECT count(*) FROM jobhost.jobs WHERE parent_id = {id}")).await;
        assert_eq!(children, 0, "round {round}: no child of the stale completion");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'scheduled'").await, 1, "the retry");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await, 1);
}

async fn children_are_written_only_with_their_parents_completion(db: TestDb) {
    let db = with_types(db, &["parent", "child"]).await;
    let fetched = two_running(&db, "parent").await;
    let child = |n| ChildJob {
        job: "child".into(),
        payload: json!({"n": n}),
        queue: None,
        priority: None,
        delay_ms: None,
        batch: None,
    };
    let done = FinishOutcome::Completed {
        output: None,
        children: vec![child(1), child(2)].into(),
        batches: Default::default(),
        workflows: Default::default(),
        events: Default::default(),
        schedules: Default::default(),
    };
    let failed = FinishOutcome::Failed { error: "gave up".into() };
    db.store.job_finish(vec![finish(&fetched[0], done), finish(&fetched[1], failed)]).await.unwrap();
    let parents = db.scalar("SELECT count(DISTINCT parent_id) FROM jobhost.jobs WHERE job = 'child'").await;
    let parent = db.scalar("SELECT min(parent_id) FROM jobhost.jobs WHERE job = 'child'").await;
    assert_eq!((parents, parent), (1, fetched[0].id));
    let is_object = db.dialect("jsonb_typeof(payload) = 'object'", "json_type(payload) = 'object'");
    assert_eq!(db.scalar(&format!("SELECT count(*) FROM jobhost.jobs WHERE job = 'child' AND {is_object}")).await, 2);
}

async fn a_child_of_an_unknown_type_fails_its_parent_instead_of_the_batch(db: TestDb) {
    let db = with_types(db, &["parent"]).await;
    let fetched = two_running(&db, "parent").await;
    let orphan =
        ChildJob { job: "ghost".into(), payload: json!({}), queue: None, priority: None, delay_ms: None, batch: None };
    let results = db
        .store
        .job_finish(vec![
            finish(
                &fetched[0],
                FinishOutcome::Completed {
                    output: None,
                    children: vec![orphan].into(),
                    batches: Default::default(),
                    workflows: Default::default(),
                    events: Default::default(),
                    schedules: Default::default(),
                },
            ),
            finish(&fetched[1], completed()),
        ])
        .await
        .unwrap();
    assert_eq!(results, [FinishResult::Done, FinishResult::Done]);
    let error = db.store.job_get(fetched[0].id).await.unwrap().unwrap().row.error.unwrap();
    assert!(error.contains("unknown job type \"ghost\""), "{error}");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await, 1);
}

async fn retries_wait_in_schedule_then_pass_when_due_by_the_database_clock(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    db.store.job_enqueue(&[EnqueueParams::new("mail", json!({}))]).await.unwrap();
    let job = db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap().remove(0);
    let retry = FinishOutcome::Retry { error: "smtp down".into(), delay_ms: 3_600_000 };
    db.store.job_finish(vec![finish(&job, retry)]).await.unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'scheduled' AND lease_token IS NULL").await,
        1
    );
    assert_eq!(db.store.job_promote_due(None).await.unwrap(), 0, "not due by the database's clock");
    assert!(db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap().is_empty());
    let later = Utc::now() + chrono::Duration::hours(2);
    assert_eq!(db.store.job_promote_due(Some(later)).await.unwrap(), 1);
    let again = db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap().remove(0);
    assert_eq!(again.attempt, 2);
    let errors = db.store.job_get(again.id).await.unwrap().unwrap().errors;
    assert_eq!(errors[0]["error"], "smtp down");
    assert_eq!(errors[0]["attempt"], 1);
}

async fn snoozes_and_hand_backs_give_the_attempt_back(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let jobs = two_running(&db, "mail").await;
    db.store
        .job_finish(vec![
            finish(&jobs[0], FinishOutcome::Snooze { delay_ms: 60_000 }),
            finish(&jobs[1], FinishOutcome::Release { reason: "shutdown".into() }),
        ])
        .await
        .unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE attempt = 0").await, 2);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'scheduled'").await, 1);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'available'").await, 1);
}

/// Guarantee 5 (issue 32, item 5): an attempt is spent only by a run that
/// started. A lease whose host never confirmed a start (its write's answer
/// lost, the host gone at once, the job still waiting for a run slot)
/// expires with its attempt given back, even on the job's last attempt;
/// a confirmed one is charged. After three unconfirmed expiries the next is
/// charged too, so a job whose run takes every host down before its first
/// heartbeat is not retried for ever.
async fn a_lease_its_host_never_confirmed_gives_its_attempt_back(db: TestDb) {
    let mut once = common::job_config("once");
    once.max_attempts = 1;
    db.store.job_types_register(&[(once, "v1".into())]).await.unwrap();
    let id = db.store.job_enqueue(&[EnqueueParams::new("once", json!({}))]).await.unwrap()[0];
    let later = Utc::now() + chrono::Duration::hours(1);
    let run_of = |job: &jobhost::store::FetchedJob| RunId { job_id: job.id, lease_token: job.lease_token };
    for round in 0..3 {
        let leased = db.store.job_fetch(&fetch_params("h", &["once"], 1)).await.unwrap().remove(0);
        assert_eq!(leased.attempt, 1, "round {round}: the first attempt, every time");
        if round == 1 {
            // Renewed while it waited for a run slot: still not started.
            let renew = LeaseRenew { host_id: "h", runs: &[run_of(&leased)], started: &[], progress: &[] };
            assert_eq!(db.store.lease_renew(&renew).await.unwrap().renewed.len(), 1);
        }
        assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (1, 0), "round {round}: requeued");
        let job = db.store.job_get(id).await.unwrap().unwrap();
        assert_eq!((job.row.state, job.row.attempts), (JobState::Available, 0), "round {round}");
        let error = job.row.error.unwrap_or_default();
        assert_eq!(error, "lease expired before host h started the run: attempt 1 given back", "round {round}");
    }
    db.store.job_fetch(&fetch_params("h", &["once"], 1)).await.unwrap();
    assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (0, 1), "the fourth unconfirmed expiry is charged");

    // A started run's lease is confirmed by the renewal that follows the
    // start, and its expiry spends the attempt.
    let id = db.store.job_enqueue(&[EnqueueParams::new("once", json!({}))]).await.unwrap()[0];
    let leased = db.store.job_fetch(&fetch_params("h", &["once"], 1)).await.unwrap().remove(0);
    common::renew(&db, "h", &[run_of(&leased)], &[]).await;
    assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (0, 1));
    let failed = db.store.job_get(id).await.unwrap().unwrap().row;
    assert_eq!((failed.state, failed.attempts), (JobState::Failed, 1));
    assert!(failed.error.unwrap_or_default().starts_with("lease expired: host h stopped during the run"));
}

async fn an_expired_lease_on_the_last_attempt_fails_the_job(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    db.store.job_enqueue(&[EnqueueParams::new("mail", json!({}))]).await.unwrap();
    let later = Utc::now() + chrono::Duration::hours(1);
    for _ in 0..3 {
        let run = db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap().remove(0);
        common::confirm_started(&db, &[RunId { job_id: run.id, lease_token: run.lease_token }]).await;
        db.store.lease_expire(Some(later)).await.unwrap();
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'failed' AND attempt = 3").await, 1);
    let errors = db.dialect("jsonb_array_length(errors)::bigint", "json_array_length(errors)");
    assert_eq!(db.scalar(&format!("SELECT {errors} FROM jobhost.archive")).await, 3);
    // A lease that has not expired by the database's clock is left alone (guarantee 10).
    db.store.job_enqueue(&[EnqueueParams::new("mail", json!({}))]).await.unwrap();
    db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap();
    assert_eq!(db.store.lease_expire(None).await.unwrap(), (0, 0));
}

async fn renewal_extends_only_the_hosts_own_current_leases(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let jobs = two_running(&db, "mail").await;
    let current = RunId { job_id: jobs[0].id, lease_token: jobs[0].lease_token };
    let stale = RunId { job_id: jobs[1].id, lease_token: jobs[1].lease_token + 999 };
    let renewal = common::renew(&db, "h", &[current, stale], &[]).await;
    let unasked = RunId { job_id: jobs[1].id, lease_token: jobs[1].lease_token };
    let stray = StrayLease { run: unasked, attempt: 1, concurrency_key: None, batch_id: None };
    assert_eq!(
        renewal,
        LeaseRenewal { renewed: vec![current], lost: vec![stale], cancelled: vec![], strays: vec![stray] },
        "the run it did not ask about, never confirmed, is a stray"
    );
    let renewal = common::renew(&db, "other-host", &[current], &[]).await;
    assert_eq!(
        renewal,
        LeaseRenewal { renewed: vec![], lost: vec![current], cancelled: vec![], strays: vec![] },
        "another host's lease is not ours"
    );
}

async fn delayed_jobs_wait_until_due(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let delayed = EnqueueParams { delay_ms: Some(3_600_000), ..EnqueueParams::new("mail", json!({})) };
    db.store.job_enqueue(&[delayed]).await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'scheduled'").await, 1);
    assert!(db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap().is_empty());
    assert_eq!(db.store.job_promote_due(None).await.unwrap(), 0);
    let later = Utc::now() + chrono::Duration::hours(2);
    assert_eq!(db.store.job_promote_due(Some(later)).await.unwrap(), 1);
    assert_eq!(db.store.job_fetch(&fetch_params("h", &["mail"], 1)).await.unwrap().len(), 1);
}

// PostgreSQL only: the SQL enqueue is a PostgreSQL function (SQLite has no
// stored functions; its enqueuers go through the host's store).
#[tokio::test]
async fn sql_enqueue_follows_the_same_rules() {
    let db = with_types(TestDb::postgres().await, &["mail"]).await;
    let id: i64 = sqlx::query_scalar("SELECT jobhost.enqueue('mail', '{\"to\": \"x\"}'::jsonb)")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let (state, attempts): (String, i32) = sqlx::query_as("SELECT state, max_attempts FROM jobhost.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!((state.as_str(), attempts), ("available", 3), "the job type's defaults apply");
    for (sql, expected) in [
        ("SELECT jobhost.enqueue('nope', '{}'::jsonb)", "unknown job type"),
        ("SELECT jobhost.enqueue('mail', '\"{}\"'::jsonb)", "must be a JSON object"),
        ("SELECT jobhost.enqueue('mail', '{}'::jsonb, 'Bad Queue')", "queue"),
    ] {
        let error = sqlx::query(sql).execute(db.pool()).await.unwrap_err();
        assert!(error.to_string().contains(expected), "{sql}: {error}");
    }
}

// PostgreSQL only: SQLite renders keys with the Rust renderer alone.
#[tokio::test]
async fn sql_and_rust_render_concurrency_keys_alike() {
    let template = "acct:{account}/{region}-{{x}}";
    let parsed = jobhost::template::KeyTemplate::parse(template).unwrap();
    let db = TestDb::postgres().await;
    for payload in [
        json!({"account": 42, "region": "eu"}),
        json!({"account": "a b", "region": true}),
        json!({"account": -7, "region": 1.5}),
    ] {
        let sql: String = sqlx::query_scalar("SELECT jobhost.render_key($1, $2)")
            .bind(template)
            .bind(sqlx::types::Json(&payload))
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(sql, parsed.render(&payload).unwrap(), "{payload}");
    }
    let missing = sqlx::query("SELECT jobhost.render_key('{id}', '{}'::jsonb)").execute(db.pool()).await.unwrap_err();
    assert!(missing.to_string().contains("no field \"id\""), "{missing}");
}

async fn operators_retry_cancel_list_and_prune(db: TestDb) {
    let db = with_types(db, &["mail"]).await;
    let ids = db
        .store
        .job_enqueue(&[EnqueueParams::new("mail", json!({"n": 1})), EnqueueParams::new("mail", json!({"n": 2}))])
        .await
        .unwrap();
    db.store.job_cancel(ids[0]).await.unwrap();
    let error = db.store.job_cancel(ids[0]).await.unwrap_err();
    assert!(error.to_string().contains("is cancelled"), "{error}");
    let cancelled = db
        .store
        .job_list(&JobFilter { state: Some(JobState::Cancelled), limit: 10, ..JobFilter::default() })
        .await
        .unwrap();
    assert_eq!(cancelled.iter().map(|r| r.id).collect::<Vec<_>>(), [ids[0]]);

    db.store.job_retry(ids[0]).await.unwrap();
    let detail = db.store.job_get(ids[0]).await.unwrap().unwrap();
    assert_eq!((detail.row.state, detail.row.attempts), (JobState::Available, 0));
    assert!(db.store.job_retry(ids[1]).await.is_err(), "an available job has nothing to retry");

    let stats = db.store.job_stats().await.unwrap();
    assert_eq!(stats.states[&JobState::Available], 2);
    assert_eq!(stats.states.len(), JobState::ALL.len());

    for job in db.store.job_fetch(&fetch_params("h", &["mail"], 2)).await.unwrap() {
        db.store.job_finish(vec![finish(&job, completed())]).await.unwrap();
    }
    assert_eq!(db.store.archive_prune(None, 3600.0, 100).await.unwrap(), 0, "kept for the retention period");
    let later = Utc::now() + chrono::Duration::days(8);
    assert_eq!(db.store.archive_prune(Some(later), 7.0 * 86400.0, 100).await.unwrap(), 2);

    // A host killed a day ago never left; its row goes, a live host's stays.
    db.store
        .host_upsert(&jobhost::store::HostInfo::current(vec!["mail".into()], Duration::from_secs(5)))
        .await
        .unwrap();
    db.execute(db.dialect(
        "INSERT INTO jobhost.hosts (id, hostname, pid, version, last_seen_at)
         VALUES ('gone', 'h', 1, 'v', now() - interval '2 days')",
        "INSERT INTO hosts (id, hostname, pid, version, started_at, last_seen_at)
         VALUES ('gone', 'h', 1, 'v', 0, unixepoch() * 1000 - 2 * 86400000)",
    ))
    .await;
    assert_eq!(db.store.host_prune(86400.0).await.unwrap(), 1);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.hosts").await, 1);
}

// --- Through a real host running real components. ---

async fn a_host_runs_jobs_retries_and_keeps_children_of_completed_parents_only(db: TestDb) {
    let host = TestHost::start(&db, &["hello", "flaky", "fanout", "trap"], |_| {}).await;
    let client = jobhost::Client::from_store(db.dyn_store());
    let hello = client.enqueue("hello", json!({"name": "Ada"})).await.unwrap();
    let flaky = client.enqueue("flaky", json!({"fail_times": 2})).await.unwrap();
    let doomed = client.enqueue("flaky", json!({"fail_times": 99})).await.unwrap();
    let parent = client.enqueue("fanout", json!({"count": 3})).await.unwrap();
    let failed_parent = client.enqueue("fanout", json!({"count": 3, "fail": true})).await.unwrap();
    let trap = client.enqueue("trap", json!({"message": "the disk is lava"})).await.unwrap();

    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.jobs").await == 0 }).await;
    let get = |id| {
        let store = db.dyn_store();
        async move { store.job_get(id).await.unwrap().unwrap() }
    };
    let hello = get(hello).await;
    assert_eq!(hello.output, Some(json!({"greeting": "hello, Ada", "job_id": hello.row.id})));
    assert_eq!(hello.log.unwrap()["lines"][0]["message"], "greeting Ada");

    let flaky = get(flaky).await;
    assert_eq!((flaky.row.state, flaky.row.attempts), (JobState::Completed, 3));
    assert_eq!(flaky.errors.as_array().unwrap().len(), 2, "each failed attempt's error is kept");

    let doomed = get(doomed).await;
    assert_eq!((doomed.row.state, doomed.row.attempts), (JobState::Failed, 5), "max attempts from describe()");

    let trap = get(trap).await;
    assert_eq!(trap.row.state, JobState::Failed);
    assert!(trap.row.error.unwrap().contains("the disk is lava"));

    let children = |parent: i64| db.scalar(format!("SELECT count(*) FROM jobhost.archive WHERE parent_id = {parent}"));
    assert_eq!(children(parent).await, 3);
    // Inside a host, the fleet's job types are known: the guest saw the error.
    let parent_output = get(parent).await.output.unwrap();
    assert!(parent_output["unknown_type_error"].as_str().unwrap().contains("unknown job type"), "{parent_output}");
    assert_eq!(children(failed_parent).await, 0, "a failed parent leaves no children (guarantee 9)");
    host.stop().await;
}

/// A child the enqueue rules refuse is refused at the guest's call, with the
/// reason the completion would give: the guest sees it (fanout fails its run
/// with it) instead of its parent failing after the run.
async fn a_child_the_enqueue_rules_refuse_is_refused_at_the_guests_call(db: TestDb) {
    let host = TestHost::start(&db, &["fanout", "hello"], |_| {}).await;
    let client = jobhost::Client::from_store(db.dyn_store());
    let id = client.enqueue("fanout", json!({"count": 1, "child": "not an object"})).await.unwrap();
    let archived = format!("SELECT count(*) FROM jobhost.archive WHERE id = {id}");
    eventually(WITHIN, || async { db.scalar(archived.as_str()).await == 1 }).await;
    let job = db.dyn_store().job_get(id).await.unwrap().unwrap();
    assert_eq!(job.row.state, JobState::Failed);
    let error = job.row.error.unwrap();
    assert!(error.contains("payload of job \"hello\" must be a JSON object, got a string"), "{error}");
    assert!(!error.contains("could not enqueue a child job"), "refused at the call, not at completion: {error}");
    host.stop().await;
}

/// A job that snoozes for 0 seconds waits the minimum snooze instead of
/// being leased again at once, forever: compared on the stored timestamps.
async fn a_snooze_of_nothing_waits_at_least_a_second(db: TestDb) {
    let host = TestHost::start(&db, &["hostile"], |_| {}).await;
    let client = jobhost::Client::from_store(db.dyn_store());
    let id = client.enqueue("hostile", json!({"snooze": 0})).await.unwrap();
    // Read in one statement while it waits between runs: how long after its
    // run started it is due again, and its attempt count.
    let wait_ms = db.dialect("(extract(epoch FROM run_at - started_at) * 1000)::bigint", "run_at - started_at");
    let waiting = format!(
        "SELECT {wait_ms}, CAST(attempt AS BIGINT) FROM jobhost.jobs
         WHERE id = {id} AND started_at IS NOT NULL AND lease_token IS NULL"
    );
    let seen = std::sync::Mutex::new(Vec::new());
    eventually(WITHIN, || async {
        let rows = db.rows::<(i64, i64)>(&waiting).await;
        let found = !rows.is_empty();
        *seen.lock().unwrap() = rows;
        found
    })
    .await;
    host.stop().await;
    let (waits, attempt) = seen.lock().unwrap()[0];
    assert!(waits >= 1000, "due again {waits} ms after its run started");
    assert_eq!(attempt, 0, "a snooze spends no attempt");
}

async fn graceful_shutdown_hands_running_jobs_back(db: TestDb) {
    let host =
        TestHost::start(&db, &["sleep"], |config| config.worker.shutdown_grace = Duration::from_millis(100)).await;
    let client = jobhost::Client::from_store(db.dyn_store());
    for _ in 0..3 {
        client.enqueue("sleep", json!({"ms": 600_000})).await.unwrap();
    }
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'running'").await == 3 })
        .await;
    host.stop().await;
    // Handed back at once, attempt refunded, nothing held, host gone from the fleet.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM jobhost.jobs WHERE state = 'available' AND attempt = 0 AND lease_token IS NULL"
        )
        .await,
        3
    );
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.hosts").await, 0);
}

async fn a_host_that_loses_a_lease_stops_the_guest(db: TestDb) {
    // One slot: a second job can start only once the first guest is stopped.
    // A long lease keeps the local fence from firing within this test, so
    // only the refused renewal can stop the guest.
    let host = TestHost::start(&db, &["sleep", "hello"], |config| {
        config.worker.concurrency = 1;
        config.worker.default_lease = Duration::from_secs(120);
    })
    .await;
    let client = jobhost::Client::from_store(db.dyn_store());
    let id = client.enqueue("sleep", json!({"ms": 600_000})).await.unwrap();
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'running'").await == 1 })
        .await;
    let probe = client.enqueue("hello", json!({})).await.unwrap();
    // Another host takes the job over: its token changes under the first host.
    db.execute(&format!(
        "UPDATE jobhost.jobs SET lease_token = lease_token + 1000000000, host_id = 'usurper' WHERE id = {id}"
    ))
    .await;
    // The next heartbeat finds the lease gone and stops the ten-minute guest,
    // which frees the slot for the probe.
    let probe_done = format!("SELECT count(*) FROM jobhost.archive WHERE id = {probe} AND state = 'completed'");
    eventually(WITHIN, || async { db.scalar(&probe_done).await == 1 }).await;
    // The stopped run's result was a duplicate: the usurper's job is untouched.
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE host_id = 'usurper' AND state = 'running'").await, 1);
    host.stop().await;
}

async fn an_idle_host_wakes_on_notification(db: TestDb) {
    // Polling so slow that only a notification can start the job in time.
    let host = TestHost::start(&db, &["hello"], |config| config.worker.poll_interval = Duration::from_secs(3600)).await;
    // An enqueuer with a store of its own, as another process would be: only
    // the database's own signal (NOTIFY; a write to SQLite's log) can reach the host.
    let client = jobhost::Client::from_store(jobhost::store::open(&db.url, 2).await.unwrap());
    // Let the fetcher go idle on its long poll, observed through the database.
    let first = client.enqueue("hello", json!({})).await.unwrap();
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await == 1 }).await;
    let second = client.enqueue("hello", json!({})).await.unwrap();
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await == 2 }).await;
    assert!(second > first);
    host.stop().await;
}

async fn a_result_the_database_refuses_fails_its_job_without_holding_back_others(db: TestDb) {
    // The archive refuses one job's completed result, as it would a result
    // that breaks a constraint.
    match db.backend {
        Backend::Postgres => {
            sqlx::raw_sql(
                "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     IF NEW.state = 'completed' AND NEW.payload ? 'poison' THEN
                         RAISE EXCEPTION 'poisoned result';
                     END IF;
                     RETURN NEW;
                 END $$;
                 CREATE TRIGGER refuse_poison BEFORE INSERT ON jobhost.archive
                     FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
            )
            .execute(db.pool())
            .await
            .unwrap();
        }
        Backend::Sqlite => {
            db.execute(
                "CREATE TRIGGER refuse_poison BEFORE INSERT ON archive
                 WHEN NEW.state = 'completed' AND json_extract(NEW.payload, '$.poison') IS NOT NULL
                 BEGIN SELECT RAISE(ABORT, 'poisoned result'); END",
            )
            .await;
        }
    }
    // Slots enough for every job, so their results arrive together in a batch.
    let host = TestHost::start(&db, &["hello"], |config| config.worker.concurrency = 8).await;
    let client = jobhost::Client::from_store(db.dyn_store());
    let mut jobs: Vec<_> = (0..7).map(|i| EnqueueParams::new("hello", json!({"name": i.to_string()}))).collect();
    jobs.push(EnqueueParams::new("hello", json!({"poison": true})));
    client.enqueue_many(&jobs).await.unwrap();
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await == 8 }).await;
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await, 7);
    let failed = JobFilter { state: Some(JobState::Failed), limit: 10, ..JobFilter::default() };
    let error = db.store.job_list(&failed).await.unwrap().remove(0).error.unwrap();
    assert!(error.contains("could not be stored") && error.contains("poisoned result"), "{error}");
    host.stop().await;
}

// PostgreSQL's transient errors; SQLite's are in a_busy_file_is_retried_while_bad_data_is_refused.
#[tokio::test]
async fn a_deadlock_is_retried_while_bad_data_is_refused() {
    let db = TestDb::postgres().await;
    let raise = |code: &'static str| {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '{code}'; END $$"
        )))
    };
    // Refusals: bad data, a violated constraint, a trigger's exception. Not
    // refusals: a deadlock, a serialization failure, and the server failing
    // in itself (disk full, shutting down, an I/O error).
    let codes = [
        ("40P01", false),
        ("40001", false),
        ("53100", false),
        ("57P01", false),
        ("58030", false),
        ("22023", true),
        ("23505", true),
        ("P0001", true),
    ];
    for (code, refusal) in codes {
        let error = jobhost::store::Error::from(raise(code).execute(db.pool()).await.unwrap_err());
        assert_eq!(error.is_refusal(), refusal, "SQLSTATE {code}");
    }
}

#[tokio::test]
async fn a_busy_file_is_retried_while_bad_data_is_refused() {
    use sqlx::{Connection, Executor};
    let db = TestDb::sqlite().await;
    let options: sqlx::sqlite::SqliteConnectOptions = db.url.parse().unwrap();
    let options = options.busy_timeout(Duration::from_millis(10));
    // Another process holds the write lock past this one's busy timeout.
    let mut holder = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
    holder.execute("BEGIN IMMEDIATE").await.unwrap();
    let mut writer = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
    let busy = jobhost::store::Error::from(writer.execute("BEGIN IMMEDIATE").await.unwrap_err());
    assert!(!busy.is_refusal(), "a busy file is transient: {busy}");
    holder.execute("ROLLBACK").await.unwrap();
    let bad =
        writer.execute("INSERT INTO job_types (name, config, digest, updated_at) VALUES ('x', '\"text\"', 'd', 0)");
    let refused = jobhost::store::Error::from(bad.await.unwrap_err());
    assert!(refused.is_refusal(), "a violated constraint is refused: {refused}");
    // A full file (here capped at its current size) refuses nothing: the
    // same write may pass once there is room.
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count").fetch_one(&mut writer).await.unwrap();
    writer.execute(sqlx::AssertSqlSafe(format!("PRAGMA max_page_count = {pages}"))).await.unwrap();
    let big = format!(
        "INSERT INTO job_types (name, config, digest, updated_at) VALUES ('x', '{{}}', '{}', 0)",
        "d".repeat(1 << 20)
    );
    let full = jobhost::store::Error::from(writer.execute(sqlx::AssertSqlSafe(big)).await.unwrap_err());
    assert!(full.to_string().contains("full"), "{full}");
    assert!(!full.is_refusal(), "a full file is not a refusal: {full}");
}

/// SQLite only: connecting to a file switches it to WAL, a write that
/// begins with a read. SQLite reports a lock another process holds by then
/// as busy at once (waiting could deadlock), so opening retries until the
/// lock is free instead of failing.
#[tokio::test]
async fn opening_a_file_another_process_is_writing_waits_for_its_lock() {
    use sqlx::{Connection, Executor};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("jobhost.db").display());
    // Another process made the file, still in SQLite's default rollback
    // mode, and holds its write lock.
    let options = url.parse::<sqlx::sqlite::SqliteConnectOptions>().unwrap().create_if_missing(true);
    let mut holder = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
    holder.execute("CREATE TABLE t (x INTEGER)").await.unwrap();
    holder.execute("BEGIN IMMEDIATE").await.unwrap();
    holder.execute("INSERT INTO t VALUES (1)").await.unwrap();
    let opening = tokio::spawn(async move { jobhost::store::sqlite::SqliteStore::open(&url, 2).await.map(|_| ()) });
    // The fault: the lock stays held long enough for the open to meet it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.execute("COMMIT").await.unwrap();
    opening.await.unwrap().expect("opening waits for the lock");
}

/// SQLite only: hosts started together on a new file all migrate it. Each
/// either waits out another's lock or finds the migration it lost applied.
#[tokio::test]
async fn stores_migrating_a_new_file_together_all_succeed() {
    use jobhost::store::driver::SchemaDriver;
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("jobhost.db").display());
        let migrations: Vec<_> = (0..4)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(
                    async move { jobhost::store::sqlite::SqliteStore::open(&url, 2).await?.schema_migrate().await },
                )
            })
            .collect();
        for migration in migrations {
            migration.await.unwrap().unwrap_or_else(|error| panic!("round {round}: {error}"));
        }
        let store = jobhost::store::sqlite::SqliteStore::open(&url, 2).await.unwrap();
        let applied: i64 =
            sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations").fetch_one(store.pool()).await.unwrap();
        let migrations = std::fs::read_dir("migrations/sqlite").unwrap().count();
        assert_eq!(applied as usize, migrations, "round {round}: each migration recorded once");
    }
}

on_both_backends!(
    a_bulk_enqueue_returns_ids_in_input_order,
    a_late_start_is_recorded_for_the_current_run_only,
    a_host_runs_jobs_retries_and_keeps_children_of_completed_parents_only,
    a_child_the_enqueue_rules_refuse_is_refused_at_the_guests_call,
    graceful_shutdown_hands_running_jobs_back,
    a_snooze_of_nothing_waits_at_least_a_second,
    a_host_that_loses_a_lease_stops_the_guest,
    an_idle_host_wakes_on_notification,
    a_result_the_database_refuses_fails_its_job_without_holding_back_others,
    payloads_are_stored_as_json_documents,
    unknown_job_types_and_bad_payloads_enqueue_nothing,
    concurrent_fetchers_never_share_a_job,
    fetch_follows_priority_then_time_and_serves_only_loaded_types,
    a_stale_lease_token_completes_nothing,
    a_stale_result_batched_with_the_current_one_is_a_duplicate,
    a_result_write_probe_changes_nothing,
    children_are_written_only_with_their_parents_completion,
    a_child_of_an_unknown_type_fails_its_parent_instead_of_the_batch,
    retries_wait_in_schedule_then_pass_when_due_by_the_database_clock,
    snoozes_and_hand_backs_give_the_attempt_back,
    an_expired_lease_on_the_last_attempt_fails_the_job,
    a_lease_its_host_never_confirmed_gives_its_attempt_back,
    renewal_extends_only_the_hosts_own_current_leases,
    operators_retry_cancel_list_and_prune,
    delayed_jobs_wait_until_due,
);

// PostgreSQL only: SQLite has no row locks; its writers take the file's lock
// one at a time, and a renewal waiting for it is abandoned at its deadline.
#[tokio::test]
async fn a_renewal_passes_over_a_locked_row_without_waiting_or_losing_it() {
    let db = with_types(TestDb::postgres().await, &["mail"]).await;
    let jobs = two_running(&db, "mail").await;
    let runs: Vec<RunId> = jobs.iter().map(|j| RunId { job_id: j.id, lease_token: j.lease_token }).collect();
    let mut locker = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.jobs WHERE id = $1 FOR UPDATE")
        .bind(jobs[0].id)
        .execute(&mut *locker)
        .await
        .unwrap();
    let renewal = tokio::time::timeout(Duration::from_secs(5), common::renew(&db, "h", &runs, &[]))
        .await
        .expect("a renewal never waits on a row lock");
    assert_eq!(
        renewal,
        LeaseRenewal { renewed: vec![runs[1]], lost: vec![], cancelled: vec![], strays: vec![] },
        "the locked run is neither renewed nor lost"
    );
    locker.rollback().await.unwrap();
    assert_eq!(common::renew(&db, "h", &runs, &[]).await.renewed.len(), 2);
}

/// A statement that hangs (here: the running job's row locked by another
/// transaction, so the stopped run's result write waits) cannot keep a guest
/// running past its lease: the host's own clock stops it first, and the run
/// is handed back without spending its attempt once the write goes through.
#[tokio::test]
async fn a_host_whose_statements_hang_stops_its_guest_before_the_lease_expires() {
    let db = TestDb::postgres().await;
    let host = TestHost::start(&db, &["sleep"], |config| config.worker.concurrency = 1).await;
    let client = jobhost::Client::from_store(db.dyn_store());
    let id = client.enqueue("sleep", json!({"ms": 600_000})).await.unwrap();
    let running = format!("SELECT count(*) FROM jobhost.jobs WHERE id = {id} AND state = 'running'");
    eventually(WITHIN, || async { db.scalar(&running).await == 1 }).await;
    let first_token = db.scalar(format!("SELECT lease_token FROM jobhost.jobs WHERE id = {id}")).await;
    let mut locker = db.pool().begin().await.unwrap();
    let me: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *locker).await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.jobs WHERE id = $1 FOR UPDATE").bind(id).execute(&mut *locker).await.unwrap();
    // The guest is stopped at its fence, and its result write then waits
    // for the row: the host's writes, not its fence, are what the lock holds.
    let waiting = format!("SELECT count(*) FROM pg_stat_activity WHERE {me} = ANY(pg_blocking_pids(pid))");
    eventually(WITHIN, || async { db.scalar(&waiting).await > 0 }).await;
    locker.rollback().await.unwrap();
    // Handed back (a new lease, the attempt given back), not expired: no
    // error was recorded and the job runs again on its first attempt.
    let rerun = format!(
        "SELECT count(*) FROM jobhost.jobs WHERE id = {id} AND state = 'running' AND lease_token <> {first_token}"
    );
    eventually(WITHIN, || async { db.scalar(&rerun).await == 1 }).await;
    let (attempt, errors): (i32, i32) =
        sqlx::query_as("SELECT attempt, jsonb_array_length(errors) FROM jobhost.jobs WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!((attempt, errors), (1, 0), "the fenced run gave its attempt back and its lease never expired");
    host.stop().await;
}

/// A result write that waits for a lock holds back no other result: once
/// a write has been out a while, a host sends the next results beside it on
/// another connection. The test holds the row of a running job, which its
/// result write must delete (a wait no key deferral avoids), so that write
/// waits; a job finishing meanwhile is written anyway, and the waiting one
/// is written once the lock is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_write_waiting_for_a_lock_holds_back_no_other_result() {
    let db = TestDb::postgres().await;
    // A long lease: renewals pass over the held row (`SKIP LOCKED`), and the
    // fence must not stop the guest while the test holds it.
    let host = TestHost::start(&db, &["sleep", "hello"], |config| {
        config.worker.default_lease = Duration::from_secs(30);
    })
    .await;
    let held = db.enqueue_new("sleep", json!({"ms": 1000})).await;
    eventually(WITHIN, || async { db.state_of(held).await == JobState::Running }).await;
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.jobs WHERE id = $1 FOR UPDATE").bind(held).execute(&mut *holder).await.unwrap();
    let result_waits = "SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%finish_runs%'";
    eventually(WITHIN, || async { db.scalar(result_waits).await == 1 }).await;

    let other = db.enqueue_new("hello", json!({"name": "meanwhile"})).await;
    eventually(WITHIN, || async { db.state_of(other).await == JobState::Completed }).await;
    assert_eq!(db.state_of(held).await, JobState::Running, "the held job's result still waits for its row");
    holder.commit().await.unwrap();
    eventually(WITHIN, || async { db.state_of(held).await == JobState::Completed }).await;
    host.stop().await;
}

/// A database's error reads as the server's message, not sqlx's
/// " at line N" (a line of PostgreSQL's C source), nor the failing row.
#[tokio::test]
async fn a_database_error_reads_as_the_servers_message() {
    let db = TestDb::postgres().await;
    let error = sqlx::query("SELECT 1 / 0").execute(db.pool()).await.unwrap_err();
    let error = jobhost::store::Error::from(error).to_string();
    assert_eq!(error, "database error: division by zero");
    let error = sqlx::query("INSERT INTO jobhost.job_traces (job_id, traceparent) VALUES (1, 'x')")
        .execute(db.pool())
        .await
        .unwrap_err();
    let error = jobhost::store::Error::from(error).to_string();
    assert!(
        error.starts_with("database error: new row for relation \"job_traces\" violates check constraint"),
        "{error}"
    );
    assert!(!error.contains("Failing row contains"), "no row, which may hold a payload, in the text: {error}");
    assert!(!error.contains(" at line "), "{error}");
}
