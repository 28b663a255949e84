//! The embedded backend's file under operator reads: `stats` and `jobs`
//! read indexes and the rows they list, not every archived payload; and the
//! write-ahead log is cut back after a long read let it grow.

mod common;

use jobhost::store::sqlite::{SqliteStore, WAL_SIZE_LIMIT};
use jobhost::store::{EnqueueParams, JobFilter, JobState, Store};
use serde_json::json;

use common::db::TestDb;
use common::job_config;

/// Tests here measure this process's reads and the log's size: one at a time.
static MEASURED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Bytes this process has read through system calls so far (Linux `rchar`):
/// SQLite reads its file with `read`/`pread`, so this counts the pages a
/// query touched beyond its own connection's cache.
fn bytes_read() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("read /proc/self/io");
    io.lines().find_map(|line| line.strip_prefix("rchar: ")).and_then(|n| n.trim().parse().ok()).expect("an rchar line")
}

/// Archived jobs 1001, 1002, … of `size` bytes of payload each, written as an operator would.
async fn archive_large_jobs(db: &TestDb, count: usize, size: usize) {
    db.execute(format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count})
         INSERT INTO archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, output,
                              enqueued_at, started_at, finished_at)
         SELECT 1000 + i, CASE WHEN i % 2 = 0 THEN 'mail' ELSE 'sms' END, 'default', 0,
                json_object('blob', hex(randomblob({half}))),
                CASE WHEN i % 3 = 0 THEN 'failed' ELSE 'completed' END, 1, 1,
                '[]', '{{\"sent\": true}}', i, i, i
         FROM n",
        half = size / 2
    ))
    .await;
}

/// Available jobs of `size` bytes of payload each, written as an operator would.
async fn queue_large_jobs(db: &TestDb, count: usize, size: usize) {
    db.execute(format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count})
         INSERT INTO jobs (job, queue, priority, payload, state, max_attempts, run_at, enqueued_at)
         SELECT 'mail', 'default', 0, json_object('blob', hex(randomblob({half}))), 'available', 1, i, i
         FROM n",
        half = size / 2
    ))
    .await;
}

/// With 200 archived and 100 available jobs of 100 KB (30 MB of payloads),
/// `stats` and listings (whole, by state, by job type) read under a tenth of
/// that: they never walk the payload of a row they do not show. The old
/// queries read the state of every row, which is stored after its payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_reads_skip_the_payloads_of_rows_they_do_not_show() {
    let _one_at_a_time = MEASURED.lock().await;
    let db = TestDb::sqlite().await;
    let size = 100_000;
    archive_large_jobs(&db, 200, size).await;
    queue_large_jobs(&db, 100, size).await;
    let budget = (300 * size / 10) as u64;

    let before = bytes_read();
    let stats = db.store.job_stats().await.unwrap();
    let read = bytes_read() - before;
    assert_eq!(
        (stats.states[&JobState::Completed], stats.states[&JobState::Failed], stats.states[&JobState::Available]),
        (134, 66, 100)
    );
    assert!(read < budget, "stats read {read} bytes");

    for filter in [
        JobFilter { limit: 10, ..JobFilter::default() },
        JobFilter { state: Some(JobState::Failed), limit: 10, ..JobFilter::default() },
        JobFilter { state: Some(JobState::Available), limit: 10, ..JobFilter::default() },
        JobFilter { state: Some(JobState::Running), limit: 10, ..JobFilter::default() },
        JobFilter { job: Some("sms".into()), limit: 10, ..JobFilter::default() },
    ] {
        let before = bytes_read();
        let rows = db.store.job_list(&filter).await.unwrap();
        let read = bytes_read() - before;
        assert!(read < budget, "{filter:?} read {read} bytes");
        let expected = if filter.state == Some(JobState::Running) { 0 } else { 10 };
        assert_eq!(rows.len(), expected, "{filter:?}");
        assert!(rows.windows(2).all(|w| w[0].id > w[1].id), "newest first");
        assert!(rows.iter().all(|r| filter.state.is_none_or(|s| r.state == s)), "{filter:?}");
        assert!(rows.iter().all(|r| filter.job.as_ref().is_none_or(|j| &r.job == j)), "{filter:?}");
        if let Some(completed) = rows.iter().find(|r| r.state == JobState::Completed) {
            let detail = db.store.job_get(completed.id).await.unwrap().unwrap();
            assert_eq!(
                detail.output,
                Some(json!({"sent": true})),
                "a job's output comes with the job, not the listing"
            );
        }
    }
}

/// Listings still merge live, blocked and archived jobs, newest first, and
/// filter by state and job type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_merge_every_table_newest_first() {
    let db = TestDb::sqlite().await;
    db.store.job_types_register(&[(job_config("mail"), "d".into()), (job_config("sms"), "d".into())]).await.unwrap();
    archive_large_jobs(&db, 3, 10).await;
    let live = db
        .store
        .job_enqueue(&[
            EnqueueParams::new("mail", json!({})),
            EnqueueParams { delay_ms: Some(3_600_000), ..EnqueueParams::new("sms", json!({})) },
        ])
        .await
        .unwrap();
    // New jobs take ids after every id already stored, the archive's too.
    assert!(live[0] > 1003 && live[1] > live[0], "{live:?}");
    let all = db.store.job_list(&JobFilter { limit: 100, ..JobFilter::default() }).await.unwrap();
    let ids: Vec<i64> = all.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![live[1], live[0], 1003, 1002, 1001]);
    let states: Vec<JobState> = all.iter().map(|r| r.state).collect();
    use JobState::*;
    assert_eq!(states, vec![Scheduled, Available, Failed, Completed, Completed]);
    let limited = db.store.job_list(&JobFilter { limit: 4, ..JobFilter::default() }).await.unwrap();
    assert_eq!(limited.iter().map(|r| r.id).collect::<Vec<_>>(), vec![live[1], live[0], 1003, 1002]);
    let sms = JobFilter { job: Some("sms".into()), limit: 100, ..JobFilter::default() };
    let sms: Vec<i64> = db.store.job_list(&sms).await.unwrap().iter().map(|r| r.id).collect();
    assert_eq!(sms, vec![live[1], 1003, 1001]);
    let scheduled = JobFilter { state: Some(Scheduled), limit: 100, ..JobFilter::default() };
    let scheduled: Vec<i64> = db.store.job_list(&scheduled).await.unwrap().iter().map(|r| r.id).collect();
    assert_eq!(scheduled, vec![live[1]]);
}

/// A burst of writes beside a long read grows the log past the limit (the
/// read pins its start); once the read ends, later commits checkpoint it and
/// cut the file back under the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_cut_back_after_a_long_read_ends() {
    let _one_at_a_time = MEASURED.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobhost.db");
    let sqlite = SqliteStore::open(&format!("sqlite://{}", file.display()), 2).await.unwrap();
    let pool = sqlite.pool().clone();
    let store = Store::new(sqlite);
    store.schema_migrate().await.unwrap();
    store.job_types_register(&[(job_config("mail"), "d".into())]).await.unwrap();
    let limit: i64 = sqlx::query_scalar("PRAGMA journal_size_limit").fetch_one(&pool).await.unwrap();
    assert_eq!(limit as u64, WAL_SIZE_LIMIT);
    let checkpoint: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint").fetch_one(&pool).await.unwrap();
    assert!(checkpoint > 0, "checkpoints are on");

    let wal = dir.path().join("jobhost.db-wal");
    let wal_size = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    let payload = json!({ "blob": "x".repeat(100_000) });
    let burst = |n: usize| vec![EnqueueParams::new("mail", payload.clone()); n];

    let mut long_read = pool.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&mut *long_read).await.unwrap();
    while wal_size() <= WAL_SIZE_LIMIT + (4 << 20) {
        store.job_enqueue(&burst(10)).await.unwrap();
    }
    long_read.rollback().await.unwrap();

    // Each commit checkpoints a log past its threshold; the first commit of
    // the log's next round cuts the file back. A few small writes suffice.
    for _ in 0..10 {
        if wal_size() <= WAL_SIZE_LIMIT {
            break;
        }
        store.job_enqueue(&burst(1)).await.unwrap();
    }
    assert!(wal_size() <= WAL_SIZE_LIMIT, "the log is still {} bytes", wal_size());
}
