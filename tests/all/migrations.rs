//! A migration must not stop a running fleet (issue 32, item 7). Every
//! PostgreSQL migration is applied, one at a time, to a database holding a
//! fleet's rows (a million archived jobs, a backlog, running jobs) while
//! four hosts renew their leases as fast as a busy fleet does, and an
//! application's transaction that read `jobs` is open as it starts; no
//! renewal may wait behind a migration's lock for longer than a moment. A renewal
//! that waits past the fence margin stops every guest of every host, and
//! before, migration 0009 held `jobs` while it indexed the whole archive.
//! Last, every function file is applied again the same way.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jobhost::store::postgres::PgStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use common::db::TestDb;

/// The longest a renewal may wait for a lock a migration holds.
const LONGEST_WAIT_MS: f64 = 100.0;
const HOSTS: usize = 4;
const ARCHIVED: i64 = 1_000_000;
const BACKLOG: i64 = 200_000;
const RUNNING: i64 = 200;
/// How long an application's transaction reading `jobs` stays open.
const APPLICATION_HOLDS: Duration = Duration::from_millis(400);

/// Stands for the pass that applies the function files, among versions.
const FUNCTIONS: i64 = i64::MAX;

fn step_name(version: i64) -> String {
    if version == FUNCTIONS { "the functions".to_string() } else { format!("migration {version:>4}") }
}

/// The rows of a fleet that has run for a while, written in the first
/// migration's columns (every later one keeps them).
async fn fill_as_a_fleet_would(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts,
                                      enqueued_at, finished_at, concurrency_key, batch_id)
         SELECT g, 'work', 'default', 0, jsonb_build_object('i', g), 'completed', 1, 3, now(), now(),
                'k' || (g % 100), CASE WHEN g % 3 = 0 THEN g % 1000 END
         FROM generate_series(1, $1::bigint) g",
    )
    .bind(ARCHIVED)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO jobhost.jobs (id, job, queue, payload, state, attempt, max_attempts, concurrency_key, batch_id)
         SELECT $1 + g, 'work', 'default', jsonb_build_object('i', g), 'available', 0, 3,
                'k' || (g % 100), CASE WHEN g % 3 = 0 THEN g % 1000 END
         FROM generate_series(1, $2::bigint) g",
    )
    .bind(ARCHIVED)
    .bind(BACKLOG)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO jobhost.jobs (id, job, queue, payload, state, attempt, max_attempts, lease_token, lease_secs,
                                   lease_expires_at, host_id, started_at)
         SELECT $1 + g, 'work', 'default', '{}', 'running', 1, 3, g, 30, now() + interval '30 seconds',
                'host-' || (g % $2), now()
         FROM generate_series(1, $3::bigint) g",
    )
    .bind(ARCHIVED + BACKLOG)
    .bind(HOSTS as i64)
    .bind(RUNNING)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE").execute(pool).await.unwrap();
}

/// A host's heartbeat, in a statement every schema version runs: each host
/// renews its running jobs' leases, over and over, until `stop`.
async fn renew_until(options: PgConnectOptions, host: String, stop: Arc<AtomicBool>) -> u64 {
    let mut conn = options.application_name("renewer").connect().await.expect("connect a renewer");
    let mut renewals = 0;
    while !stop.load(Ordering::Relaxed) {
        sqlx::query(
            "UPDATE jobhost.jobs SET lease_expires_at = now() + interval '30 seconds'
             WHERE host_id = $1 AND state = 'running'",
        )
        .bind(&host)
        .execute(&mut conn)
        .await
        .expect("a renewal");
        renewals += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    renewals
}

/// The longest any renewal of this database has been waiting for a lock,
/// in milliseconds, now. Server-side, by its clock: the machine's load
/// slows renewals but never shows here.
async fn longest_lock_wait_ms(pool: &PgPool) -> f64 {
    sqlx::query_scalar(
        "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start) * 1000), 0)::float8
         FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'renewer' AND wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_migration_runs_under_a_renewing_fleet_without_stopping_it() {
    let db = TestDb::postgres_at(1).await;
    let pool = db.pool().clone();
    fill_as_a_fleet_would(&pool).await;
    let store = PgStore::connect(&db.url, 2).await.unwrap();
    let options: PgConnectOptions = db.url.parse().unwrap();
    // The newest migration's version, from the files' names (`NNNN_name.sql`).
    let latest = std::fs::read_dir("migrations/postgres")
        .unwrap()
        .filter_map(|entry| entry.unwrap().file_name().to_string_lossy().split('_').next()?.parse::<i64>().ok())
        .max()
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let renewers: Vec<_> = (0..HOSTS)
        .map(|host| tokio::spawn(renew_until(options.clone(), format!("host-{host}"), stop.clone())))
        .collect();
    let sampler_pool = PgPoolOptions::new().max_connections(1).connect_with(options.clone()).await.unwrap();
    let mut waits: BTreeMap<i64, (f64, Duration)> = BTreeMap::new();
    // Then, with every function file's record removed, the pass that
    // applies them all again (`None`).
    for step in (2..=latest).map(Some).chain([None]) {
        if step.is_none() {
            sqlx::query("DELETE FROM jobhost.function_sources").execute(&pool).await.unwrap();
        }
        let version = step.unwrap_or(FUNCTIONS);
        // An application's transaction that has read the jobs table is open
        // as each migration starts: a migration that queued behind it for a
        // lock the fleet's renewals conflict with would hold them as long.
        let (reading, read) = tokio::sync::oneshot::channel();
        let application = tokio::spawn({
            let pool = pool.clone();
            async move {
                let mut transaction = pool.begin().await.unwrap();
                sqlx::query("SELECT count(*) FROM jobhost.jobs WHERE id = 1").execute(&mut *transaction).await.unwrap();
                reading.send(()).unwrap();
                tokio::time::sleep(APPLICATION_HOLDS).await;
                transaction.commit().await.unwrap();
            }
        });
        read.await.unwrap();
        let started = tokio::time::Instant::now();
        let migrating = store.schema_migrate_to(step);
        tokio::pin!(migrating);
        let mut longest: f64 = 0.0;
        loop {
            tokio::select! {
                migrated = &mut migrating => {
                    migrated.unwrap_or_else(|e| panic!("migration {version}: {e}"));
                    break;
                }
                () = tokio::time::sleep(Duration::from_millis(10)) => {
                    longest = longest.max(longest_lock_wait_ms(&sampler_pool).await);
                }
            }
        }
        longest = longest.max(longest_lock_wait_ms(&sampler_pool).await);
        waits.insert(version, (longest, started.elapsed()));
        application.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for renewer in renewers {
        assert!(renewer.await.unwrap() > 0, "each host renewed throughout");
    }

    for (version, (longest, took)) in &waits {
        eprintln!("{:>14}: applied in {took:>10.1?}, longest renewal wait {longest:6.1} ms", step_name(*version));
    }
    for (version, (longest, _)) in &waits {
        assert!(
            *longest < LONGEST_WAIT_MS,
            "{} held a renewal for {longest:.1} ms, more than {LONGEST_WAIT_MS} ms",
            step_name(*version)
        );
    }
    // The indexes built concurrently are there and valid, as on a database
    // migrated in one go.
    let invalid: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'jobhost' AND NOT i.indisvalid",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(invalid, 0);
    for index in ["jobs_holders", "jobs_batch", "blocked_jobs_batch", "archive_batch"] {
        let found: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_class WHERE relname = $1")
            .bind(index)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(found, 1, "index {index}");
    }
    let fresh = TestDb::postgres().await;
    let recorded = "SELECT version, checksum FROM jobhost._sqlx_migrations ORDER BY version";
    let here: Vec<(i64, Vec<u8>)> = sqlx::query_as(recorded).fetch_all(&pool).await.unwrap();
    let there: Vec<(i64, Vec<u8>)> = sqlx::query_as(recorded).fetch_all(fresh.pool()).await.unwrap();
    assert_eq!(here, there, "recorded as applied, with the files' own checksums");
    let functions = "SELECT name, sha256 FROM jobhost.function_sources ORDER BY name";
    let here: Vec<(String, String)> = sqlx::query_as(functions).fetch_all(&pool).await.unwrap();
    let there: Vec<(String, String)> = sqlx::query_as(functions).fetch_all(fresh.pool()).await.unwrap();
    assert_eq!(here, there, "every function file applied again and recorded");
}

/// The helpers a fetch and a result write call once per statement are
/// PL/pgSQL, whose plans last the session: as SQL functions with a
/// subquery, PostgreSQL planned their bodies afresh for every statement
/// (over a quarter of a serial-shape write's server time, BENCHMARKS.md
/// "Helpers planned once per session"). `unpaused` keeps its answers, NULL
/// elements and a NULL list included.
#[tokio::test]
async fn the_hot_paths_helpers_keep_their_plans_and_their_answers() {
    let db = TestDb::postgres().await;
    // One connection, so the calls below share one session's plan cache.
    let pool = &PgPoolOptions::new().max_connections(1).connect(&db.url).await.unwrap();
    let helpers: Vec<(String, String, Option<Vec<String>>)> = sqlx::query_as(
        "SELECT p.proname::text, l.lanname::text, p.proconfig FROM pg_proc p
         JOIN pg_language l ON l.oid = p.prolang JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'jobhost' AND p.proname IN ('unpaused', 'rate_governed', 'fetch_ahead')
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let languages: Vec<(&str, &str)> = helpers.iter().map(|(name, lang, _)| (name.as_str(), lang.as_str())).collect();
    assert_eq!(languages, [("fetch_ahead", "plpgsql"), ("rate_governed", "plpgsql"), ("unpaused", "plpgsql")]);
    let settings =
        |name: &str| helpers.iter().find(|(n, ..)| n == name).and_then(|(.., c)| c.clone()).unwrap_or_default();
    assert_eq!(settings("fetch_ahead"), ["enable_sort=off"], "the scan still follows the fetch's index order");
    assert_eq!(settings("unpaused"), ["plan_cache_mode=force_generic_plan"]);

    sqlx::query("INSERT INTO jobhost.queue_pauses (name) VALUES ('paused')").execute(pool).await.unwrap();
    let unpaused = |queues: Option<Vec<Option<&'static str>>>| async move {
        sqlx::query_scalar::<_, Vec<Option<String>>>("SELECT jobhost.unpaused($1)")
            .bind(queues)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    let owned = |queues: &[Option<&str>]| queues.iter().map(|q| q.map(str::to_string)).collect::<Vec<_>>();
    assert_eq!(
        unpaused(Some(vec![Some("default"), Some("paused"), None, Some("mail")])).await,
        owned(&[Some("default"), None, Some("mail")])
    );
    assert_eq!(unpaused(Some(vec![Some("paused")])).await, owned(&[]));
    assert_eq!(unpaused(Some(vec![])).await, owned(&[]));
    assert_eq!(unpaused(None).await, owned(&[]), "no queues, not NULL");
    // Past the plan cache's first five calls, when a generic plan takes over.
    for _ in 0..8 {
        assert_eq!(unpaused(Some(vec![Some("default"), Some("paused")])).await, owned(&[Some("default")]));
    }
}
