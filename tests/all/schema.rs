//! The schema a fresh database ends with is kept in the repository, one
//! file per backend (`src/store/postgres/schema.sql`, every table, index,
//! trigger and function body as `pg_dump` prints them;
//! `src/store/sqlite/schema.sql`). A migration that changes a table or a
//! function changes that file in the same commit, so review reads the
//! change as a diff of the current definition, not as a new copy in a
//! migration. This suite fails when the file and the migrations disagree,
//! and when upgrading from the schema before the newest migration ends
//! anywhere else than a fresh database does.
//!
//! After changing a migration: `JOBHOST_WRITE_SCHEMA=1 cargo test --test
//! all schema::` rewrites the files; review their diff.

use crate::common;

use std::path::{Path, PathBuf};

use common::db::TestDb;

/// The kept file, from the repository's root.
fn kept(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Compares `dumped` with the kept file, or rewrites it when asked to.
fn agrees_with_kept(dumped: &str, path: &str) {
    let kept = kept(path);
    if std::env::var_os("JOBHOST_WRITE_SCHEMA").is_some() {
        std::fs::write(&kept, dumped).expect("write the kept schema");
        return;
    }
    let text = std::fs::read_to_string(&kept).unwrap_or_default();
    if text != dumped {
        let fresh = Path::new(env!("CARGO_TARGET_TMPDIR")).join(path.replace('/', "-"));
        std::fs::write(&fresh, dumped).expect("write the migrated schema");
        let first = text.lines().zip(dumped.lines()).position(|(a, b)| a != b);
        panic!(
            "{path} is not the schema migrating a fresh database produces (first difference at line {}): \
             diff it against {}, or run `JOBHOST_WRITE_SCHEMA=1 cargo test --test all schema::` and review the diff",
            first.map_or_else(|| "the end".to_string(), |n| (n + 1).to_string()),
            fresh.display()
        );
    }
}

/// The `jobhost` schema of the database at `url` as `pg_dump` prints it,
/// less the lines that name the dump's versions or its session's token.
fn pg_schema(url: &str) -> String {
    let dumped = std::process::Command::new("pg_dump")
        .args(["--schema-only", "--no-owner", "--no-privileges", "--schema=jobhost", "--dbname", url])
        .output()
        .expect("run pg_dump (it comes with PostgreSQL's client)");
    assert!(dumped.status.success(), "pg_dump: {}", String::from_utf8_lossy(&dumped.stderr));
    String::from_utf8(dumped.stdout)
        .expect("a UTF-8 dump")
        .lines()
        .filter(|line| {
            let noise = ["-- Dumped from", "-- Dumped by", "\\restrict", "\\unrestrict"];
            !noise.iter().any(|start| line.starts_with(start))
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

/// The newest PostgreSQL migration's version.
fn newest_postgres_migration() -> i64 {
    std::fs::read_dir(kept("migrations/postgres"))
        .expect("the migrations folder")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.split('_').next()?.parse().ok())
        .max()
        .expect("a migration")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_schema_is_the_one_kept_and_an_upgrade_ends_there_too() {
    let fresh = TestDb::postgres().await;
    let version = fresh.texts("SHOW server_version_num").await.remove(0);
    assert!(
        version.starts_with("15"),
        "the kept schema is PostgreSQL 15's dump (scripts/postgres.sh); this server is {version}"
    );
    let dumped = pg_schema(&fresh.url);
    assert!(dumped.contains("CREATE FUNCTION jobhost.finish_runs"), "functions are in the dump");
    agrees_with_kept(&dumped, "src/store/postgres/schema.sql");
    let upgraded = TestDb::postgres_at(newest_postgres_migration() - 1).await;
    upgraded.store.schema_migrate().await.unwrap();
    assert!(pg_schema(&upgraded.url) == dumped, "upgrading from the schema before the newest migration ends elsewhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_schema_is_the_one_kept() {
    let fresh = TestDb::sqlite().await;
    let definitions = fresh
        .texts(
            "SELECT sql FROM sqlite_master
             WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations'
             ORDER BY type, name",
        )
        .await;
    let dumped: String = definitions.iter().map(|sql| format!("{sql};\n\n")).collect();
    agrees_with_kept(&dumped, "src/store/sqlite/schema.sql");
}

/// Every file in `src/store/postgres/functions/` is one the hosts apply,
/// and the generation names the files as they are: a change to any of them
/// without the next generation fails here, so an older host can never put
/// a newer body back.
#[test]
fn the_functions_generation_stands_for_their_files() {
    use jobhost::store::postgres::functions::{GENERATION, SOURCES, sources_digest};
    let mut files: Vec<String> = std::fs::read_dir(kept("src/store/postgres/functions"))
        .expect("the functions folder")
        .filter_map(|entry| Some(entry.ok()?.file_name().to_str()?.strip_suffix(".sql")?.to_string()))
        .collect();
    files.sort();
    let listed: Vec<&str> = SOURCES.iter().map(|(name, _)| *name).collect();
    assert_eq!(files, listed, "SOURCES in src/store/postgres/functions.rs lists every file, in name order");
    assert!(
        sources_digest() == GENERATION.1,
        "the function files changed: set GENERATION in src/store/postgres/functions.rs to ({}, \"{}\")",
        GENERATION.0 + 1,
        sources_digest()
    );
}

/// A host applies a function file whose content the database has not
/// recorded, putting its body back whatever was there; it leaves one that
/// a later generation applied, so a host of the previous version started
/// beside a newer one never puts the older body back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_function_is_applied_from_its_file_and_a_newer_generation_is_left_alone() {
    let db = TestDb::postgres().await;
    let body = || async { db.texts("SELECT prosrc FROM pg_proc WHERE proname = 'render_key'").await.remove(0) };
    let original = body().await;
    let stand_in = "CREATE OR REPLACE FUNCTION jobhost.render_key(template text, payload jsonb) RETURNS text
                    LANGUAGE sql IMMUTABLE AS $$ SELECT 'stand-in' $$";
    db.execute(stand_in).await;
    // Recorded by a later generation: left alone.
    db.execute(
        "UPDATE jobhost.function_sources SET sha256 = 'newer', generation = generation + 1 WHERE name = 'render_key'",
    )
    .await;
    db.store.schema_migrate().await.unwrap();
    assert!(body().await.contains("'stand-in'"), "a newer generation's body stays");
    // Recorded by this generation or an older one with other content: applied.
    db.execute("UPDATE jobhost.function_sources SET sha256 = 'older', generation = 0 WHERE name = 'render_key'").await;
    db.store.schema_migrate().await.unwrap();
    assert_eq!(body().await, original, "the file's body is back");
    let recorded = db.texts("SELECT sha256 FROM jobhost.function_sources WHERE name = 'render_key'").await;
    assert_ne!(recorded[0], "older", "and recorded");
}

/// A migration that names function files in its header (`-- functions:`)
/// runs with those files applied first, in its own transaction: it sees
/// the bodies as the files have them, and when it fails, the bodies and
/// what `function_sources` records roll back with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_runs_with_the_functions_it_names_and_they_roll_back_with_it() {
    use jobhost::store::postgres::{PgStore, carried_migrations};
    use sqlx::SqlSafeStr;
    use sqlx::migrate::{Migration, MigrationType, Migrator};
    let db = TestDb::postgres().await;
    let body = || async { db.texts("SELECT prosrc FROM pg_proc WHERE proname = 'render_key'").await.remove(0) };
    let recorded = || async { db.texts("SELECT sha256 FROM jobhost.function_sources WHERE name = 'render_key'").await };
    let original = body().await;
    db.execute(
        "CREATE OR REPLACE FUNCTION jobhost.render_key(template text, payload jsonb) RETURNS text
         LANGUAGE sql IMMUTABLE AS $$ SELECT 'stand-in' $$",
    )
    .await;
    db.execute("UPDATE jobhost.function_sources SET sha256 = 'older' WHERE name = 'render_key'").await;
    // The migration fails if it runs before the file's body is back.
    let needs_the_file = "-- A migration of a later release.\n-- functions: render_key\n\
        DO $$ BEGIN
            IF jobhost.render_key('a-{x}', '{\"x\": 7}') = 'stand-in' THEN
                RAISE EXCEPTION 'ran before render_key''s file was applied';
            END IF;
        END $$;\n";
    let next = newest_postgres_migration() + 1;
    let with = |later: &[String]| {
        let mut migrations: Vec<Migration> = carried_migrations().iter().cloned().collect();
        for (version, sql) in (next..).zip(later) {
            let sql = sqlx::AssertSqlSafe(sql.clone()).into_sql_str();
            migrations.push(Migration::new(version, "later".into(), MigrationType::Simple, sql, false));
        }
        Migrator::with_migrations(migrations)
    };
    let store = PgStore::connect(&db.url, 2).await.unwrap();
    let applied = || async {
        db.texts(format!("SELECT count(*)::text FROM jobhost._sqlx_migrations WHERE version = {next}")).await
    };

    let failing = with(&[format!("{needs_the_file}SELECT 1 / 0;")]);
    let error = store.schema_migrate_by(&failing).await.unwrap_err();
    assert!(error.to_string().contains("division by zero"), "{error}");
    assert!(body().await.contains("'stand-in'"), "the body rolled back with the migration");
    assert_eq!(recorded().await, ["older"], "and what is recorded");
    assert_eq!(applied().await, ["0"]);

    store.schema_migrate_by(&with(&[needs_the_file.to_string()])).await.unwrap();
    assert_eq!(body().await, original, "the file's body, in place before the migration ran");
    assert_ne!(recorded().await, ["older"], "recorded in the migration's transaction");
    assert_eq!(applied().await, ["1"]);

    let naming_none = with(&[needs_the_file.to_string(), "-- functions: no_such_function\nSELECT 1;".to_string()]);
    let error = store.schema_migrate_by(&naming_none).await.unwrap_err();
    assert!(error.to_string().contains("no_such_function"), "{error}");
}

/// Applying the function files waits out a lock on a function (an
/// operator's `CREATE OR REPLACE` in a transaction left open) by giving up
/// and trying again, never failing, and never holding a lock the fleet's
/// statements would queue behind meanwhile; once that transaction ends,
/// the file's body is put back over what it committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_the_functions_waits_out_a_function_locked_by_another_transaction() {
    let db = TestDb::postgres().await;
    let body = || async { db.texts("SELECT prosrc FROM pg_proc WHERE proname = 'render_key'").await.remove(0) };
    let original = body().await;
    db.execute("UPDATE jobhost.function_sources SET sha256 = 'older' WHERE name = 'render_key'").await;
    let mut operator = db.pool().begin().await.unwrap();
    sqlx::query(
        "CREATE OR REPLACE FUNCTION jobhost.render_key(template text, payload jsonb) RETURNS text
         LANGUAGE sql IMMUTABLE AS $$ SELECT 'hotfix' $$",
    )
    .execute(&mut *operator)
    .await
    .unwrap();
    let migrating = tokio::spawn({
        let store = db.store.clone();
        async move { store.schema_migrate().await }
    });
    // The pass reaches the locked function and waits on it (briefly, then
    // again: its lock timeout is short).
    let waiting = "SELECT count(*)::text FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%render_key%'";
    while db.texts(waiting).await != ["1"] {
        assert!(!migrating.is_finished(), "the pass ended while the function was locked: {:?}", migrating.await);
        tokio::task::yield_now().await;
    }
    // A caller of the function is not held meanwhile.
    let rendered = db.texts("SELECT jobhost.render_key('k-{x}', '{\"x\": 1}')").await;
    assert_ne!(rendered, ["hotfix"], "the operator's body is not committed yet");
    operator.commit().await.unwrap();
    migrating.await.unwrap().expect("the pass finished once the lock was gone");
    assert_eq!(body().await, original, "the file's body over the operator's");
}

/// PostgreSQL's answer to a function another transaction replaced while
/// this one waited for it is what the function pass and the migrator try
/// again on, whether a statement met it or a migration did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_replaced_meanwhile_is_told_apart_from_other_errors() {
    use jobhost::store::Error;
    use sqlx::migrate::MigrateError;
    let db = TestDb::postgres().await;
    let replace = |body: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION jobhost.render_key(template text, payload jsonb) RETURNS text
             LANGUAGE sql IMMUTABLE AS $$ SELECT '{body}' $$"
        )
    };
    let mut first = db.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(replace("first"))).execute(&mut *first).await.unwrap();
    let second = tokio::spawn({
        let pool = db.pool().clone();
        let sql = replace("second");
        async move { sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await }
    });
    let waiting = "SELECT count(*)::text FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%''second''%'";
    while db.texts(waiting).await != ["1"] {
        tokio::task::yield_now().await;
    }
    first.commit().await.unwrap();
    let met = Error::from(second.await.unwrap().expect_err("the second replacement fails once the first commits"));
    assert!(met.is_concurrent_definition(), "{met}");
    assert!(!met.is_lock_timeout());
    let Error::Database(inner) = met else { unreachable!() };
    let in_a_migration = Error::from(MigrateError::ExecuteMigration(inner, 49));
    assert!(in_a_migration.is_concurrent_definition(), "{in_a_migration}");
    let refused = Error::from(sqlx::query("SELECT 1 / 0").execute(db.pool()).await.unwrap_err());
    assert!(!refused.is_concurrent_definition(), "{refused}");
}
