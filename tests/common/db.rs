//! A fresh, migrated database per test, on either backend: a PostgreSQL
//! database of its own (dropped when the test ends; `JOBHOST_TEST_DATABASE_URL`
//! names the server, default the local one), or an embedded SQLite file in a
//! temporary directory.

use std::sync::atomic::{AtomicU32, Ordering};

use jobhost::store::driver::SchemaDriver;
use jobhost::store::postgres::PgStore;
use jobhost::store::sqlite::SqliteStore;
use jobhost::store::{EnqueueParams, Enqueued, FetchedJob, JobState, Store};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, SqlitePool};

/// The server tests create their PostgreSQL databases on.
pub fn server_url() -> String {
    std::env::var("JOBHOST_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// Which store a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// The session name of the checks' own connections. Hosts (and the test's
/// store) connect as `jobhost`; a test that terminates the hosts' sessions
/// leaves the checks' sessions alone by this name.
const CHECKS_APPLICATION_NAME: &str = "jobhost-tests";

/// The backend's own handle, for invariant checks in SQL (and, on
/// PostgreSQL, the server the database lives on, for Drop to drop it there).
enum Raw {
    Postgres { name: String, server: String, pool: PgPool },
    Sqlite { pool: SqlitePool, _dir: tempfile::TempDir },
}

/// A migrated database of its own.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    pub store: Store,
    raw: Raw,
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Postgres => Self::postgres().await,
            Backend::Sqlite => Self::sqlite().await,
        }
    }

    pub async fn postgres() -> TestDb {
        Self::postgres_on(&server_url()).await
    }

    /// A database of its own on the PostgreSQL server at `server`
    /// (`postgres://USER@HOST:PORT`, no database name).
    pub async fn postgres_on(server: &str) -> TestDb {
        Self::postgres_migrated_to(server, None).await
    }

    /// A database of its own on the local server, migrated only up to
    /// `version`: for tests of the migrations themselves.
    pub async fn postgres_at(version: i64) -> TestDb {
        Self::postgres_migrated_to(&server_url(), Some(version)).await
    }

    async fn postgres_migrated_to(server: &str, version: Option<i64>) -> TestDb {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!("jobhost_test_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst));
        let admin = PgPool::connect(&format!("{server}/postgres")).await.expect("connect to PostgreSQL");
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
            .execute(&admin)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&admin).await.unwrap();
        admin.close().await;
        let url = format!("{server}/{name}");
        let store = PgStore::connect(&url, 20).await.expect("connect to the test database");
        store.schema_migrate_to(version).await.expect("migrations apply");
        let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
        let pool = PgPoolOptions::new()
            .max_connections(5)
            .connect_with(options.application_name(CHECKS_APPLICATION_NAME))
            .await
            .expect("connect the checks to the test database");
        let raw = Raw::Postgres { name, server: server.to_string(), pool };
        TestDb { backend: Backend::Postgres, url, store: Store::new(store), raw }
    }

    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::sqlite_in(dir).await
    }

    /// A SQLite file in `dir`, which the database keeps until it is dropped.
    pub async fn sqlite_in(dir: tempfile::TempDir) -> TestDb {
        let url = format!("sqlite://{}", dir.path().join("jobhost.db").display());
        let store = SqliteStore::open(&url, 8).await.expect("open the test database");
        store.schema_migrate().await.expect("migrations apply");
        let pool = store.pool().clone();
        TestDb { backend: Backend::Sqlite, url, store: Store::new(store), raw: Raw::Sqlite { pool, _dir: dir } }
    }

    /// The PostgreSQL pool the checks use, for tests of PostgreSQL-only features.
    pub fn pool(&self) -> &PgPool {
        match &self.raw {
            Raw::Postgres { pool, .. } => pool,
            Raw::Sqlite { .. } => panic!("a PostgreSQL-only check ran on SQLite"),
        }
    }

    pub fn dyn_store(&self) -> Store {
        self.store.clone()
    }

    /// Picks the backend's spelling of an SQL expression.
    pub fn dialect<'a>(&self, postgres: &'a str, sqlite: &'a str) -> &'a str {
        match self.backend {
            Backend::Postgres => postgres,
            Backend::Sqlite => sqlite,
        }
    }

    /// SQL written for PostgreSQL's `jobhost` schema, for this backend (the
    /// SQLite tables have the same names, unqualified).
    fn local(&self, sql: &str) -> String {
        match self.backend {
            Backend::Postgres => sql.to_string(),
            Backend::Sqlite => sql.replace("jobhost.", ""),
        }
    }

    /// A scalar from SQL, for invariant checks. Values are written into the
    /// SQL by the tests themselves.
    pub async fn scalar(&self, sql: impl AsRef<str>) -> i64 {
        let sql = sqlx::AssertSqlSafe(self.local(sql.as_ref()));
        match &self.raw {
            Raw::Postgres { pool, .. } => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
            Raw::Sqlite { pool, .. } => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A column of text from SQL, for invariant checks.
    pub async fn texts(&self, sql: impl AsRef<str>) -> Vec<String> {
        let sql = sqlx::AssertSqlSafe(self.local(sql.as_ref()));
        match &self.raw {
            Raw::Postgres { pool, .. } => sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await,
            Raw::Sqlite { pool, .. } => sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await,
        }
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Rows from SQL, for invariant checks read in one snapshot.
    pub async fn rows<T>(&self, sql: impl AsRef<str>) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
            + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
            + Send
            + Unpin,
    {
        let sql = sqlx::AssertSqlSafe(self.local(sql.as_ref()));
        match &self.raw {
            Raw::Postgres { pool, .. } => sqlx::query_as::<_, T>(sql).fetch_all(pool).await,
            Raw::Sqlite { pool, .. } => sqlx::query_as::<_, T>(sql).fetch_all(pool).await,
        }
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs a statement, as an operator editing rows by hand would.
    pub async fn execute(&self, sql: impl AsRef<str>) {
        let sql = sqlx::AssertSqlSafe(self.local(sql.as_ref()));
        match &self.raw {
            Raw::Postgres { pool, .. } => sqlx::query(sql).execute(pool).await.map(|_| ()),
            Raw::Sqlite { pool, .. } => sqlx::query(sql).execute(pool).await.map(|_| ()),
        }
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Enqueues one job, which must be accepted: its id (or its holder's).
    pub async fn enqueue_one(&self, params: EnqueueParams) -> i64 {
        self.store.job_enqueue(&[params]).await.unwrap()[0]
    }

    /// Enqueues one job of `job` with `payload` and its type's defaults,
    /// which must be accepted: its id.
    pub async fn enqueue_new(&self, job: &str, payload: serde_json::Value) -> i64 {
        self.enqueue_one(EnqueueParams::new(job, payload)).await
    }

    /// Enqueues one job, which must be accepted: what became of it.
    pub async fn enqueue_outcome(&self, params: EnqueueParams) -> Enqueued {
        self.store.job_enqueue_outcomes(&[params]).await.unwrap().remove(0)
    }

    /// Leases up to `limit` jobs of one type from the default queue to host `h`.
    pub async fn fetch(&self, job: &str, limit: i64) -> Vec<FetchedJob> {
        self.store.job_fetch(&super::fetch_params("h", &[job], limit)).await.unwrap()
    }

    /// The state of a job that exists.
    pub async fn state_of(&self, id: i64) -> JobState {
        self.store.job_get(id).await.unwrap().expect("job exists").row.state
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Raw::Postgres { name, server, .. } = &self.raw else { return };
        let (name, server) = (name.clone(), server.clone());
        // Dropping needs async I/O; a thread of its own keeps Drop usable in
        // any runtime (or none).
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async move {
                if let Ok(admin) = PgPool::connect(&format!("{server}/postgres")).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&admin).await;
                    admin.close().await;
                }
            });
        })
        .join();
    }
}

/// Declares each named `async fn NAME(db: TestDb)` as two tests, one per
/// backend: `postgres::NAME` and `sqlite::NAME`, from the one body.
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($($name:ident),+ $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::common::db::TestDb::new(super::common::db::Backend::Postgres).await).await
                }
            )+
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::common::db::TestDb::new(super::common::db::Backend::Sqlite).await).await
                }
            )+
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_backends;

/// Runs the `jobhost` binary with `args` on `db`, quiet but for errors.
pub fn jobhost(db: &TestDb, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_jobhost"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "error")
        .output()
        .expect("run jobhost")
}
