//! What the queue benchmarks share: a fresh database, `jobhost run`
//! processes as workers, and waiting on the database's own state.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use jobhost::store::Store;
use jobhost::store::postgres::PgStore;
use sqlx::PgPool;

pub fn server() -> String {
    std::env::var("JOBHOST_BENCH_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

pub async fn fresh_db() -> (Arc<PgStore>, String) {
    let admin = PgPool::connect(&format!("{}/postgres", server())).await.expect("PostgreSQL");
    sqlx::query("DROP DATABASE IF EXISTS jobhost_bench WITH (FORCE)").execute(&admin).await.unwrap();
    sqlx::query("CREATE DATABASE jobhost_bench").execute(&admin).await.unwrap();
    let url = format!("{}/jobhost_bench", server());
    let store = Arc::new(PgStore::connect(&url, 8).await.unwrap());
    store.migrate().await.unwrap();
    (store, url)
}

pub fn start_host(url: &str, components: &Path, cache: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_jobhost"))
        .args(["run", "--no-migrate", "--concurrency", "10"])
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

pub async fn scalar(pool: &PgPool, sql: &'static str) -> f64 {
    sqlx::query_scalar::<_, f64>(sql).fetch_one(pool).await.unwrap()
}

pub async fn wait_until(pool: &PgPool, sql: &'static str) {
    while scalar(pool, sql).await < 1.0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value at quantile `p` of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Waits until the archive holds `n` jobs.
pub async fn wait_for_archive(pool: &PgPool, n: i64) {
    loop {
        let archived: i64 = sqlx::query_scalar("SELECT count(*) FROM jobhost.archive").fetch_one(pool).await.unwrap();
        if archived >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Jobs per second from the first start to the last finish in the archive,
/// by the database's clock.
pub async fn archive_rate(pool: &PgPool) -> f64 {
    let (jobs, secs): (i64, f64) = sqlx::query_as(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM jobhost.archive",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    jobs as f64 / secs
}
