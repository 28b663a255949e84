//! What the queue benchmarks share: a fresh database, `jobhost run`
//! processes as workers, and waiting on the database's own state.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use jobhost::store::Store;
use jobhost::store::driver::SchemaDriver;
use jobhost::store::postgres::PgStore;
use jobhost::store::sqlite::SqliteStore;
use sqlx::{PgPool, SqlitePool};

pub fn server() -> String {
    std::env::var("JOBHOST_BENCH_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

pub async fn fresh_db() -> (Arc<PgStore>, String) {
    fresh_db_named("jobhost_bench").await
}

/// [`fresh_db`] under another name, for a benchmark that needs two at once.
pub async fn fresh_db_named(name: &str) -> (Arc<PgStore>, String) {
    let admin = PgPool::connect(&format!("{}/postgres", server())).await.expect("PostgreSQL");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&admin).await.unwrap();
    let url = format!("{}/{name}", server());
    let store = Arc::new(PgStore::connect(&url, 8).await.unwrap());
    if !migrated_by_host_binary(&url) {
        store.schema_migrate().await.unwrap();
    }
    (store, url)
}

/// With `JOBHOST_BENCH_BIN`, that binary migrates the database (and this
/// build does not), so a build compared against this one runs on its own
/// schema: much of the queue is SQL functions the migrations define.
fn migrated_by_host_binary(url: &str) -> bool {
    if std::env::var_os("JOBHOST_BENCH_BIN").is_none() {
        return false;
    }
    let status = Command::new(host_binary()).arg("migrate").env("DATABASE_URL", url).stdout(Stdio::null()).status();
    assert!(status.expect("run jobhost migrate").success(), "jobhost migrate failed");
    true
}

/// How many job types are registered, on each backend, for `wait_for`.
pub const JOB_TYPES: (&str, &str) =
    ("SELECT count(*)::float8 FROM jobhost.job_types", "SELECT CAST(count(*) AS REAL) FROM job_types");

/// How many hosts have a row, on each backend, for `wait_for`.
pub const HOSTS: (&str, &str) =
    ("SELECT count(*)::float8 FROM jobhost.hosts", "SELECT CAST(count(*) AS REAL) FROM hosts");

pub fn start_host(url: &str, components: &Path, cache: &Path) -> Child {
    start_host_with(url, components, cache, &[])
}

/// The `jobhost` binary the benchmarks run: this build's, or the one
/// `JOBHOST_BENCH_BIN` names, to compare two builds with one benchmark.
pub fn host_binary() -> String {
    std::env::var("JOBHOST_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_jobhost").into())
}

/// A host at concurrency 10 (unless `flags` set it) with more flags of `jobhost run`, and those in
/// `JOBHOST_BENCH_HOST_FLAGS` (space-separated), for comparing settings.
pub fn start_host_with(url: &str, components: &Path, cache: &Path, flags: &[&str]) -> Child {
    let from_env = std::env::var("JOBHOST_BENCH_HOST_FLAGS").unwrap_or_default();
    let concurrency = if flags.contains(&"--concurrency") { &[][..] } else { &["--concurrency", "10"][..] };
    Command::new(host_binary())
        .args(["run", "--no-migrate"])
        .args(concurrency)
        .args(flags)
        .args(from_env.split_whitespace())
        .arg("--components")
        .arg(components)
        .arg("--cache-dir")
        .arg(cache)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start jobhost run")
}

pub fn stop(mut host: Child) {
    // SAFETY: kill(2) on a child this process started and has not reaped.
    unsafe { libc::kill(host.id() as libc::pid_t, libc::SIGTERM) };
    let _ = host.wait();
}

/// CPU seconds a process has used, user and system, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // SAFETY: sysconf reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / ticks
}

/// The value at quantile `p` of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A store the benchmark can run on either backend, with the raw handle
/// its measurements read the database's own timestamps through.
pub enum BenchDb {
    Postgres { store: Arc<PgStore>, url: String },
    Sqlite { store: Arc<SqliteStore>, url: String, _dir: tempfile::TempDir },
}

impl BenchDb {
    /// A fresh, migrated database: PostgreSQL's `jobhost_bench`, or a new
    /// SQLite file in a temporary directory (on the same disk as PostgreSQL's data).
    pub async fn fresh(sqlite: bool) -> BenchDb {
        BenchDb::fresh_named(sqlite, "jobhost_bench").await
    }

    /// A fresh database with the components in `components` registered by
    /// a host that then stops.
    pub async fn registered(sqlite: bool, components: &Path, cache: &Path) -> BenchDb {
        let db = BenchDb::fresh(sqlite).await;
        let probe = start_host(db.url(), components, cache);
        db.wait_for(JOB_TYPES.0, JOB_TYPES.1, 1.0).await;
        stop(probe);
        db
    }

    /// [`BenchDb::fresh`], PostgreSQL's under another name, for a benchmark
    /// that needs two at once.
    pub async fn fresh_named(sqlite: bool, name: &str) -> BenchDb {
        if !sqlite {
            let (store, url) = fresh_db_named(name).await;
            return BenchDb::Postgres { store, url };
        }
        let dir = tempfile::tempdir_in(std::env::var("JOBHOST_BENCH_SQLITE_DIR").unwrap_or_else(|_| "target".into()))
            .unwrap();
        let url = format!("sqlite://{}", dir.path().join("jobhost.db").display());
        let migrated = migrated_by_host_binary(&url);
        let store = Arc::new(SqliteStore::open(&url, 8).await.unwrap());
        if !migrated {
            store.schema_migrate().await.unwrap();
        }
        BenchDb::Sqlite { store, url, _dir: dir }
    }

    pub fn store(&self) -> Store {
        match self {
            BenchDb::Postgres { store, .. } => Store::shared(store.clone()),
            BenchDb::Sqlite { store, .. } => Store::shared(store.clone()),
        }
    }

    pub fn url(&self) -> &str {
        match self {
            BenchDb::Postgres { url, .. } | BenchDb::Sqlite { url, .. } => url,
        }
    }

    /// Rows of one float from the backend's spelling of a query.
    pub async fn floats(&self, postgres: &str, sqlite: &str) -> Vec<f64> {
        match self {
            BenchDb::Postgres { store, .. } => query_floats(store.pool(), postgres).await,
            BenchDb::Sqlite { store, .. } => query_floats_sqlite(store.pool(), sqlite).await,
        }
    }

    /// Plain enqueues of `hello` to an idle host, one at a time, each
    /// waited for: ms from each enqueue to its start by the database's
    /// clock, sorted.
    pub async fn plain_to_start(&self, jobs: usize) -> Vec<f64> {
        let store = self.store();
        for i in 0..jobs {
            let job = jobhost::store::EnqueueParams::new("hello", serde_json::json!({"name": format!("plain {i}")}));
            store.job_enqueue(&[job]).await.unwrap();
            self.wait_for(
                "SELECT count(*)::float8 FROM jobhost.archive WHERE payload ->> 'name' LIKE 'plain %'",
                "SELECT CAST(count(*) AS REAL) FROM archive WHERE payload ->> 'name' LIKE 'plain %'",
                (i + 1) as f64,
            )
            .await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut plains = self
            .floats(
                "SELECT (extract(epoch FROM started_at - enqueued_at) * 1000)::float8 FROM jobhost.archive
                 WHERE payload ->> 'name' LIKE 'plain %'",
                "SELECT CAST(started_at - enqueued_at AS REAL) FROM archive WHERE payload ->> 'name' LIKE 'plain %'",
            )
            .await;
        plains.sort_by(f64::total_cmp);
        plains
    }

    /// Runs the backend's spelling of a statement.
    pub async fn execute(&self, postgres: &str, sqlite: &str) {
        match self {
            BenchDb::Postgres { store, .. } => {
                sqlx::query(sqlx::AssertSqlSafe(postgres.to_string())).execute(store.pool()).await.unwrap();
            }
            BenchDb::Sqlite { store, .. } => {
                sqlx::query(sqlx::AssertSqlSafe(sqlite.to_string())).execute(store.pool()).await.unwrap();
            }
        }
    }

    pub async fn float(&self, postgres: &str, sqlite: &str) -> f64 {
        self.floats(postgres, sqlite).await.first().copied().unwrap_or(0.0)
    }

    /// Jobs per second from the first start to the last finish in the archive,
    /// by the database's clock.
    pub async fn archive_rate(&self) -> f64 {
        let jobs =
            self.float("SELECT count(*)::float8 FROM jobhost.archive", "SELECT CAST(count(*) AS REAL) FROM archive");
        let secs = self.float(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM jobhost.archive",
            "SELECT (max(finished_at) - min(started_at)) / 1000.0 FROM archive",
        );
        jobs.await / secs.await
    }

    /// Waits until a count query reaches `n`.
    pub async fn wait_for(&self, postgres: &str, sqlite: &str, n: f64) {
        while self.float(postgres, sqlite).await < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn query_floats(pool: &PgPool, sql: &str) -> Vec<f64> {
    sqlx::query_scalar::<_, f64>(sqlx::AssertSqlSafe(sql.to_string())).fetch_all(pool).await.unwrap()
}

async fn query_floats_sqlite(pool: &SqlitePool, sql: &str) -> Vec<f64> {
    sqlx::query_scalar::<_, f64>(sqlx::AssertSqlSafe(sql.to_string())).fetch_all(pool).await.unwrap()
}
