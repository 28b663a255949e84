//! Uniqueness against real databases: claims taken in the enqueue's
//! transaction, held through every waiting state, released only by the
//! transaction that ends the job or, for `while_executing`, the run bound
//! to the claim (docs/uniqueness.md).

use crate::common;

use std::time::Duration;

use jobhost::store::{EnqueueParams, Enqueued, Error, FinishOutcome, FinishResult, JobState};
use jobhost::template::KeyTemplate;
use jobhost::types::{ChildJob, ConcurrencyConfig, OnConflict, OnDuplicate, UniqueConfig, UniqueStrategy};
use serde_json::json;

use common::db::{Backend, TestDb, on_both_backends};
use common::fleet::{self, Host};
use common::{completed, eventually, finish, job_config};

const WITHIN: Duration = Duration::from_secs(60);

/// Registers `name`, unique on its payload's `key`.
async fn unique_type(db: &TestDb, name: &str, strategy: UniqueStrategy, on_duplicate: OnDuplicate) {
    let mut config = job_config(name);
    config.unique = Some(UniqueConfig { key: KeyTemplate::parse("{key}").unwrap(), strategy, on_duplicate });
    db.store.job_types_register(&[(config, "v1".to_string())]).await.unwrap();
}

/// Registers `both`: unique on its payload's `unique` field (by
/// `on_duplicate`), limited to one run per its `c` field (by `on_conflict`).
async fn unique_and_limited(db: &TestDb, unique: &str, on_duplicate: OnDuplicate, on_conflict: OnConflict) {
    let mut config = job_config("both");
    config.unique = Some(UniqueConfig {
        key: KeyTemplate::parse(unique).unwrap(),
        strategy: UniqueStrategy::UntilExecuted,
        on_duplicate,
    });
    config.concurrency =
        Some(ConcurrencyConfig { limit: 1, key: KeyTemplate::parse("{c}").unwrap(), duration_secs: 30, on_conflict });
    db.store.job_types_register(&[(config, "v1".to_string())]).await.unwrap();
}

fn keyed(job: &str, key: &str) -> EnqueueParams {
    EnqueueParams::new(job, json!({ "key": key }))
}

async fn live_jobs(db: &TestDb, job: &str) -> i64 {
    db.scalar(format!(
        "SELECT (SELECT count(*) FROM jobhost.jobs WHERE job = '{job}')
              + (SELECT count(*) FROM jobhost.blocked_jobs WHERE job = '{job}')"
    ))
    .await
}

async fn claims(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM jobhost.unique_claims").await
}

async fn eight_concurrent_enqueuers_of_one_key_store_one_job(db: TestDb) {
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    let enqueuers: Vec<_> = (0..8)
        .map(|_| {
            let store = db.dyn_store();
            tokio::spawn(async move { store.job_enqueue_outcomes(&[keyed("once", "k")]).await.unwrap().remove(0) })
        })
        .collect();
    let mut outcomes = Vec::new();
    for enqueuer in enqueuers {
        outcomes.push(enqueuer.await.unwrap());
    }
    let new: Vec<i64> =
        outcomes.iter().filter_map(|o| if let Enqueued::New(id) = o { Some(*id) } else { None }).collect();
    assert_eq!(new.len(), 1, "exactly one enqueue stored a job: {outcomes:?}");
    assert!(
        outcomes.iter().all(|o| *o == Enqueued::New(new[0]) || *o == Enqueued::Duplicate(new[0])),
        "every other enqueue answered with the stored job's id: {outcomes:?}"
    );
    assert_eq!(live_jobs(&db, "once").await, 1);
    // A different key, and a batch repeating one key, in one call.
    let batch = db.store.job_enqueue_outcomes(&[keyed("once", "a"), keyed("once", "a"), keyed("once", "k")]).await;
    let batch = batch.unwrap();
    assert!(matches!(batch[0], Enqueued::New(_)));
    assert_eq!(
        batch[1],
        Enqueued::Duplicate(batch[0].id()),
        "the batch's second of one key is a duplicate of its first"
    );
    assert_eq!(batch[2], Enqueued::Duplicate(new[0]));
    assert_eq!(live_jobs(&db, "once").await, 2);
}

async fn a_job_in_retry_backoff_still_blocks_its_duplicate_until_it_ends(db: TestDb) {
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    let first = db.enqueue_outcome(keyed("once", "k")).await.id();
    let run = db.fetch("once", 1).await.remove(0);
    assert_eq!(db.enqueue_outcome(keyed("once", "k")).await, Enqueued::Duplicate(first), "a running job holds its key");
    let retry = FinishOutcome::Retry { error: "try later".into(), delay_ms: 3_600_000 };
    assert_eq!(db.store.job_finish(vec![finish(&run, retry)]).await.unwrap(), vec![FinishResult::Done]);
    assert_eq!(db.state_of(first).await, JobState::Scheduled);
    assert_eq!(
        db.enqueue_outcome(keyed("once", "k")).await,
        Enqueued::Duplicate(first),
        "so does one waiting to retry"
    );
    db.store.job_retry(first).await.unwrap();
    let run = db.fetch("once", 1).await.remove(0);
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    assert_eq!(claims(&db).await, 0, "the transaction that completed the job gave its key back");
    let second = db.enqueue_outcome(keyed("once", "k")).await;
    assert!(matches!(second, Enqueued::New(id) if id != first), "a completed job's key is free: {second:?}");
    // A cancelled job gives its key back too.
    db.store.job_cancel(second.id()).await.unwrap();
    assert!(matches!(db.enqueue_outcome(keyed("once", "k")).await, Enqueued::New(_)));
}

async fn uniqueness_is_checked_before_the_gate_and_survives_blocking(db: TestDb) {
    // Unique per `id`, limited to one run per `c`.
    unique_and_limited(&db, "{id}", OnDuplicate::Skip, OnConflict::Block).await;
    let holder = db.enqueue_outcome(EnqueueParams::new("both", json!({"id": 1, "c": "k"}))).await.id();
    let blocked = db.enqueue_outcome(EnqueueParams::new("both", json!({"id": 2, "c": "k"}))).await.id();
    assert_eq!(db.state_of(blocked).await, JobState::Blocked);
    let duplicate = db.enqueue_outcome(EnqueueParams::new("both", json!({"id": 2, "c": "k"}))).await;
    assert_eq!(duplicate, Enqueued::Duplicate(blocked), "a blocked job holds its unique key");
    // The holder completes; the blocked job is promoted and still holds its key.
    let run = db.fetch("both", 5).await.remove(0);
    assert_eq!(run.id, holder);
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    assert_eq!(db.state_of(blocked).await, JobState::Available);
    let duplicate = db.enqueue_outcome(EnqueueParams::new("both", json!({"id": 2, "c": "k"}))).await;
    assert_eq!(duplicate, Enqueued::Duplicate(blocked), "a promoted job still holds its unique key");
}

async fn raise_refuses_a_duplicate_and_stores_nothing(db: TestDb) {
    unique_type(&db, "strict", UniqueStrategy::UntilExecuted, OnDuplicate::Raise).await;
    let first = db.enqueue_outcome(keyed("strict", "k")).await.id();
    let refused = db.store.job_enqueue(&[keyed("strict", "other"), keyed("strict", "k")]).await.unwrap_err();
    assert!(matches!(&refused, Error::Duplicate { claimant, .. } if *claimant == first), "{refused}");
    assert!(refused.to_string().contains(&format!("duplicate of job {first}")), "{refused}");
    assert_eq!(live_jobs(&db, "strict").await, 1, "all or none: the batch's other job was not stored either");
}

async fn replace_updates_a_waiting_job_and_never_a_running_one(db: TestDb) {
    unique_type(&db, "latest", UniqueStrategy::UntilExecuted, OnDuplicate::Replace).await;
    let later =
        EnqueueParams { delay_ms: Some(3_600_000), ..EnqueueParams::new("latest", json!({"key": "k", "v": 1})) };
    let first = db.enqueue_outcome(later).await.id();
    assert_eq!(db.state_of(first).await, JobState::Scheduled);
    let now = EnqueueParams::new("latest", json!({"key": "k", "v": 2}));
    assert_eq!(db.enqueue_outcome(now).await, Enqueued::Replaced(first));
    let job = db.store.job_get(first).await.unwrap().unwrap();
    assert_eq!(job.payload["v"], json!(2), "the waiting job took the duplicate's payload");
    assert_eq!(job.row.state, JobState::Available, "and its time to run: now");
    let run = db.fetch("latest", 1).await.remove(0);
    let running = EnqueueParams::new("latest", json!({"key": "k", "v": 3}));
    assert_eq!(db.enqueue_outcome(running).await, Enqueued::Duplicate(first), "a running job is never replaced");
    assert_eq!(db.store.job_get(first).await.unwrap().unwrap().payload["v"], json!(2));
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
}

async fn while_executing_queues_duplicates_and_runs_one_at_a_time(db: TestDb) {
    unique_type(&db, "solo", UniqueStrategy::WhileExecuting, OnDuplicate::Skip).await;
    let ids: Vec<i64> = db
        .store
        .job_enqueue_outcomes(&[keyed("solo", "k"), keyed("solo", "k"), keyed("solo", "k"), keyed("solo", "other")])
        .await
        .unwrap()
        .into_iter()
        .map(|outcome| match outcome {
            Enqueued::New(id) => id,
            duplicate => panic!("while_executing duplicates may queue: {duplicate:?}"),
        })
        .collect();
    let leased = db.fetch("solo", 10).await;
    let leased_ids: Vec<i64> = leased.iter().map(|j| j.id).collect();
    assert_eq!(leased_ids, vec![ids[0], ids[3]], "one of key k, and the job behind k's duplicates");
    assert!(db.fetch("solo", 10).await.is_empty(), "k's duplicates wait while k runs");
    let retry = FinishOutcome::Retry { error: "again".into(), delay_ms: 0 };
    db.store.job_finish(vec![finish(&leased[0], retry)]).await.unwrap();
    let next = db.fetch("solo", 10).await;
    assert_eq!(next.len(), 1, "a run that ended gave its key back, and one job of k runs next");
    db.store.job_finish(vec![finish(&next[0], completed()), finish(&leased[1], completed())]).await.unwrap();
    assert_eq!(claims(&db).await, 0);
}

async fn a_stale_run_finishing_after_its_successor_started_leaves_the_successors_claim(db: TestDb) {
    unique_type(&db, "solo", UniqueStrategy::WhileExecuting, OnDuplicate::Skip).await;
    let id = db.enqueue_outcome(keyed("solo", "k")).await.id();
    let stale = db.fetch("solo", 10).await.remove(0);
    let started = jobhost::store::RunId { job_id: stale.id, lease_token: stale.lease_token };
    common::confirm_started(&db, &[started]).await;
    // Its host goes silent; the lease expires and the same job runs again.
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    db.store.lease_expire(Some(later)).await.unwrap();
    let successor = db.fetch("solo", 10).await.remove(0);
    assert_eq!((successor.id, successor.attempt), (id, 2), "the expired run's claim went with its lease");
    let held = db.rows::<(i64, i64)>("SELECT job_id, lease_token FROM jobhost.unique_claims").await;
    assert_eq!(held, vec![(id, successor.lease_token)], "bound to the successor's run");
    // The stale run reports every way a run can end, each twice (a duplicate delivery).
    let endings = [
        completed(),
        FinishOutcome::Retry { error: "late".into(), delay_ms: 0 },
        FinishOutcome::Snooze { delay_ms: 0 },
        FinishOutcome::Failed { error: "late".into() },
    ];
    for ending in endings {
        for _ in 0..2 {
            let result = db.store.job_finish(vec![finish(&stale, ending.clone())]).await.unwrap();
            assert_eq!(result, vec![FinishResult::Duplicate]);
        }
    }
    let held_after = db.rows::<(i64, i64)>("SELECT job_id, lease_token FROM jobhost.unique_claims").await;
    assert_eq!(held_after, held, "the successor's claim is untouched");
    db.enqueue_outcome(keyed("solo", "k")).await;
    assert!(db.fetch("solo", 10).await.is_empty(), "and still keeps k's next job waiting");
    db.store.job_finish(vec![finish(&successor, completed())]).await.unwrap();
    assert_eq!(db.fetch("solo", 10).await.len(), 1, "until the successor's run ends");
}

async fn replace_never_runs_the_gate_on_a_limited_job(db: TestDb) {
    // Unique per `key` (replace), limited to one run per `c`, refusing the rest.
    unique_and_limited(&db, "{key}", OnDuplicate::Replace, OnConflict::Raise).await;
    db.enqueue_outcome(EnqueueParams::new("both", json!({"key": "x", "c": "c"}))).await;
    let later = EnqueueParams {
        delay_ms: Some(3_600_000),
        ..EnqueueParams::new("both", json!({"key": "a", "c": "c", "v": 1}))
    };
    let waiting = db.enqueue_outcome(later).await.id();
    // Due now, while c's one slot is taken: the replace must not take the
    // waiting job through the gate (which would refuse it).
    let now = EnqueueParams::new("both", json!({"key": "a", "c": "c", "v": 2}));
    assert_eq!(db.enqueue_outcome(now).await, Enqueued::Replaced(waiting));
    let job = db.store.job_get(waiting).await.unwrap().unwrap();
    assert_eq!((job.payload["v"].clone(), job.row.state), (json!(2), JobState::Scheduled), "payload only");
    let moved = EnqueueParams::new("both", json!({"key": "a", "c": "d", "v": 3}));
    assert_eq!(db.enqueue_outcome(moved).await, Enqueued::Duplicate(waiting), "a new concurrency key is not taken");
    assert_eq!(db.store.job_get(waiting).await.unwrap().unwrap().payload["v"], json!(2));
}

async fn a_job_discarded_at_the_gate_gives_its_key_back(db: TestDb) {
    unique_and_limited(&db, "{key}", OnDuplicate::Skip, OnConflict::Discard).await;
    db.enqueue_outcome(EnqueueParams::new("both", json!({"key": "x", "c": "c"}))).await;
    let discarded = db.enqueue_outcome(EnqueueParams::new("both", json!({"key": "y", "c": "c"}))).await;
    assert_eq!(db.state_of(discarded.id()).await, JobState::Discarded);
    let again = db.enqueue_outcome(EnqueueParams::new("both", json!({"key": "y", "c": "c"}))).await;
    assert!(matches!(again, Enqueued::New(id) if id != discarded.id()), "the discarded job held nothing: {again:?}");
    assert_eq!(claims(&db).await, 1, "only x holds a claim");
}

async fn a_retried_archived_job_takes_its_key_again(db: TestDb) {
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    let first = db.enqueue_outcome(keyed("once", "k")).await.id();
    let run = db.fetch("once", 1).await.remove(0);
    db.store.job_finish(vec![finish(&run, FinishOutcome::Failed { error: "no".into() })]).await.unwrap();
    let second = db.enqueue_outcome(keyed("once", "k")).await.id();
    let refused = db.store.job_retry(first).await.unwrap_err();
    assert!(refused.to_string().contains(&second.to_string()), "refused while job {second} holds k: {refused}");
    assert_eq!(db.state_of(first).await, JobState::Failed, "and left in the archive");
    db.store.job_cancel(second).await.unwrap();
    db.store.job_retry(first).await.unwrap();
    assert_eq!(db.enqueue_outcome(keyed("once", "k")).await, Enqueued::Duplicate(first), "the retried job holds k");
}

async fn a_duplicate_child_is_skipped_with_its_parents_completion(db: TestDb) {
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Raise).await;
    db.store.job_types_register(&[(job_config("parent"), "v1".to_string())]).await.unwrap();
    let existing = db.enqueue_outcome(keyed("once", "k")).await.id();
    db.store.job_enqueue(&[EnqueueParams::new("parent", json!({}))]).await.unwrap();
    let parent = db.fetch("parent", 1).await.remove(0);
    let child = |key: &str| ChildJob {
        job: "once".into(),
        payload: json!({ "key": key }),
        queue: None,
        priority: None,
        delay_ms: None,
        batch: None,
    };
    let children = vec![child("k"), child("fresh"), child("fresh")];
    let outcome = FinishOutcome::Completed {
        output: None,
        children: children.into(),
        batches: Default::default(),
        workflows: Default::default(),
        events: Default::default(),
        schedules: Default::default(),
    };
    assert_eq!(db.store.job_finish(vec![finish(&parent, outcome)]).await.unwrap(), vec![FinishResult::Done]);
    assert_eq!(db.state_of(parent.id).await, JobState::Completed, "a duplicate child never fails its parent");
    assert_eq!(live_jobs(&db, "once").await, 2, "the existing job and one fresh child");
    assert_eq!(db.state_of(existing).await, JobState::Available);
}

/// One bulk enqueue mixing every kind of job: new keys, a key repeated
/// within the call, a key a stored job holds, `while_executing` keys (never
/// claimed at enqueue) and jobs without a key. Each is answered as a single
/// enqueue would be, ids ascend in input order, and exactly the written
/// jobs have their keys recorded.
async fn one_bulk_enqueue_answers_each_kind_of_unique_job(db: TestDb) {
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    unique_type(&db, "solo", UniqueStrategy::WhileExecuting, OnDuplicate::Skip).await;
    db.store.job_types_register(&[(job_config("plain"), "v1".to_string())]).await.unwrap();
    let held = db.enqueue_outcome(keyed("once", "held")).await.id();
    let outcomes = db
        .store
        .job_enqueue_outcomes(&[
            keyed("once", "a"),
            EnqueueParams::new("plain", json!({})),
            keyed("once", "a"),
            keyed("solo", "s"),
            keyed("once", "held"),
            keyed("solo", "s"),
            keyed("once", "b"),
        ])
        .await
        .unwrap();
    let new = |i: usize| match outcomes[i] {
        Enqueued::New(id) => id,
        ref other => panic!("job {i} was to be new: {outcomes:?} ({other:?})"),
    };
    let written = [new(0), new(1), new(3), new(5), new(6)];
    assert!(written.windows(2).all(|w| w[0] < w[1]), "ids ascend in input order: {outcomes:?}");
    assert!(held < written[0]);
    assert_eq!(outcomes[2], Enqueued::Duplicate(new(0)), "the call's second job of key a is its first's duplicate");
    assert_eq!(outcomes[4], Enqueued::Duplicate(held), "a stored job's key answers with its id");
    let ids = |rows: Vec<(i64,)>| rows.into_iter().map(|(id,)| id).collect::<Vec<_>>();
    let recorded = ids(db.rows("SELECT job_id FROM jobhost.unique_keys ORDER BY job_id").await);
    assert_eq!(
        recorded,
        vec![new(3), new(5)],
        "the written while_executing keys (an until_executed job's key is its claim)"
    );
    let claimants = ids(db.rows("SELECT job_id FROM jobhost.unique_claims ORDER BY job_id").await);
    assert_eq!(claimants, vec![held, new(0), new(6)], "until_executed keys are claimed, while_executing ones not yet");
    assert_eq!(live_jobs(&db, "once").await + live_jobs(&db, "solo").await + live_jobs(&db, "plain").await, 6);
}

/// A large bulk enqueue (PostgreSQL first tries its claims as a plain
/// insert, which any taken key makes fail and roll back) answers every job
/// as a small one would, wherever a taken key falls: all keys new; one key
/// a stored job holds, away from the keys sampled before trying and late
/// in key order; a key twice in the call; every key held; and a `raise`
/// type refusing the whole call for one held key. Afterwards every live
/// job holds exactly one claim, its own, and exactly its key is recorded.
async fn a_large_bulk_enqueue_answers_duplicates_wherever_they_fall(db: TestDb) {
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    unique_type(&db, "strict", UniqueStrategy::UntilExecuted, OnDuplicate::Raise).await;
    let calls = |job: &'static str, prefix: &'static str| -> Vec<EnqueueParams> {
        (0..300).map(|i| keyed(job, &format!("{prefix}{i:03}"))).collect()
    };
    let new_ids = |outcomes: &[Enqueued]| -> Vec<i64> {
        outcomes.iter().map(|o| if let Enqueued::New(id) = o { *id } else { panic!("not new: {o:?}") }).collect()
    };
    let all_new = new_ids(&db.store.job_enqueue_outcomes(&calls("once", "a")).await.unwrap());
    assert!(all_new.windows(2).all(|w| w[0] < w[1]), "ids ascend in input order");

    let holder = db.enqueue_outcome(keyed("once", "b901")).await.id();
    let mut one_held = calls("once", "b");
    one_held[100] = keyed("once", "b901");
    let outcomes = db.store.job_enqueue_outcomes(&one_held).await.unwrap();
    assert_eq!(outcomes[100], Enqueued::Duplicate(holder), "the held key answers with its holder");
    let written: Vec<_> = outcomes.iter().enumerate().filter(|(i, _)| *i != 100).map(|(_, o)| *o).collect();
    assert_eq!(new_ids(&written).len(), 299, "every other job is new");

    let mut twice = calls("once", "c");
    twice[299] = keyed("once", "c005");
    let outcomes = db.store.job_enqueue_outcomes(&twice).await.unwrap();
    let first = outcomes[5].id();
    assert_eq!(outcomes[299], Enqueued::Duplicate(first), "the call's second job of c005 is its first's duplicate");
    assert_eq!(new_ids(&outcomes[..299]).len(), 299);

    let again = db.store.job_enqueue_outcomes(&calls("once", "a")).await.unwrap();
    let answers: Vec<Enqueued> = all_new.iter().map(|id| Enqueued::Duplicate(*id)).collect();
    assert_eq!(again, answers, "every held key answers with its own holder");

    let strict_holder = db.enqueue_outcome(keyed("strict", "s250")).await.id();
    match db.store.job_enqueue_outcomes(&calls("strict", "s")).await {
        Err(Error::Duplicate { claimant, .. }) => assert_eq!(claimant, strict_holder),
        other => panic!("a raise duplicate refuses the call: {other:?}"),
    }
    assert_eq!(live_jobs(&db, "strict").await, 1, "the refused call stored nothing");

    let live = live_jobs(&db, "once").await + live_jobs(&db, "strict").await;
    assert_eq!(live, 300 + 1 + 299 + 299 + 1);
    assert_eq!(claims(&db).await, live, "one claim per live job");
    let own = format!(
        "SELECT count(*) FROM jobhost.unique_claims c JOIN jobhost.jobs j
         ON j.id = c.job_id AND j.job = c.job AND c.unique_key = {}",
        db.dialect("j.payload ->> 'key'", "json_extract(j.payload, '$.key')")
    );
    assert_eq!(db.scalar(own).await, live, "each claim is its claimant's own key");
}

/// A large bulk enqueue, all new, of until_executed, while_executing and
/// plain jobs mixed (PostgreSQL's plain-insert claims then win at once, and
/// the call answers without reading a claimant back): every job is new,
/// exactly the until_executed jobs hold claims and exactly the
/// while_executing jobs have their keys recorded.
async fn a_large_bulk_enqueue_of_mixed_jobs_claims_and_records_each_kind(db: TestDb) {
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    unique_type(&db, "solo", UniqueStrategy::WhileExecuting, OnDuplicate::Skip).await;
    db.store.job_types_register(&[(job_config("plain"), "v1".to_string())]).await.unwrap();
    let jobs: Vec<EnqueueParams> = (0..300)
        .map(|i| match i % 3 {
            0 => keyed("once", &format!("m{i:03}")),
            1 => EnqueueParams::new("plain", json!({ "i": i })),
            _ => keyed("solo", &format!("w{i:03}")),
        })
        .collect();
    let outcomes = db.store.job_enqueue_outcomes(&jobs).await.unwrap();
    let ids: Vec<i64> = outcomes
        .iter()
        .map(|o| if let Enqueued::New(id) = o { *id } else { panic!("every job is new: {o:?}") })
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids ascend in input order");
    let of_kind =
        |kind: usize| ids.iter().enumerate().filter(|(i, _)| i % 3 == kind).map(|(_, id)| *id).collect::<Vec<_>>();
    let column = |rows: Vec<(i64,)>| rows.into_iter().map(|(id,)| id).collect::<Vec<_>>();
    let claimants = column(db.rows("SELECT job_id FROM jobhost.unique_claims ORDER BY job_id").await);
    assert_eq!(claimants, of_kind(0), "the until_executed jobs hold claims, and only they");
    let recorded = column(db.rows("SELECT job_id FROM jobhost.unique_keys ORDER BY job_id").await);
    assert_eq!(recorded, of_kind(2), "the while_executing jobs' keys are recorded, and only theirs");
}

/// One call of unique limited jobs (one slot per `c`) whose first key
/// comes twice: the gate counts only the jobs written, so the duplicate
/// takes no slot and is not blocked, and the next job of `c` is the one
/// blocked behind the first. On PostgreSQL the claims and the writes go in
/// one round trip; a duplicate written or gated there would show here.
async fn a_bulk_enqueue_gates_only_the_unique_jobs_it_writes(db: TestDb) {
    unique_and_limited(&db, "{id}", OnDuplicate::Skip, OnConflict::Block).await;
    db.store.job_types_register(&[(job_config("plain"), "v1".to_string())]).await.unwrap();
    let both = |id: i64| EnqueueParams::new("both", json!({ "id": id, "c": "k" }));
    let outcomes = db
        .store
        .job_enqueue_outcomes(&[both(1), EnqueueParams::new("plain", json!({})), both(1), both(2)])
        .await
        .unwrap();
    let (first, second) = (outcomes[0].id(), outcomes[3].id());
    assert!(matches!(outcomes[1], Enqueued::New(_)), "{outcomes:?}");
    assert_eq!(outcomes[2], Enqueued::Duplicate(first), "{outcomes:?}");
    assert_eq!(outcomes[3], Enqueued::New(second), "{outcomes:?}");
    assert_eq!(db.state_of(first).await, JobState::Available);
    assert_eq!(db.state_of(second).await, JobState::Blocked, "one slot, the first job's");
    assert_eq!(live_jobs(&db, "both").await, 2, "the duplicate was not written");
    assert_eq!(db.scalar("SELECT sum(holders) FROM jobhost.semaphores WHERE key = 'k'").await, 1);
    assert_eq!(claims(&db).await, 2);
}

/// A call of unique rate-limited jobs (two starts a second per `key`, unique
/// on `id`) with a duplicate plans start times for the jobs it writes only:
/// of four jobs written two start now and two wait for the next second.
/// Planned for the duplicate too, only one would start now; planned for
/// none, all four would.
async fn a_bulk_enqueue_plans_rate_limited_starts_only_for_the_unique_jobs_it_writes(db: TestDb) {
    let mut config = job_config("paced");
    config.unique = Some(UniqueConfig {
        key: KeyTemplate::parse("{id}").unwrap(),
        strategy: UniqueStrategy::UntilExecuted,
        on_duplicate: OnDuplicate::Skip,
    });
    config.rate_limit =
        Some(jobhost::types::RateLimitConfig { limit: 2, period_ms: 1_000, key: KeyTemplate::parse("{key}").unwrap() });
    db.store.job_types_register(&[(config, "v1".to_string())]).await.unwrap();
    let paced = |id: i64| EnqueueParams::new("paced", json!({ "id": id, "key": "a" }));
    let outcomes = db.store.job_enqueue_outcomes(&[paced(1), paced(1), paced(2), paced(3), paced(4)]).await.unwrap();
    assert_eq!(outcomes[1], Enqueued::Duplicate(outcomes[0].id()), "{outcomes:?}");
    let mut states = Vec::new();
    for i in [0, 2, 3, 4] {
        states.push(db.state_of(outcomes[i].id()).await);
    }
    use JobState::{Available, Scheduled};
    assert_eq!(states, [Available, Available, Scheduled, Scheduled], "{outcomes:?}");
}

on_both_backends!(
    one_bulk_enqueue_answers_each_kind_of_unique_job,
    a_bulk_enqueue_gates_only_the_unique_jobs_it_writes,
    a_bulk_enqueue_plans_rate_limited_starts_only_for_the_unique_jobs_it_writes,
    a_large_bulk_enqueue_of_mixed_jobs_claims_and_records_each_kind,
    a_large_bulk_enqueue_answers_duplicates_wherever_they_fall,
    eight_concurrent_enqueuers_of_one_key_store_one_job,
    a_job_in_retry_backoff_still_blocks_its_duplicate_until_it_ends,
    uniqueness_is_checked_before_the_gate_and_survives_blocking,
    raise_refuses_a_duplicate_and_stores_nothing,
    replace_updates_a_waiting_job_and_never_a_running_one,
    while_executing_queues_duplicates_and_runs_one_at_a_time,
    a_stale_run_finishing_after_its_successor_started_leaves_the_successors_claim,
    replace_never_runs_the_gate_on_a_limited_job,
    a_job_discarded_at_the_gate_gives_its_key_back,
    a_retried_archived_job_takes_its_key_again,
    a_duplicate_child_is_skipped_with_its_parents_completion,
);

/// A large bulk enqueue whose key an application's open transaction has
/// just claimed waits for it (the plain insert of the claims, like the
/// speculative one, waits on the uncommitted claim), while a bulk over
/// other keys goes in; then its job of that key is the application's
/// duplicate if the application commits, and new if it rolls back. Each
/// round ends with one claim per live job and no claim left by the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_bulk_enqueue_waits_for_an_applications_open_claim() {
    for commit in [true, false] {
        let db = TestDb::new(Backend::Postgres).await;
        unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
        let mut application = db.pool().begin().await.unwrap();
        let app_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *application).await.unwrap();
        let app_job: i64 = sqlx::query_scalar("SELECT jobhost.enqueue('once', '{\"key\": \"k150\"}')")
            .fetch_one(&mut *application)
            .await
            .unwrap();
        let store = db.dyn_store();
        let bulk_jobs: Vec<EnqueueParams> = (0..300).map(|i| keyed("once", &format!("k{i:03}"))).collect();
        let bulk = tokio::spawn(async move { store.job_enqueue_outcomes(&bulk_jobs).await });
        let waiting = format!("SELECT count(*) FROM pg_stat_activity WHERE {app_pid} = ANY(pg_blocking_pids(pid))");
        eventually(WITHIN, || async { db.scalar(&waiting).await > 0 }).await;
        let others: Vec<EnqueueParams> = (0..100).map(|i| keyed("once", &format!("other{i:03}"))).collect();
        let others = db.store.job_enqueue_outcomes(&others).await.unwrap();
        assert!(others.iter().all(|o| matches!(o, Enqueued::New(_))));
        assert!(!bulk.is_finished(), "the bulk over k150 still waits for the application");
        if commit {
            application.commit().await.unwrap();
        } else {
            application.rollback().await.unwrap();
        }
        let outcomes = bulk.await.unwrap().unwrap();
        let round = format!("application committed: {commit}");
        if commit {
            assert_eq!(outcomes[150], Enqueued::Duplicate(app_job), "{round}");
        } else {
            assert!(matches!(outcomes[150], Enqueued::New(id) if id != app_job), "{round}: {:?}", outcomes[150]);
        }
        let new = outcomes.iter().filter(|o| matches!(o, Enqueued::New(_))).count() as i64;
        assert_eq!(new, 300 - i64::from(commit), "{round}");
        let live = live_jobs(&db, "once").await;
        assert_eq!(live, 300 + 100, "{round}");
        assert_eq!(claims(&db).await, live, "one claim per live job, {round}");
        let own = "SELECT count(*) FROM jobhost.unique_claims c JOIN jobhost.jobs j ON j.id = c.job_id";
        assert_eq!(db.scalar(own).await, live, "every claim is a live job's, {round}");
    }
}

/// A large bulk enqueue of new keys claims and writes in one call
/// (`claim_and_insert_jobs`); when its connection is lost while that call
/// waits for an application's open claim, the enqueue fails and leaves
/// nothing: no claim, no job, no semaphore slot. Sent again after the
/// application commits, it answers the application's key as a duplicate
/// and writes the rest once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_enqueue_whose_connection_is_lost_mid_call_leaves_nothing() {
    let db = TestDb::new(Backend::Postgres).await;
    unique_and_limited(&db, "{unique}", OnDuplicate::Skip, OnConflict::Block).await;
    let mut application = db.pool().begin().await.unwrap();
    let app_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *application).await.unwrap();
    let app_job: i64 = sqlx::query_scalar("SELECT jobhost.enqueue('both', '{\"unique\": \"u150\", \"c\": \"a\"}')")
        .fetch_one(&mut *application)
        .await
        .unwrap();
    let bulk_jobs: Vec<EnqueueParams> = (0..300)
        .map(|i| EnqueueParams::new("both", json!({ "unique": format!("u{i:03}"), "c": format!("c{i}") })))
        .collect();
    let store = db.dyn_store();
    let jobs = bulk_jobs.clone();
    let bulk = tokio::spawn(async move { store.job_enqueue_outcomes(&jobs).await });
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity
         WHERE {app_pid} = ANY(pg_blocking_pids(pid)) AND query LIKE '%claim_and_insert_jobs%'"
    );
    eventually(WITHIN, || async { db.scalar(&waiting).await > 0 }).await;
    db.execute(format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {app_pid} = ANY(pg_blocking_pids(pid))"
    ))
    .await;
    assert!(bulk.await.unwrap().is_err(), "the enqueue whose connection was lost fails");
    application.commit().await.unwrap();
    assert_eq!(live_jobs(&db, "both").await, 1, "only the application's job");
    assert_eq!(claims(&db).await, 1, "only the application's claim");
    assert_eq!(db.scalar("SELECT sum(holders) FROM jobhost.semaphores").await, 1, "only the application's slot");

    let outcomes = db.store.job_enqueue_outcomes(&bulk_jobs).await.unwrap();
    assert_eq!(outcomes[150], Enqueued::Duplicate(app_job));
    assert_eq!(outcomes.iter().filter(|o| matches!(o, Enqueued::New(_))).count(), 299);
    assert_eq!(live_jobs(&db, "both").await, 300);
    assert_eq!(claims(&db).await, 300, "one claim per live job");
    assert_eq!(db.scalar("SELECT sum(holders) FROM jobhost.semaphores").await, 300, "one slot per live job");
}

/// The upgrade that stops recording until_executed keys in `unique_keys`
/// (0033: the claim holds the key) keeps every live key held: the rows of
/// a database's live jobs go, a duplicate enqueued after the upgrade is
/// still answered with the holder, a `while_executing` key stays recorded,
/// and archiving the holder still gives its key back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_keys_stay_held_through_the_upgrade_that_stops_recording_them() {
    let db = TestDb::postgres_at(32).await;
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    unique_type(&db, "solo", UniqueStrategy::WhileExecuting, OnDuplicate::Skip).await;
    let once = enqueue_as_previous_release(&db, "once", "k", false).await;
    let solo = enqueue_as_previous_release(&db, "solo", "s", true).await;
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.unique_keys").await, 2, "both recorded before");
    db.store.schema_migrate().await.unwrap();
    let recorded: Vec<(i64,)> = db.rows("SELECT job_id FROM jobhost.unique_keys").await;
    assert_eq!(recorded, [(solo,)], "only the while_executing key is recorded after");
    assert_eq!(db.enqueue_outcome(keyed("once", "k")).await, Enqueued::Duplicate(once), "k is still held");
    db.store.job_cancel(once).await.unwrap();
    assert_eq!(claims(&db).await, 0, "archiving the holder gave k back");
    assert!(matches!(db.enqueue_outcome(keyed("once", "k")).await, Enqueued::New(_)));
}

/// The claims' primary key is replaced by one that leads with the key
/// (0037 builds it concurrently, 0038 makes it the primary key): a key held
/// before is still held after, a bulk enqueue after it still finds its
/// duplicate, and archiving the holder gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_stay_held_through_the_new_key_of_the_claims() {
    let db = TestDb::postgres_at(36).await;
    upgrade_holding_a_key(&db, |_| async {}).await;
}

/// A concurrent build of the claims' new key that failed half-way leaves
/// an invalid index: 0038 builds it again rather than make it the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_build_of_the_claims_new_key_is_done_again() {
    let db = TestDb::postgres_at(37).await;
    upgrade_holding_a_key(&db, |db: &TestDb| {
        let invalidate = "UPDATE pg_index SET indisvalid = false
                          WHERE indexrelid = 'jobhost.unique_claims_key_first'::regclass";
        db.execute(invalidate)
    })
    .await;
}

/// Claims found by their key (0041–0043): a key held before is still held
/// after and given back when its holder is archived, and the claims taken
/// after ride on their rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_stay_held_through_claims_found_by_key() {
    let db = TestDb::postgres_at(40).await;
    upgrade_holding_a_key(&db, |_| async {}).await;
}

/// A concurrent build of the unattached claims' index (0042) that failed
/// half-way leaves an invalid index: 0043 builds it again rather than drop
/// the index the claims were found by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_build_of_the_unattached_claims_index_is_done_again() {
    let db = TestDb::postgres_at(42).await;
    upgrade_holding_a_key(&db, |db: &TestDb| {
        let invalidate = "UPDATE pg_index SET indisvalid = false
                          WHERE indexrelid = 'jobhost.unique_claims_unattached'::regclass";
        db.execute(invalidate)
    })
    .await;
}

/// Enqueues one `job` keyed `key` as a host of the release before 0043
/// did: its id and claim from the three-argument `claim_new_keys` (an
/// unattached claim), its row from the twelve-argument `insert_jobs` (no
/// key on it). Returns its id.
async fn enqueue_as_previous_release(db: &TestDb, job: &str, key: &str, while_executing: bool) -> i64 {
    let (ids, claimants): (Vec<i64>, Vec<Option<i64>>) =
        sqlx::query_as("SELECT ids, claimants FROM jobhost.claim_new_keys(ARRAY[$1], ARRAY[$2], ARRAY[$3])")
            .bind(job)
            .bind(key)
            .bind(while_executing)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(claimants[0].unwrap_or(ids[0]), ids[0], "{job} {key} is new");
    sqlx::query(
        "SELECT jobhost.insert_jobs(ARRAY[$1], ARRAY['default'], ARRAY[0::smallint], ARRAY[$2::jsonb], ARRAY[3],
                                    ARRAY[NULL::timestamptz], ARRAY[0::bigint], ARRAY[NULL::text], ARRAY[NULL::bigint],
                                    ARRAY[$3::bigint], ARRAY[NULL::bigint], ARRAY[NULL::timestamptz])",
    )
    .bind(job)
    .bind(json!({ "key": key }))
    .bind(ids[0])
    .execute(db.pool())
    .await
    .unwrap();
    ids[0]
}

/// Holds `k050`, runs `before_upgrade`, migrates to the latest version,
/// and checks the key and the claims' new primary key.
async fn upgrade_holding_a_key<'a, F, Fut>(db: &'a TestDb, before_upgrade: F)
where
    F: FnOnce(&'a TestDb) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    unique_type(db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    let holder = enqueue_as_previous_release(db, "once", "k050", false).await;
    before_upgrade(db).await;
    db.store.schema_migrate().await.unwrap();
    let leading = db
        .texts(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
             WHERE i.indrelid = 'jobhost.unique_claims'::regclass AND i.indisprimary AND i.indisvalid",
        )
        .await;
    assert_eq!(leading, ["unique_key"], "a valid primary key leads with the key after the upgrade");
    let indexes = db.texts("SELECT indexname::text FROM pg_indexes WHERE tablename = 'unique_claims' ORDER BY 1").await;
    assert_eq!(indexes, ["unique_claims_pkey", "unique_claims_unattached"], "the old keys are gone, no copy is left");
    let invalid = db
        .scalar("SELECT count(*) FROM pg_index WHERE indrelid = 'jobhost.unique_claims'::regclass AND NOT indisvalid")
        .await;
    assert_eq!(invalid, 0, "every index of the claims is valid");
    let bulk: Vec<EnqueueParams> = (0..100).map(|i| keyed("once", &format!("k{i:03}"))).collect();
    let outcomes = db.store.job_enqueue_outcomes(&bulk).await.unwrap();
    assert_eq!(outcomes[50], Enqueued::Duplicate(holder), "k050 is still held");
    assert_eq!(outcomes.iter().filter(|o| matches!(o, Enqueued::New(_))).count(), 99);
    let attached = db.scalar("SELECT count(*) FROM jobhost.unique_claims WHERE attached").await;
    assert_eq!(attached, 99, "the new claims ride on their rows; the one taken before the upgrade does not");
    // A host of the previous release goes on enqueuing after the upgrade,
    // with the signatures it knows (and, on a connection that prepared
    // them before, statements PostgreSQL plans again).
    let old_host = enqueue_as_previous_release(db, "once", "k-old", false).await;
    db.store.job_cancel(old_host).await.unwrap();
    db.store.job_cancel(holder).await.unwrap();
    assert_eq!(claims(db).await, 99, "archiving the holder gave k050 back");
    assert!(matches!(db.enqueue_outcome(keyed("once", "k050")).await, Enqueued::New(_)));
}

/// Which calls try their claims as a plain insert first
/// (`jobhost.claims_likely_new`): 64 claims or more, counted without the
/// jobs that claim nothing (no key, or `while_executing`), and none of the
/// sampled keys held. The claims' outcomes are the same either way, so
/// only the function's own answers show a wrong count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_tries_a_plain_insert_only_with_enough_claims_and_no_sampled_key_held() {
    let db = TestDb::new(Backend::Postgres).await;
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    let likely = |jobs: usize, keys: &str, while_executing: &str| {
        format!(
            "SELECT jobhost.claims_likely_new(array_fill('once'::text, ARRAY[{jobs}]),
                        (SELECT array_agg({keys} ORDER BY i) FROM generate_series(1, {jobs}) i),
                        {while_executing})::text"
        )
    };
    let cases = [
        ("64 keys", likely(64, "'k' || i", "array_fill(false, ARRAY[64])"), "true"),
        ("63 keys", likely(63, "'k' || i", "array_fill(false, ARRAY[63])"), "false"),
        ("64 keys, no while_executing array (the SQL enqueue)", likely(64, "'k' || i", "NULL"), "true"),
        (
            "100 keys, 40 of them while_executing",
            likely(100, "'k' || i", "(SELECT array_agg(i <= 40 ORDER BY i) FROM generate_series(1, 100) i)"),
            "false",
        ),
        (
            "100 keys, 30 of them while_executing",
            likely(100, "'k' || i", "(SELECT array_agg(i <= 30 ORDER BY i) FROM generate_series(1, 100) i)"),
            "true",
        ),
        (
            "100 jobs, 40 without a key",
            likely(100, "CASE WHEN i <= 40 THEN NULL ELSE 'k' || i END", "array_fill(false, ARRAY[100])"),
            "false",
        ),
        (
            "64 keys, one while_executing flag unknown",
            likely(
                64,
                "'k' || i",
                "(SELECT array_agg(CASE WHEN i = 1 THEN NULL ELSE false END) FROM generate_series(1, 64) i)",
            ),
            "true",
        ),
    ];
    for (case, sql, expected) in &cases {
        assert_eq!(db.texts(sql).await, [*expected], "{case}");
    }
    // The sample takes every second key of 64: k1, k3, … k63.
    let held = db.enqueue_outcome(keyed("once", "k33")).await.id();
    assert_eq!(
        db.texts(&cases[0].1).await,
        ["false"],
        "a held key in the sample ({held}) sends the call to ON CONFLICT"
    );
    db.store.job_cancel(held).await.unwrap();
    db.enqueue_outcome(keyed("once", "k34")).await.id();
    assert_eq!(db.texts(&cases[0].1).await, ["true"], "a held key outside the sample is left to the insert to find");
}

/// The SQL enqueue applies the same rules: a duplicate returns the holder's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_enqueue_returns_the_holders_id_for_a_duplicate() {
    let db = TestDb::new(Backend::Postgres).await;
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    let first = db.scalar("SELECT jobhost.enqueue('once', '{\"key\": \"k\"}')").await;
    assert_eq!(db.scalar("SELECT jobhost.enqueue('once', '{\"key\": \"k\"}')").await, first);
    assert_eq!(db.enqueue_outcome(keyed("once", "k")).await, Enqueued::Duplicate(first));
    assert_eq!(live_jobs(&db, "once").await, 1);
}

/// A `while_executing` key never has two runs at once, through a holder
/// SIGKILLed mid-run and its lease's expiry: by the guests' own clocks,
/// runs of the key never overlap, and none began before the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_executing_never_overlaps_through_a_killed_holder() {
    let db = TestDb::new(Backend::Postgres).await;
    let components = fleet::components(&["exclusive"]);
    let cache = tempfile::tempdir().unwrap();
    let start =
        || Host::start(&mut fleet::host_command_beating(&db.url, components.path(), cache.path(), "200ms", "1s"));
    let (mut doomed, mut survivor) = (start(), start());
    fleet::wait_serving(&db, &[&doomed, &survivor], 1).await;
    let long = EnqueueParams::new("exclusive", json!({"key": "k", "ms": 600_000}));
    let held = db.store.job_enqueue(&[long]).await.unwrap()[0];
    let running_held = format!("SELECT count(*) FROM jobhost.jobs WHERE id = {held} AND state = 'running'");
    eventually(WITHIN, || async { db.scalar(&running_held).await == 1 }).await;
    // The test kills whichever host leased it.
    let on_doomed =
        format!("SELECT count(*) FROM jobhost.jobs WHERE id = {held} AND host_id LIKE '{}'", doomed.id_pattern());
    if db.scalar(&on_doomed).await == 0 {
        std::mem::swap(&mut doomed, &mut survivor);
    }
    let short: Vec<EnqueueParams> =
        (0..4).map(|i| EnqueueParams::new("exclusive", json!({"key": "k", "ms": 100, "i": i}))).collect();
    db.store.job_enqueue(&short).await.unwrap();
    doomed.signal(libc::SIGKILL);
    let killed_at_ms = chrono::Utc::now().timestamp_millis();
    doomed.wait().await;
    // Cancelled, the long job leaves at its lease's expiry instead of running again.
    db.store.job_cancel(held).await.unwrap();
    let running = "SELECT count(*) FROM jobhost.jobs WHERE job = 'exclusive' AND state = 'running'";
    eventually(WITHIN, || async {
        assert!(db.scalar(running).await <= 1, "never two runs of one while_executing key at a look");
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'exclusive' AND state = 'completed'").await == 4
    })
    .await;
    assert_eq!(db.state_of(held).await, JobState::Cancelled);
    let runs: Vec<(i64, i64)> = db
        .rows(
            "SELECT (output->>'started_ms')::bigint, (output->>'ended_ms')::bigint
             FROM jobhost.archive WHERE job = 'exclusive' AND state = 'completed'",
        )
        .await;
    assert!(runs.iter().all(|(start, _)| *start > killed_at_ms), "none ran beside the killed holder: {runs:?}");
    let runs: Vec<(u64, u64)> = runs.into_iter().map(|(start, end)| (start as u64, end as u64)).collect();
    assert_eq!(fleet::most_at_once(runs.clone()), 1, "runs of k never overlapped: {runs:?}");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.unique_claims").await, 0, "and nothing holds k now");
    survivor.stop().await;
}

/// A host's claims ride on their jobs' rows and come back by their key
/// (0041–0043, docs/uniqueness.md "How it works"): whichever way a job
/// leaves the queue (a result, a failure, an expired lease, quarantine,
/// a cancel while available or blocked, the gate discarding it as it is
/// written or as it comes due), its row in the archive carries its key and
/// its claim is gone; through `blocked_jobs` and back (parked as it came
/// due, blocked as it was written, then promoted) its row keeps the key.
/// A job retried from the archive takes an unattached claim again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_out_of_the_queue_gives_a_hosts_claim_back_by_its_key() {
    let db = TestDb::postgres().await;
    let mut blocking = job_config("both");
    blocking.max_attempts = 1;
    blocking.unique = Some(UniqueConfig {
        key: KeyTemplate::parse("{key}").unwrap(),
        strategy: UniqueStrategy::UntilExecuted,
        on_duplicate: OnDuplicate::Skip,
    });
    blocking.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{c}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    let mut discarding = blocking.clone();
    discarding.name = "drop".into();
    discarding.concurrency.as_mut().unwrap().on_conflict = OnConflict::Discard;
    db.store.job_types_register(&[(blocking, "v1".into()), (discarding, "v1".into())]).await.unwrap();
    let enqueue = |job: &str, key: &str, c: &str| EnqueueParams::new(job, json!({ "key": key, "c": c }));
    let later = chrono::Utc::now() + chrono::Duration::hours(2);

    let done = db.enqueue_outcome(enqueue("both", "done", "c1")).await.id();
    riding(&db, done, "done", "jobs").await;
    let run = db.fetch("both", 1).await.remove(0);
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    given_back(&db, done, "done").await;

    let failed = db.enqueue_outcome(enqueue("both", "failed", "c1")).await.id();
    let run = db.fetch("both", 1).await.remove(0);
    db.store.job_finish(vec![finish(&run, FinishOutcome::Failed { error: "no".into() })]).await.unwrap();
    given_back(&db, failed, "failed").await;

    let lost = db.enqueue_outcome(enqueue("both", "lost", "c1")).await.id();
    let run = db.fetch("both", 1).await.remove(0);
    let started = jobhost::store::RunId { job_id: run.id, lease_token: run.lease_token };
    db.store.lease_started(&[started]).await.unwrap();
    assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (0, 1), "its one attempt spent");
    given_back(&db, lost, "lost").await;

    // Quarantine leaves a slot it held to the semaphores' repair: a key of its own.
    let odd = db.enqueue_outcome(enqueue("both", "odd", "c-odd")).await.id();
    assert!(db.store.job_quarantine(odd, "unreadable").await.unwrap());
    given_back(&db, odd, "odd").await;

    let idle = db.enqueue_outcome(enqueue("both", "idle", "c1")).await.id();
    db.store.job_cancel(idle).await.unwrap();
    given_back(&db, idle, "idle").await;

    // Blocked as it is written, cancelled there; blocked, then promoted.
    let first = db.enqueue_outcome(enqueue("both", "first", "c2")).await.id();
    let first_run = db.fetch("both", 1).await.remove(0);
    let waits = db.enqueue_outcome(enqueue("both", "waits", "c2")).await.id();
    let second = db.enqueue_outcome(enqueue("both", "second", "c2")).await.id();
    riding(&db, waits, "waits", "blocked_jobs").await;
    riding(&db, second, "second", "blocked_jobs").await;
    db.store.job_cancel(waits).await.unwrap();
    given_back(&db, waits, "waits").await;
    db.store.job_finish(vec![finish(&first_run, completed())]).await.unwrap();
    given_back(&db, first, "first").await;
    riding(&db, second, "second", "jobs").await;
    let run = db.fetch("both", 1).await.remove(0);
    assert_eq!(run.id, second);
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    given_back(&db, second, "second").await;

    // The gate as jobs are written: a discarding type's second job.
    let holder = db.enqueue_outcome(enqueue("drop", "holder", "c3")).await.id();
    let dropped = db.enqueue_outcome(enqueue("drop", "dropped", "c3")).await.id();
    given_back(&db, dropped, "dropped").await;

    // The gate as jobs come due: parked (blocking) or discarded.
    let mut due = enqueue("both", "due", "c3");
    due.delay_ms = Some(3_600_000);
    let due = db.enqueue_outcome(due).await.id();
    let mut due_drop = enqueue("drop", "due-drop", "c3");
    due_drop.delay_ms = Some(3_600_000);
    let due_drop = db.enqueue_outcome(due_drop).await.id();
    let blocker = db.enqueue_outcome(enqueue("both", "blocker", "c3")).await.id();
    riding(&db, due, "due", "jobs").await;
    db.store.job_promote_due(Some(later)).await.unwrap();
    riding(&db, due, "due", "blocked_jobs").await;
    given_back(&db, due_drop, "due-drop").await;
    for id in [due, blocker, holder] {
        db.store.job_cancel(id).await.unwrap();
    }
    given_back(&db, due, "due").await;

    // Retried from the archive: its claim is taken again, unattached.
    db.store.job_retry(failed).await.unwrap();
    assert_eq!(
        key_and_claim(&db, failed).await,
        [(None, false)],
        "the retried job holds an unattached claim, found by its id"
    );
    db.store.job_cancel(failed).await.unwrap();
    assert_eq!(claims(&db).await, 0, "every claim was given back");
}

/// `id`'s row in `table` carries `key`, and its claim is attached to it.
async fn riding(db: &TestDb, id: i64, key: &str, table: &str) {
    let found: Vec<(Option<String>, bool)> = db
        .rows(format!(
            "SELECT j.unique_key, c.attached FROM jobhost.{table} j
             JOIN jobhost.unique_claims c ON c.unique_key = j.unique_key AND c.job = j.job AND c.job_id = j.id
             WHERE j.id = {id}"
        ))
        .await;
    assert_eq!(found, [(Some(key.to_string()), true)], "job {id} carries {key} in {table}");
}

/// `id` is archived with its key carried, and no claim of it is left.
async fn given_back(db: &TestDb, id: i64, key: &str) {
    assert_eq!(archived_key(db, id).await, [(Some(key.to_string()), true)], "job {id} archived with {key}");
    let left = db.scalar(format!("SELECT count(*) FROM jobhost.unique_claims WHERE job_id = {id}")).await;
    assert_eq!(left, 0, "job {id} gave {key} back");
}

/// The key on live job `id`'s row, and whether the claim it holds by its
/// id is attached.
async fn key_and_claim(db: &TestDb, id: i64) -> Vec<(Option<String>, bool)> {
    db.rows(format!(
        "SELECT j.unique_key, c.attached FROM jobhost.jobs j JOIN jobhost.unique_claims c ON c.job_id = j.id
         WHERE j.id = {id}"
    ))
    .await
}

/// The key archived job `id`'s row carries, and whether its statement said so.
async fn archived_key(db: &TestDb, id: i64) -> Vec<(Option<String>, bool)> {
    db.rows(format!("SELECT unique_key, key_carried FROM jobhost.archive WHERE id = {id}")).await
}

/// During a rolling upgrade a host of the previous release archives jobs
/// with its own statements, which name no key: the archive's trigger then
/// looks for the claim by the job's id among the attached claims. Its own
/// enqueues take unattached claims, which a duplicate from either release
/// finds, and which come back when their job is archived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_come_back_from_jobs_a_host_of_the_previous_release_moves() {
    let db = TestDb::postgres().await;
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    let new_host = db.enqueue_outcome(keyed("once", "new")).await.id();
    // The previous release's cancel, as it wrote the archive row.
    db.execute(format!(
        "WITH gone AS (DELETE FROM jobhost.jobs WHERE id = {new_host} RETURNING *)
         INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                      progress, enqueued_at, started_at, finished_at, concurrency_key, batch_id,
                                      parent_id)
         SELECT id, job, queue, priority, payload, 'cancelled', attempt, max_attempts, errors, progress,
                enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id
         FROM gone"
    ))
    .await;
    assert_eq!(archived_key(&db, new_host).await, [(None, false)], "the old statement carried nothing");
    assert_eq!(claims(&db).await, 0, "its attached claim was found by a scan");

    let old_host = enqueue_as_previous_release(&db, "once", "old", false).await;
    assert_eq!(key_and_claim(&db, old_host).await, [(None, false)], "an unattached claim, no key on the row");
    assert_eq!(db.enqueue_outcome(keyed("once", "old")).await, Enqueued::Duplicate(old_host));
    let run = db.fetch("once", 1).await.remove(0);
    db.store.job_finish(vec![finish(&run, completed())]).await.unwrap();
    assert_eq!(claims(&db).await, 0, "found by its id when its job was archived");
    assert!(matches!(db.enqueue_outcome(keyed("once", "old")).await, Enqueued::New(_)));
}

/// A bulk enqueue finds its keys' claims one index probe at a time,
/// however many claims other jobs hold: the holders of a call's
/// duplicates are read by key, not by joining the call to the whole
/// claims table (which the planner did by hashing it, so a call of
/// thousands of keys read every claim). Both functions that claim a call's
/// keys are covered: the host's (`claim_new_keys`) and the SQL bulk
/// enqueue's (`claim_unique`, through `jobhost.enqueue_many`), each over
/// a call whose keys are half held, half new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_enqueue_reads_only_its_own_keys_claims() {
    let db = TestDb::postgres().await;
    unique_type(&db, "once", UniqueStrategy::UntilExecuted, OnDuplicate::Skip).await;
    let held: Vec<EnqueueParams> = (0..20_000).map(|i| keyed("once", &format!("k{i}"))).collect();
    for chunk in held.chunks(5_000) {
        db.store.job_enqueue(chunk).await.unwrap();
    }
    db.execute("ANALYZE jobhost.unique_claims").await;
    let keys: Vec<String> = (19_500..20_500).map(|i| format!("k{i}")).collect();
    let scans =
        "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE schemaname = 'jobhost' AND relname = 'unique_claims'";

    let mut tx = db.pool().begin().await.unwrap();
    let (_, claimants): (Vec<i64>, Vec<Option<i64>>) =
        sqlx::query_as("SELECT ids, claimants FROM jobhost.claim_new_keys($1, $2, $3, attach => true)")
            .bind(vec!["once"; keys.len()])
            .bind(&keys)
            .bind(vec![false; keys.len()])
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert_eq!(claimants.len(), 1_000);
    let seq_scans: i64 = sqlx::query_scalar(scans).fetch_one(&mut *tx).await.unwrap();
    assert_eq!(seq_scans, 0, "claim_new_keys: the claims read by index");
    tx.rollback().await.unwrap();

    let mut tx = db.pool().begin().await.unwrap();
    let jobs: Vec<serde_json::Value> = keys.iter().map(|k| json!({"job": "once", "payload": {"key": k}})).collect();
    let duplicates: Vec<bool> = sqlx::query_scalar("SELECT duplicate FROM jobhost.enqueue_many($1) ORDER BY ord")
        .bind(sqlx::types::Json(jobs))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(duplicates.iter().filter(|d| **d).count(), 500, "the held half answered as duplicates");
    let seq_scans: i64 = sqlx::query_scalar(scans).fetch_one(&mut *tx).await.unwrap();
    assert_eq!(seq_scans, 0, "enqueue_many: the claims read by index");
    tx.commit().await.unwrap();
    assert_eq!(claims(&db).await, 20_500);
}
