//! Batches against real databases: members counted in the transaction that
//! ends them, whichever path ends them; callbacks enqueued exactly once, by
//! the transaction that ends the last member of a closed batch (guarantee
//! 12); live progress written with the heartbeat; and waiting for a job's
//! end (docs/batches.md).

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use jobhost::store::{
    Batch, BatchState, Callbacks, EnqueueParams, Enqueued, Error, FetchedJob, FinishOutcome, FinishResult, JobState,
    NewBatch, RunId, RunProgress,
};
use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, OnConflict, OnDuplicate, UniqueConfig, UniqueStrategy};
use serde_json::json;

use common::db::{Backend, TestDb, on_both_backends};
use common::{completed, fetch_params, finish, job_config};

/// Registers the member type `work` and the callback types `on_done`, `on_ok` and `on_bad`.
async fn register(db: &TestDb) {
    let types: Vec<_> = ["work", "on_done", "on_ok", "on_bad"].iter().map(|n| (job_config(n), "v1".into())).collect();
    db.store.job_types_register(&types).await.unwrap();
}

fn all_callbacks() -> NewBatch {
    NewBatch {
        label: Some("nightly".into()),
        callbacks: Callbacks {
            on_finish: Some("on_done".into()),
            on_success: Some("on_ok".into()),
            on_failure: Some("on_bad".into()),
        },
        callback_payload: Some(json!({"report": "r1"})),
        open: false,
    }
}

fn work(n: usize) -> Vec<EnqueueParams> {
    (0..n).map(|i| EnqueueParams::new("work", json!({ "i": i }))).collect()
}

async fn batch(db: &TestDb, id: i64) -> Batch {
    db.store.batch_get(id).await.unwrap().expect("the batch exists")
}

/// Jobs of type `job`, live or archived: how many callbacks of it were enqueued.
async fn jobs_of(db: &TestDb, job: &str) -> i64 {
    db.scalar(format!(
        "SELECT (SELECT count(*) FROM jobhost.jobs WHERE job = '{job}')
              + (SELECT count(*) FROM jobhost.archive WHERE job = '{job}')"
    ))
    .await
}

/// A batch's ending counts, as the archive has its members.
async fn archived_counts(db: &TestDb, id: i64) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> =
        db.rows(format!("SELECT state, count(*) FROM jobhost.archive WHERE batch_id = {id} GROUP BY state")).await;
    rows.into_iter().collect()
}

fn counts_of(batch: &Batch) -> BTreeMap<String, i64> {
    let c = &batch.counts;
    [("completed", c.completed), ("failed", c.failed), ("discarded", c.discarded), ("cancelled", c.cancelled)]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(s, n)| (s.to_string(), n))
        .collect()
}

/// The payload of the one callback job of type `job`.
async fn callback_payload(db: &TestDb, job: &str) -> serde_json::Value {
    let payloads = db
        .texts(format!("SELECT {} FROM jobhost.jobs WHERE job = '{job}'", db.dialect("payload::text", "payload")))
        .await;
    assert_eq!(payloads.len(), 1, "one {job} callback: {payloads:?}");
    serde_json::from_str(&payloads[0]).unwrap()
}

async fn a_batch_counts_each_ending_and_fires_its_callbacks_once(db: TestDb) {
    register(&db).await;
    let (id, enqueued) = db.store.batch_create(&all_callbacks(), &work(10)).await.unwrap();
    assert_eq!(enqueued.len(), 10);
    let created = batch(&db, id).await;
    assert_eq!((created.state, created.counts.total, created.counts.pending), (BatchState::Closed, 10, 10));
    let runs = db.fetch("work", 10).await;
    assert_eq!(batch(&db, id).await.counts.running, 10);
    assert!(runs.iter().all(|r| r.batch_id == Some(id)), "a member knows its batch");
    // 6 complete, 2 fail, 1 retries (and later completes: a success), 1 is cancelled by an operator.
    let mut results: Vec<_> = runs[..6].iter().map(|r| finish(r, completed())).collect();
    results.extend(runs[6..8].iter().map(|r| finish(r, FinishOutcome::Failed { error: "no".into() })));
    results.push(finish(&runs[8], FinishOutcome::Retry { error: "later".into(), delay_ms: 0 }));
    results.push(finish(&runs[9], FinishOutcome::Cancelled { reason: "stop".into() }));
    db.store.job_finish(results.clone()).await.unwrap();
    // A duplicate delivery of the same results changes nothing (guarantee 5).
    let again = db.store.job_finish(results).await.unwrap();
    assert!(again.iter().all(|r| *r == FinishResult::Duplicate), "{again:?}");
    let midway = batch(&db, id).await;
    assert_eq!(counts_of(&midway), archived_counts(&db, id).await, "counts equal the archive");
    assert_eq!((midway.counts.pending, midway.counts.running, midway.counts.completed), (1, 0, 6));
    assert_eq!(midway.state, BatchState::Closed);
    assert_eq!(jobs_of(&db, "on_done").await, 0, "nothing fires while a member is left");

    let retried = db.fetch("work", 1).await.remove(0);
    assert_eq!(retried.attempt, 2);
    db.store.job_finish(vec![finish(&retried, completed())]).await.unwrap();
    let done = batch(&db, id).await;
    assert_eq!(done.state, BatchState::Failed);
    assert_eq!(counts_of(&done), archived_counts(&db, id).await);
    assert_eq!((done.counts.completed, done.counts.failed, done.counts.cancelled), (7, 2, 1));
    assert_eq!(done.progress, 1.0);
    assert!(done.finished_at.is_some());
    assert_eq!((jobs_of(&db, "on_done").await, jobs_of(&db, "on_bad").await, jobs_of(&db, "on_ok").await), (1, 1, 0));
    assert_eq!(done.callback_jobs.len(), 2, "{:?}", done.callback_jobs);
    let payload = callback_payload(&db, "on_done").await;
    assert_eq!(payload["report"], "r1", "the creator's payload");
    assert_eq!(
        payload["_batch"],
        json!({"id": id, "label": "nightly", "succeeded": false, "total": 10,
        "completed": 7, "failed": 2, "discarded": 0, "cancelled": 1})
    );
    // A finished batch is a record: its failed member, run again, leaves it
    // and runs alone, and nothing fires twice.
    let failed = db
        .texts(format!(
            "SELECT {} FROM jobhost.archive WHERE batch_id = {id} AND state = 'failed'",
            db.dialect("id::text", "CAST(id AS TEXT)")
        ))
        .await;
    db.store.job_retry(failed[0].parse().unwrap()).await.unwrap();
    let rerun = db.fetch("work", 1).await.remove(0);
    assert_eq!(rerun.batch_id, None, "it left the finished batch");
    db.store.job_finish(vec![finish(&rerun, completed())]).await.unwrap();
    let after = batch(&db, id).await;
    assert_eq!((after.state, after.counts.failed, after.counts.completed), (BatchState::Failed, 2, 7));
    assert_eq!((jobs_of(&db, "on_done").await, jobs_of(&db, "on_ok").await), (1, 0), "callbacks fire once per batch");
}

async fn a_retried_member_of_an_unfinished_batch_is_pending_again(db: TestDb) {
    register(&db).await;
    let (id, _) = db.store.batch_create(&all_callbacks(), &work(2)).await.unwrap();
    let runs = db.fetch("work", 2).await;
    db.store.job_finish(vec![finish(&runs[0], FinishOutcome::Failed { error: "no".into() })]).await.unwrap();
    assert_eq!(batch(&db, id).await.counts.failed, 1);
    db.store.job_retry(runs[0].id).await.unwrap();
    let again = batch(&db, id).await;
    assert_eq!((again.counts.failed, again.counts.pending, again.counts.running), (0, 1, 1), "its failure uncounted");
    let retried = db.fetch("work", 1).await.remove(0);
    assert_eq!(retried.batch_id, Some(id));
    db.store.job_finish(vec![finish(&retried, completed()), finish(&runs[1], completed())]).await.unwrap();
    assert_eq!(batch(&db, id).await.state, BatchState::Succeeded, "a member that succeeds on a retry is a success");
    assert_eq!((jobs_of(&db, "on_ok").await, jobs_of(&db, "on_bad").await), (1, 0));
}

async fn a_batch_whose_members_all_succeed_fires_on_success_and_a_one_job_batch_fires_too(db: TestDb) {
    register(&db).await;
    let (id, _) = db.store.batch_create(&all_callbacks(), &work(1)).await.unwrap();
    let run = db.fetch("work", 1).await.remove(0);
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    assert_eq!(batch(&db, id).await.state, BatchState::Succeeded);
    assert_eq!((jobs_of(&db, "on_done").await, jobs_of(&db, "on_ok").await, jobs_of(&db, "on_bad").await), (1, 1, 0));
    assert_eq!(callback_payload(&db, "on_ok").await["_batch"]["succeeded"], true);
}

async fn an_open_batch_fires_only_once_closed(db: TestDb) {
    register(&db).await;
    let open = NewBatch { open: true, ..all_callbacks() };
    let (id, _) = db.store.batch_create(&open, &work(2)).await.unwrap();
    for run in db.fetch("work", 2).await {
        db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    }
    assert_eq!(batch(&db, id).await.state, BatchState::Open);
    assert_eq!(jobs_of(&db, "on_done").await, 0, "an open batch does not finish though every member has ended");
    // It takes more members, through any enqueue.
    let more = EnqueueParams { batch_id: Some(id), ..EnqueueParams::new("work", json!({"late": true})) };
    db.store.job_enqueue(&[more]).await.unwrap();
    assert_eq!(batch(&db, id).await.counts.total, 3);
    let run = db.fetch("work", 1).await.remove(0);
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    assert_eq!(jobs_of(&db, "on_done").await, 0);
    assert!(db.store.batch_close(id).await.unwrap());
    let closed = batch(&db, id).await;
    assert_eq!(closed.state, BatchState::Succeeded, "closing a batch whose members ended finishes it at once");
    assert_eq!((jobs_of(&db, "on_done").await, jobs_of(&db, "on_ok").await), (1, 1));
    assert!(!db.store.batch_close(id).await.unwrap(), "closed already");
    // A closed batch takes no more members, and a missing one none at all.
    let late = EnqueueParams { batch_id: Some(id), ..EnqueueParams::new("work", json!({})) };
    let refused = db.store.job_enqueue(&[late]).await.unwrap_err();
    assert!(refused.to_string().contains(&format!("batch {id} is closed")), "{refused}");
    let missing = EnqueueParams { batch_id: Some(id + 100), ..EnqueueParams::new("work", json!({})) };
    let refused = db.store.job_enqueue(&[missing]).await.unwrap_err();
    assert!(refused.to_string().contains("does not exist"), "{refused}");
    assert!(db.store.batch_close(id + 100).await.is_err());
    // An empty batch closed at creation has nothing to wait for.
    let (empty, _) = db.store.batch_create(&NewBatch::default(), &[]).await.unwrap();
    assert_eq!(batch(&db, empty).await.state, BatchState::Succeeded);
}

/// Registers `lim`: one run at a time per `k`, meeting a full key with `on_conflict`.
async fn limited(db: &TestDb, on_conflict: OnConflict) {
    let mut config = job_config("lim");
    config.concurrency =
        Some(ConcurrencyConfig { limit: 1, key: KeyTemplate::parse("{k}").unwrap(), duration_secs: 30, on_conflict });
    db.store.job_types_register(&[(config, "v1".into())]).await.unwrap();
}

async fn blocked_members_count_as_pending_and_are_never_lost(db: TestDb) {
    register(&db).await;
    limited(&db, OnConflict::Block).await;
    let members: Vec<_> = (0..5).map(|i| EnqueueParams::new("lim", json!({"k": "one", "i": i}))).collect();
    let (id, _) = db.store.batch_create(&all_callbacks(), &members).await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 4);
    assert_eq!(batch(&db, id).await.counts.pending, 5, "a blocked member is pending");
    for _ in 0..5 {
        let run = db.fetch("lim", 5).await;
        assert_eq!(run.len(), 1, "one slot, one run");
        db.store.job_finish(vec![finish(&run[0], completed())]).await.unwrap();
    }
    let done = batch(&db, id).await;
    assert_eq!((done.state, done.counts.completed), (BatchState::Succeeded, 5));
    assert_eq!(jobs_of(&db, "on_done").await, 1);
}

async fn members_discarded_by_the_gate_are_counted_even_in_the_creating_transaction(db: TestDb) {
    register(&db).await;
    limited(&db, OnConflict::Discard).await;
    let members: Vec<_> = (0..3).map(|i| EnqueueParams::new("lim", json!({"k": "one", "i": i}))).collect();
    let (id, _) = db.store.batch_create(&all_callbacks(), &members).await.unwrap();
    let created = batch(&db, id).await;
    assert_eq!((created.counts.total, created.counts.discarded, created.counts.pending), (3, 2, 1));
    let run = db.fetch("lim", 1).await.remove(0);
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    assert_eq!(batch(&db, id).await.state, BatchState::Failed, "a discarded member is not a success");
    assert_eq!((jobs_of(&db, "on_bad").await, jobs_of(&db, "on_ok").await), (1, 0));
    // A batch whose every member is discarded at once finishes in the
    // transaction that creates it: here another job holds the key's slot.
    db.store.job_enqueue(&[EnqueueParams::new("lim", json!({"k": "one"}))]).await.unwrap();
    let (all_gone, _) = db.store.batch_create(&all_callbacks(), &members[..2]).await.unwrap();
    let gone = batch(&db, all_gone).await;
    assert_eq!((gone.state, gone.counts.discarded), (BatchState::Failed, 2));
    assert_eq!(jobs_of(&db, "on_bad").await, 2);
}

/// A failed member of a finished batch, retried while another job holds
/// its key's only slot: the gate blocks it (or discards it) after it has
/// left the batch, so the finished batch's record stays as it was, however
/// the retried job ends. Before, PostgreSQL ran the gate first and the
/// blocked job kept its batch, whose counts then read more endings than
/// members. One rule on both backends.
async fn a_retried_member_of_a_finished_batch_leaves_it_whatever_the_gate_does(db: TestDb) {
    for on_conflict in [OnConflict::Block, OnConflict::Discard] {
        let db = if on_conflict == OnConflict::Block { &db } else { &TestDb::new(db.backend).await };
        register(db).await;
        limited(db, on_conflict).await;
        let (id, _) =
            db.store.batch_create(&all_callbacks(), &[EnqueueParams::new("lim", json!({"k": "one"}))]).await.unwrap();
        let run = db.fetch("lim", 1).await.remove(0);
        db.store.job_finish(vec![finish(&run, FinishOutcome::Failed { error: "no".into() })]).await.unwrap();
        let finished = batch(db, id).await;
        assert_eq!(
            (finished.state, counts_of(&finished)),
            (BatchState::Failed, BTreeMap::from([("failed".into(), 1)]))
        );
        // Another job takes the key's only slot; the failed member is retried.
        let holder = db.store.job_enqueue(&[EnqueueParams::new("lim", json!({"k": "one"}))]).await.unwrap()[0];
        db.store.job_retry(run.id).await.unwrap();
        let retried = db.store.job_get(run.id).await.unwrap().unwrap();
        let expected = if on_conflict == OnConflict::Block { JobState::Blocked } else { JobState::Discarded };
        assert_eq!((retried.row.state, retried.batch_id), (expected, None), "{on_conflict:?}: it left the batch");
        assert_eq!(counts_of(&batch(db, id).await), counts_of(&finished), "{on_conflict:?}: the record is unchanged");
        // The holder ends; a blocked retry is promoted and runs to completion.
        let held = db.fetch("lim", 1).await.remove(0);
        assert_eq!(held.id, holder);
        db.store.job_finish(vec![finish(&held, completed())]).await.unwrap();
        if on_conflict == OnConflict::Block {
            let rerun = db.fetch("lim", 1).await.remove(0);
            assert_eq!((rerun.id, rerun.batch_id), (run.id, None));
            db.store.job_finish(vec![finish(&rerun, completed())]).await.unwrap();
        }
        let after = batch(db, id).await;
        assert_eq!((after.state, counts_of(&after)), (finished.state, counts_of(&finished)), "{on_conflict:?}");
        assert_eq!(after.counts.total, 1);
        assert_eq!(jobs_of(db, "on_bad").await, 1, "{on_conflict:?}: its callbacks fired once");
    }
}

async fn a_duplicate_of_a_unique_job_is_not_a_member(db: TestDb) {
    register(&db).await;
    let mut config = job_config("once");
    config.unique = Some(UniqueConfig {
        key: KeyTemplate::parse("{k}").unwrap(),
        strategy: UniqueStrategy::UntilExecuted,
        on_duplicate: OnDuplicate::Skip,
    });
    db.store.job_types_register(&[(config, "v1".into())]).await.unwrap();
    let holder = db.store.job_enqueue(&[EnqueueParams::new("once", json!({"k": "a"}))]).await.unwrap()[0];
    let members = vec![EnqueueParams::new("once", json!({"k": "a"})), EnqueueParams::new("once", json!({"k": "b"}))];
    let (id, enqueued) = db.store.batch_create(&all_callbacks(), &members).await.unwrap();
    assert_eq!(enqueued[0], Enqueued::Duplicate(holder));
    assert_eq!(batch(&db, id).await.counts.total, 1, "only the stored job is a member");
    let runs = db.fetch("once", 2).await;
    let member = runs.iter().find(|r| r.batch_id == Some(id)).expect("the member runs");
    db.store.job_finish(vec![finish(member, completed())]).await.unwrap();
    assert_eq!(batch(&db, id).await.state, BatchState::Succeeded);
}

async fn a_callback_that_cannot_be_enqueued_is_recorded_and_the_last_member_still_ends(db: TestDb) {
    register(&db).await;
    let (id, _) = db.store.batch_create(&all_callbacks(), &work(1)).await.unwrap();
    // The callback type changes after the batch was created: its key now
    // needs a field the callback payload lacks.
    let mut changed = job_config("on_ok");
    changed.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{tenant}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    db.store.job_types_register(&[(changed, "v2".into())]).await.unwrap();
    let run = db.fetch("work", 1).await.remove(0);
    assert_eq!(db.store.job_finish(vec![finish(&run, completed())]).await.unwrap(), vec![FinishResult::Done]);
    let done = batch(&db, id).await;
    assert_eq!(done.state, BatchState::Succeeded);
    assert!(done.callback_errors.get("on_success").is_some_and(|e| e.contains("tenant")), "{:?}", done.callback_errors);
    assert_eq!((jobs_of(&db, "on_done").await, jobs_of(&db, "on_ok").await), (1, 0), "the others still fire");
    assert_eq!(db.store.job_get(run.id).await.unwrap().unwrap().row.state, JobState::Completed);
}

async fn a_callback_type_whose_stored_configuration_is_unreadable_stalls_nothing(db: TestDb) {
    register(&db).await;
    let (id, _) = db.store.batch_create(&all_callbacks(), &work(1)).await.unwrap();
    db.execute("UPDATE jobhost.job_types SET config = '{\"unreadable\": true}' WHERE name = 'on_ok'").await;
    let run = db.fetch("work", 1).await.remove(0);
    assert_eq!(db.store.job_finish(vec![finish(&run, completed())]).await.unwrap(), vec![FinishResult::Done]);
    let done = batch(&db, id).await;
    assert!(done.callback_errors.contains_key("on_success"), "{:?}", done.callback_errors);
    assert_eq!(jobs_of(&db, "on_done").await, 1, "the readable callback fired");
    // Every later write goes on (guarantee 13).
    db.store.job_enqueue(&work(1)).await.unwrap();
    let next = db.fetch("work", 1).await.remove(0);
    assert_eq!(db.store.job_finish(vec![finish(&next, completed())]).await.unwrap(), vec![FinishResult::Done]);
}

async fn a_new_batch_refuses_what_could_never_be_enqueued(db: TestDb) {
    register(&db).await;
    let unknown = NewBatch {
        callbacks: Callbacks { on_finish: Some("ghost".into()), ..Default::default() },
        ..Default::default()
    };
    let error = db.store.batch_create(&unknown, &work(1)).await.unwrap_err();
    assert!(error.to_string().contains("ghost"), "{error}");
    let not_object = NewBatch { callback_payload: Some(json!([1])), ..all_callbacks() };
    assert!(db.store.batch_create(&not_object, &work(1)).await.is_err());
    let bad_member = vec![EnqueueParams::new("work", json!({})), EnqueueParams::new("work", json!("text"))];
    assert!(matches!(db.store.batch_create(&all_callbacks(), &bad_member).await, Err(Error::PayloadNotObject { .. })));
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.batches").await, 0, "nothing was stored");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0);
}

/// Completes each run in a task of its own, all at once.
fn finish_each_at_once(db: &TestDb, runs: Vec<FetchedJob>) -> Vec<tokio::task::JoinHandle<Vec<FinishResult>>> {
    runs.into_iter()
        .map(|run| {
            let store = db.dyn_store();
            tokio::spawn(async move { store.job_finish(vec![finish(&run, completed())]).await.unwrap() })
        })
        .collect()
}

async fn two_last_members_ending_at_once_fire_one_callback(db: TestDb) {
    register(&db).await;
    for _ in 0..10 {
        let (id, _) = db.store.batch_create(&all_callbacks(), &work(2)).await.unwrap();
        let finishers = finish_each_at_once(&db, db.fetch("work", 2).await);
        for finisher in finishers {
            assert_eq!(finisher.await.unwrap(), vec![FinishResult::Done]);
        }
        assert_eq!(batch(&db, id).await.callback_jobs.len(), 2);
    }
    assert_eq!((jobs_of(&db, "on_done").await, jobs_of(&db, "on_ok").await), (10, 10), "one of each per batch");
}

async fn progress_shows_while_a_job_runs_and_sums_into_its_batch(db: TestDb) {
    register(&db).await;
    let (id, _) = db.store.batch_create(&all_callbacks(), &work(4)).await.unwrap();
    let runs = db.fetch("work", 4).await;
    let ids: Vec<RunId> = runs.iter().map(|r| RunId { job_id: r.id, lease_token: r.lease_token }).collect();
    let progress = [RunProgress { run: ids[0], done: 1, total: 4 }, RunProgress { run: ids[1], done: 3, total: 4 }];
    let renewal = common::renew(&db, "h", &ids, &progress).await;
    assert_eq!(renewal.renewed.len(), 4);
    let job = db.store.job_get(runs[0].id).await.unwrap().unwrap();
    assert_eq!(job.progress, Some(json!({"done": 1, "total": 4})), "visible while it runs");
    assert_eq!(job.batch_id, Some(id));
    assert!((batch(&db, id).await.progress - 0.25).abs() < 1e-9, "a quarter and three quarters of four jobs");
    // A stale run's report is not written.
    let stale = RunProgress { run: RunId { lease_token: ids[2].lease_token + 1000, ..ids[2] }, done: 4, total: 4 };
    common::renew(&db, "h", &ids, &[stale]).await;
    assert_eq!(db.store.job_get(runs[2].id).await.unwrap().unwrap().progress, None);
    db.store.job_finish(vec![finish(&runs[0], completed())]).await.unwrap();
    assert!((batch(&db, id).await.progress - 0.4375).abs() < 1e-9, "an ended member counts whole");
}

async fn waiting_for_a_job_returns_when_it_ends(db: TestDb) {
    register(&db).await;
    let id = db.store.job_enqueue(&work(1)).await.unwrap()[0];
    let store = db.dyn_store();
    let waiter = tokio::spawn(async move { store.job_wait(id, Duration::from_secs(60)).await });
    let run = db.fetch("work", 1).await.remove(0);
    // The waiter has registered (or reads the end at its first look).
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    let ended = waiter.await.unwrap().unwrap().expect("it ended within the wait");
    assert_eq!(ended.row.state, JobState::Completed);
    assert_eq!(ended.output, Some(json!({"ok": true})));
    // An ended job answers at once; a live one runs out the clock; a missing one is an error.
    assert!(db.store.job_wait(id, Duration::ZERO).await.unwrap().is_some());
    let live = db.store.job_enqueue(&work(1)).await.unwrap()[0];
    assert!(db.store.job_wait(live, Duration::from_millis(300)).await.unwrap().is_none());
    assert!(matches!(db.store.job_wait(live + 1000, Duration::from_secs(1)).await, Err(Error::NotFound { .. })));
}

on_both_backends!(
    a_batch_counts_each_ending_and_fires_its_callbacks_once,
    a_retried_member_of_an_unfinished_batch_is_pending_again,
    a_batch_whose_members_all_succeed_fires_on_success_and_a_one_job_batch_fires_too,
    an_open_batch_fires_only_once_closed,
    blocked_members_count_as_pending_and_are_never_lost,
    members_discarded_by_the_gate_are_counted_even_in_the_creating_transaction,
    a_retried_member_of_a_finished_batch_leaves_it_whatever_the_gate_does,
    a_duplicate_of_a_unique_job_is_not_a_member,
    a_callback_that_cannot_be_enqueued_is_recorded_and_the_last_member_still_ends,
    a_new_batch_refuses_what_could_never_be_enqueued,
    a_callback_type_whose_stored_configuration_is_unreadable_stalls_nothing,
    two_last_members_ending_at_once_fire_one_callback,
    progress_shows_while_a_job_runs_and_sums_into_its_batch,
    waiting_for_a_job_returns_when_it_ends,
    a_running_job_opens_a_batch_whose_callback_fires_once_its_members_end,
    a_member_adding_to_its_own_closed_batch_holds_it_open_until_the_new_members_end,
    a_run_that_fails_leaves_no_batch_and_an_unknown_callback_fails_the_run,
    a_guests_progress_shows_while_it_runs,
);

/// Two transactions ending a batch's last two members are held at the
/// batch row's lock until both are queued behind it, then let go together:
/// exactly one of them finds the batch complete. A count read from each
/// transaction's own snapshot would have both see one member left, and
/// fire nothing (or, counted the other way, fire twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_two_members_released_together_fire_one_callback() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let (id, _) = db.store.batch_create(&all_callbacks(), &work(2)).await.unwrap();
    let runs = db.fetch("work", 2).await;
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.batches WHERE id = $1 FOR UPDATE").bind(id).execute(&mut *holder).await.unwrap();
    let finishers = finish_each_at_once(&db, runs);
    common::eventually(Duration::from_secs(30), || async {
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .await
            == 2
    })
    .await;
    holder.commit().await.unwrap();
    for finisher in finishers {
        assert_eq!(finisher.await.unwrap(), vec![FinishResult::Done]);
    }
    assert_eq!(batch(&db, id).await.state, BatchState::Succeeded);
    assert_eq!((jobs_of(&db, "on_done").await, jobs_of(&db, "on_ok").await), (1, 1));
}

/// From SQL: open a batch, enqueue into it and close it in one
/// transaction; its callback fires when the last member ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_made_from_sql_fires_like_any_other() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let mut tx = db.pool().begin().await.unwrap();
    let id: i64 = sqlx::query_scalar("SELECT jobhost.batch_open(label => 'sql', on_finish => 'on_done')")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    for i in 0..3 {
        sqlx::query("SELECT jobhost.enqueue('work', jsonb_build_object('i', $1::int), batch_id => $2)")
            .bind(i)
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    sqlx::query("SELECT jobhost.batch_close($1)").bind(id).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(batch(&db, id).await.counts.total, 3);
    let closed = sqlx::query("SELECT jobhost.enqueue('work', '{}', batch_id => $1)").bind(id).execute(db.pool()).await;
    assert!(closed.unwrap_err().to_string().contains("is closed"));
    for run in db.fetch("work", 3).await {
        db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    }
    assert_eq!(jobs_of(&db, "on_done").await, 1);
    assert_eq!(callback_payload(&db, "on_done").await["_batch"]["label"], "sql");
}

const WITHIN: Duration = Duration::from_secs(60);

/// A host serving `batcher` and `hello`, with a heartbeat every 200 ms.
async fn batch_host(db: &TestDb) -> common::TestHost {
    common::TestHost::start(db, &["batcher", "hello"], |_| {}).await
}

/// Enqueues one job and waits for it to end.
async fn run_to_end(db: &TestDb, job: &str, payload: serde_json::Value) -> jobhost::store::JobDetail {
    let id = db.store.job_enqueue(&[EnqueueParams::new(job, payload)]).await.unwrap()[0];
    db.store.job_wait(id, WITHIN).await.unwrap().expect("the job ended in time")
}

async fn the_only_batch(db: &TestDb) -> Batch {
    let batches = db.store.batch_list(10).await.unwrap();
    assert_eq!(batches.len(), 1, "{batches:?}");
    batches.into_iter().next().unwrap()
}

async fn a_running_job_opens_a_batch_whose_callback_fires_once_its_members_end(db: TestDb) {
    let host = batch_host(&db).await;
    let open = json!({"open": {"count": 3, "job": "hello", "child": {"name": "member"}, "on_finish": "hello",
        "label": "opened by a job", "callback_payload": {"name": "callback"}}});
    let parent = run_to_end(&db, "batcher", open).await;
    assert_eq!(parent.row.state, JobState::Completed, "{:?}", parent.row.error);
    assert_eq!(parent.output.as_ref().unwrap()["opened"], 0);
    let opened = the_only_batch(&db).await;
    assert_eq!((opened.label.as_deref(), opened.counts.total), (Some("opened by a job"), 3));
    let id = opened.id;
    common::eventually(WITHIN, || async { batch(&db, id).await.callback_jobs.contains_key("on_finish") }).await;
    let callback = batch(&db, id).await.callback_jobs["on_finish"];
    let ended = db.store.job_wait(callback, WITHIN).await.unwrap().unwrap();
    assert_eq!(ended.output.as_ref().unwrap()["greeting"], "hello, callback");
    assert_eq!(ended.payload["_batch"]["completed"], 3);
    host.stop().await;
    assert_eq!(jobs_of(&db, "hello").await, 4, "three members and one callback");
}

async fn a_member_adding_to_its_own_closed_batch_holds_it_open_until_the_new_members_end(db: TestDb) {
    let host = batch_host(&db).await;
    let created = NewBatch {
        callbacks: Callbacks { on_finish: Some("hello".into()), ..Default::default() },
        ..Default::default()
    };
    let extend = EnqueueParams::new("batcher", json!({"extend": {"count": 2, "job": "hello"}}));
    let (id, _) = db.store.batch_create(&created, &[extend]).await.unwrap();
    assert_eq!(batch(&db, id).await.state, BatchState::Closed);
    common::eventually(WITHIN, || async { batch(&db, id).await.finished_at.is_some() }).await;
    let done = batch(&db, id).await;
    assert_eq!((done.counts.total, done.counts.completed), (3, 3), "the member's children joined the closed batch");
    // Had the batch finished with its first member, its callback would say one job.
    let callback = db.store.job_get(done.callback_jobs["on_finish"]).await.unwrap().unwrap();
    assert_eq!(callback.payload["_batch"]["total"], 3);
    host.stop().await;
    assert_eq!(jobs_of(&db, "hello").await, 3, "two members and one callback, fired once");
}

async fn a_run_that_fails_leaves_no_batch_and_an_unknown_callback_fails_the_run(db: TestDb) {
    let host = batch_host(&db).await;
    let failing = json!({"open": {"count": 2, "on_finish": "hello"}, "fail": true});
    assert_eq!(run_to_end(&db, "batcher", failing).await.row.state, JobState::Failed);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.batches").await, 0, "no batch from a failed run");
    assert_eq!(jobs_of(&db, "hello").await, 0, "and no member");
    let unknown = run_to_end(&db, "batcher", json!({"open": {"count": 1, "on_finish": "nope"}})).await;
    assert_eq!(unknown.row.state, JobState::Failed);
    let error = unknown.row.error.unwrap_or_default();
    assert!(error.contains("could not open a batch") && error.contains("nope"), "{error}");
    let outside = run_to_end(&db, "batcher", json!({"extend": {"count": 1}})).await;
    assert!(outside.row.error.unwrap_or_default().contains("in no batch"), "a job outside any batch cannot extend one");
    host.stop().await;
}

async fn a_guests_progress_shows_while_it_runs(db: TestDb) {
    let host = batch_host(&db).await;
    let id =
        db.store.job_enqueue(&[EnqueueParams::new("batcher", json!({"steps": 5, "step_ms": 400}))]).await.unwrap()[0];
    common::eventually(WITHIN, || async {
        let job = db.store.job_get(id).await.unwrap().unwrap();
        assert_ne!(job.row.state, JobState::Completed, "the run ended before its progress was seen");
        job.row.state == JobState::Running && job.progress.is_some_and(|p| p["done"].as_u64() < Some(5))
    })
    .await;
    let ended = db.store.job_wait(id, WITHIN).await.unwrap().unwrap();
    assert_eq!(ended.progress, Some(json!({"done": 5, "total": 5})));
    host.stop().await;
}

/// The archive announces the end of a job someone waits for, and only of
/// such a job: a waiter is woken by the end itself, and the hot path sends
/// no notification for jobs nobody waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_waited_for_job_is_announced_and_no_other() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let ids = db.store.job_enqueue(&work(2)).await.unwrap();
    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool()).await.unwrap();
    listener.listen("jobhost_finished").await.unwrap();
    sqlx::query("INSERT INTO jobhost.job_waits (job_id) VALUES ($1)").bind(ids[1]).execute(db.pool()).await.unwrap();
    let runs = db.fetch("work", 2).await;
    let (unwaited, waited) = if runs[0].id == ids[0] { (&runs[0], &runs[1]) } else { (&runs[1], &runs[0]) };
    db.store.job_finish(vec![finish(unwaited, completed())]).await.unwrap();
    db.store.job_finish(vec![finish(waited, completed())]).await.unwrap();
    let heard = tokio::time::timeout(WITHIN, listener.recv()).await.expect("announced").unwrap();
    assert_eq!(heard.payload(), ids[1].to_string(), "the first announcement is the waited-for job's");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.job_waits").await, 0, "its wait is done with");
}

/// An application's open transaction adding to a batch from SQL holds the
/// batch's row: a host's results pass over that batch's members (written
/// once the lock goes) and write the rest of the plan at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_on_a_batch_holds_back_only_its_members_results() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let (id, _) = db.store.batch_create(&NewBatch { open: true, ..all_callbacks() }, &work(1)).await.unwrap();
    db.store.job_enqueue(&work(2)).await.unwrap();
    let runs = db.fetch("work", 3).await;
    let mut application = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.enqueue('work', '{}', batch_id => $1)")
        .bind(id)
        .execute(&mut *application)
        .await
        .unwrap();
    let results = runs.iter().map(|r| finish(r, completed())).collect();
    let next = fetch_params("h", &["work"], 0);
    let (written, _) = tokio::time::timeout(WITHIN, db.store.job_finish_and_fetch(results, &next))
        .await
        .expect("the plan did not wait for the batch's lock")
        .unwrap();
    let expected: Vec<_> =
        runs.iter().map(|r| if r.batch_id == Some(id) { FinishResult::Deferred } else { FinishResult::Done }).collect();
    assert_eq!(written, expected, "only the member's result waits");
    application.commit().await.unwrap();
    let member = runs.iter().find(|r| r.batch_id == Some(id)).unwrap();
    assert_eq!(db.store.job_finish(vec![finish(member, completed())]).await.unwrap(), vec![FinishResult::Done]);
    assert_eq!(batch(&db, id).await.counts.completed, 1);
    assert_eq!(batch(&db, id).await.counts.total, 2);
}
