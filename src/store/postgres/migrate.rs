//! Migrations applied while a fleet runs on the database. A migration that
//! takes a lock on a table the fleet writes every moment (`jobs`, the
//! archive, `blocked_jobs`) must hold it for no longer than a moment:
//! renewals wait behind it, and a renewal that waits past the fence margin
//! stops every guest of every host (guarantee 6).
//!
//! So each migration runs on a session whose `lock_timeout` is short
//! ([`LOCK_WAIT`]): one that would queue behind a long transaction (an
//! application's, a backup's) gives up at once, letting the fleet through,
//! and is tried again a moment later. An index on a table that existed
//! before the migration is built `CONCURRENTLY`, outside any transaction,
//! which blocks no writer: a new migration does it itself (a
//! `-- no-transaction` file holding that one statement); the migrations
//! written before this rule ([`ONLINE_INDEXES`]) have their `CREATE INDEX`
//! built that way first and run without it. Hosts migrating at once take
//! turns through an advisory lock, polled so that no waiting session holds
//! a snapshot an index build would wait for.

use std::time::Duration;

use sqlx::migrate::{Migrate, MigrateError, Migration, Migrator};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, SqlSafeStr};

use crate::store::{Error, Result};

/// How long a migration's statement may wait for a lock before it gives
/// up and the migration is tried again, the fleet's statements let through
/// meanwhile: a renewal never waits behind a migration longer than this.
const LOCK_WAIT: &str = "20ms";

/// How long migrating keeps trying when a lock stays taken (a transaction
/// left open for minutes): then it fails, saying so.
const GIVE_UP_AFTER: Duration = Duration::from_secs(300);

/// The advisory lock hosts migrating at once take turns through ("jobhost" in ASCII).
const MIGRATING: i64 = 0x006a_6f62_686f_7374;

/// `CREATE INDEX` statements of migrations written before indexes were built
/// `CONCURRENTLY`, on tables that existed before them, exactly as each
/// migration has it: built concurrently before the rest of their migration,
/// which then runs without them. (Applied migrations are never edited: the
/// checksum a database records stays the file's.)
const ONLINE_INDEXES: &[(i64, &str, &str)] = &[
    (
        4,
        "jobs_holders",
        "CREATE INDEX jobs_holders ON jobhost.jobs (job, concurrency_key)\n    \
         WHERE concurrency_key IS NOT NULL AND state IN ('available', 'running');",
    ),
    (9, "jobs_batch", "CREATE INDEX jobs_batch ON jobhost.jobs (batch_id) WHERE batch_id IS NOT NULL;"),
    (
        9,
        "blocked_jobs_batch",
        "CREATE INDEX blocked_jobs_batch ON jobhost.blocked_jobs (batch_id) WHERE batch_id IS NOT NULL;",
    ),
    (9, "archive_batch", "CREATE INDEX archive_batch ON jobhost.archive (batch_id) WHERE batch_id IS NOT NULL;"),
];

/// Applies the migrations `migrator` carries up to `target` (all of them
/// when `None`), one at a time, on a session of its own.
///
/// # Errors
/// A database ahead of this binary, a migration that fails, or locks that
/// stayed taken for [`GIVE_UP_AFTER`].
pub async fn run(options: &PgConnectOptions, migrator: &Migrator, target: Option<i64>) -> Result<()> {
    let options = options.clone().options([("search_path", "jobhost"), ("lock_timeout", LOCK_WAIT)]);
    let mut conn = options.connect().await?;
    let created = sqlx::query("CREATE SCHEMA IF NOT EXISTS jobhost").execute(&mut conn).await;
    if created.is_err() {
        // Another host created it at the same moment; anything else fails again here.
        sqlx::query("CREATE SCHEMA IF NOT EXISTS jobhost").execute(&mut conn).await?;
    }
    take_turn(&mut conn).await?;
    let mut migrated = migrate_holding_turn(&mut conn, migrator, target).await;
    // The functions' living files, once the schema is whole.
    if migrated.is_ok() && target.is_none() {
        migrated = super::functions::apply(&mut conn).await.map(|applied| {
            if applied > 0 {
                tracing::debug!(applied, "SQL functions applied from their files");
            }
        });
    }
    let released = sqlx::query("SELECT pg_advisory_unlock($1)").bind(MIGRATING).execute(&mut conn).await;
    let _ = conn.close().await;
    migrated?;
    released?;
    Ok(())
}

/// Waits for the migrating turn, asking without waiting inside the
/// database: a session blocked in `pg_advisory_lock` would hold a
/// transaction open that another host's concurrent index build waits for.
async fn take_turn(conn: &mut PgConnection) -> Result<()> {
    let mut waited = false;
    loop {
        let taken: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(MIGRATING).fetch_one(&mut *conn).await?;
        if taken {
            return Ok(());
        }
        if !waited {
            tracing::info!("another host is migrating the database; waiting for it");
            waited = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// sqlx's bookkeeping table, in the `jobhost` schema (the session's search
/// path): it records each applied migration's version and checksum.
const TABLE: &str = "_sqlx_migrations";

async fn migrate_holding_turn(conn: &mut PgConnection, migrator: &Migrator, target: Option<i64>) -> Result<()> {
    let applied = super::applied_migrations(conn).await?;
    crate::store::schema::check_known(&applied, migrator)?;
    // A database with no migration applied has no fleet on it: building
    // online is then a detail, not news for the operator.
    let fleet_may_run = !applied.is_empty();
    conn.ensure_migrations_table(TABLE).await?;
    if let Some(version) = conn.dirty_version(TABLE).await? {
        return Err(MigrateError::Dirty(version).into());
    }
    // An applied migration is never edited: a file that changed since is refused.
    for recorded in conn.list_applied_migrations(TABLE).await? {
        let carried = migrator.iter().find(|m| m.version == recorded.version && m.migration_type.is_up_migration());
        if carried.is_some_and(|m| m.checksum != recorded.checksum) {
            return Err(MigrateError::VersionMismatch(recorded.version).into());
        }
    }
    let pending = migrator
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .filter(|m| !applied.contains(&m.version) && target.is_none_or(|t| m.version <= t));
    for migration in pending {
        let version = migration.version;
        let indexes: Vec<_> = ONLINE_INDEXES.iter().filter(|(v, _, _)| *v == version).collect();
        for (_, name, statement) in &indexes {
            build_concurrently(conn, name, statement, fleet_may_run).await?;
        }
        let as_run = as_run(migration, &indexes)?;
        // A `-- no-transaction` migration builds an index concurrently,
        // and such a build waits for every older transaction: no timeout.
        let lock_wait = if migration.no_tx { "0" } else { LOCK_WAIT };
        set_lock_timeout(conn, lock_wait).await?;
        retrying(conn, as_run.as_ref().unwrap_or(migration)).await?;
        set_lock_timeout(conn, LOCK_WAIT).await?;
        if fleet_may_run && !indexes.is_empty() {
            tracing::info!(version, "applied a migration, its indexes built concurrently");
        }
    }
    Ok(())
}

/// The migration as it is run, when that is not as written: without the
/// [`ONLINE_INDEXES`] built before it, and preceded by the function files
/// its header names (`-- functions: NAME, ...`, [`super::functions`]), in
/// its own transaction. It is recorded with the file's own checksum, as if
/// applied as written. `None` when it runs as written.
fn as_run(migration: &Migration, indexes: &[&(i64, &str, &str)]) -> Result<Option<Migration>> {
    let version = migration.version;
    let refused = |why: String| -> Error { MigrateError::Source(format!("migration {version} {why}").into()).into() };
    let needs = super::functions::needed_by(migration.sql.as_str()).map_err(refused)?;
    if indexes.is_empty() && needs.is_empty() {
        return Ok(None);
    }
    if migration.no_tx && !needs.is_empty() {
        return Err(refused("names functions but runs outside a transaction (-- no-transaction)".into()));
    }
    let mut sql = migration.sql.as_str().to_string();
    for (_, name, statement) in indexes {
        if !sql.contains(statement) {
            return Err(refused(format!("no longer creates index {name} as jobhost expects")));
        }
        sql = sql.replace(statement, &format!("-- {name}: built concurrently before this migration"));
    }
    if !needs.is_empty() {
        sql = super::functions::for_migration(&needs) + &sql;
    }
    Ok(Some(Migration { sql: sqlx::AssertSqlSafe(sql).into_sql_str(), ..migration.clone() }))
}

/// Builds one of [`ONLINE_INDEXES`] concurrently, unless it is there and
/// valid; a build that failed half-way (it leaves an invalid index) is
/// dropped and done again.
async fn build_concurrently(conn: &mut PgConnection, name: &str, statement: &str, fleet_may_run: bool) -> Result<()> {
    let valid: Option<bool> = sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'jobhost' AND c.relname = $1",
    )
    .bind(name)
    .fetch_optional(&mut *conn)
    .await?;
    if valid == Some(true) {
        return Ok(());
    }
    // A concurrent build waits for every transaction older than it, which
    // blocks nobody: no timeout.
    set_lock_timeout(conn, "0").await?;
    if valid == Some(false) {
        let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS jobhost.{name}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop)).execute(&mut *conn).await?;
    }
    let concurrent = statement.replacen("CREATE INDEX", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1);
    if fleet_may_run {
        tracing::info!(index = name, "building an index concurrently; the fleet runs on meanwhile");
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(concurrent)).execute(&mut *conn).await?;
    set_lock_timeout(conn, LOCK_WAIT).await
}

async fn set_lock_timeout(conn: &mut PgConnection, wait: &str) -> Result<()> {
    sqlx::query("SELECT set_config('lock_timeout', $1, false)").bind(wait).execute(conn).await?;
    Ok(())
}

/// Applies one migration, again while it gives up on a lock (its table
/// busy with a longer transaction), a moment later each time, until
/// [`GIVE_UP_AFTER`].
async fn retrying(conn: &mut PgConnection, migration: &Migration) -> Result<()> {
    let version = migration.version;
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match conn.apply(TABLE, migration).await.map(|_| ()).map_err(Error::from) {
            // Or a function it applies (`-- functions:`) was replaced
            // meanwhile: its transaction rolled back whole, so it is tried
            // again as a whole.
            Err(error)
                if (error.is_lock_timeout() || (error.is_concurrent_definition() && !migration.no_tx))
                    && started.elapsed() < GIVE_UP_AFTER =>
            {
                tracing::warn!(version, %error, "a migration met another transaction's change; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(error) if error.is_lock_timeout() => {
                return Err(Error::MigrationBlocked { version, waited_secs: GIVE_UP_AFTER.as_secs() });
            }
            done => return done,
        }
    }
}
