//! A fresh PostgreSQL database per test, migrated, dropped when the test ends.
//! `JOBHOST_TEST_DATABASE_URL` names the server (default: the local one).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use jobhost::store::Store;
use jobhost::store::postgres::PgStore;
use sqlx::PgPool;

/// The server tests create their databases on.
pub fn server_url() -> String {
    std::env::var("JOBHOST_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A migrated database of its own.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub store: Arc<PgStore>,
}

impl TestDb {
    pub async fn new() -> TestDb {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!("jobhost_test_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst));
        let admin = PgPool::connect(&format!("{}/postgres", server_url())).await.expect("connect to PostgreSQL");
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
            .execute(&admin)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&admin).await.unwrap();
        admin.close().await;
        let url = format!("{}/{name}", server_url());
        let store = Arc::new(PgStore::connect(&url, 20).await.expect("connect to the test database"));
        store.migrate().await.expect("migrations apply");
        TestDb { name, url, store }
    }

    pub fn pool(&self) -> &PgPool {
        self.store.pool()
    }

    pub fn dyn_store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// A scalar from SQL, for invariant checks.
    pub async fn scalar(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql).fetch_one(self.pool()).await.unwrap()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Dropping needs async I/O; a thread of its own keeps Drop usable in
        // any runtime (or none).
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async move {
                if let Ok(admin) = PgPool::connect(&format!("{}/postgres", server_url())).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&admin).await;
                    admin.close().await;
                }
            });
        })
        .join();
    }
}
