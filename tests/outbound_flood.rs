//! A server that answers with a gigabyte: the run's outbound budget stops
//! the response, and the host streams it instead of holding it, so its
//! resident memory stays near its idle size. Alone in its test binary, so
//! no other test's memory shows in the process's peak.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::get;
use jobhost::component::{StopSignal, grants_from};
use jobhost::store::grant::NewGrant;
use jobhost::types::DEFAULT_OUTBOUND_BUDGET_BYTES;
use serde_json::json;

use common::bodies::Flood;
use common::db::TestDb;
use common::{completed_output, context, load};

const GIGABYTE: u64 = 1 << 30;

/// A line of /proc/self/status, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_response_stops_at_the_budget_and_is_never_held() {
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let app = Router::new().route(
        "/flood",
        get(move || {
            let sent = counter.clone();
            async move { axum::body::Body::new(Flood { total: GIGABYTE, sent }).into_response() }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let db = TestDb::sqlite().await;
    let (runtime, _cache) = common::runtime();
    let runtime = runtime.with_grants(grants_from(db.dyn_store()));
    let new = NewGrant { job_type: "fetcher".into(), origin: origin.clone(), ..Default::default() };
    db.store.grant_set(&new).await.unwrap();
    let fetcher = Arc::new(load(&runtime, "fetcher").await);
    let run = |path: &str| {
        let request = json!({"url": format!("{origin}{path}"), "discard": true}).to_string();
        let (runtime, fetcher) = (runtime.clone(), fetcher.clone());
        async move { runtime.run(&fetcher, &context(7, 1), &request, StopSignal::new()).await }
    };
    // Warm: the first run sizes the pool slot; then the peak starts afresh.
    completed_output(&run("/missing").await.outcome);
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak resident size");
    let idle_kib = status_kib("VmRSS:");

    let report = run("/flood").await;
    let peak_kib = status_kib("VmHWM:");
    let output = completed_output(&report.outcome);
    let error = output["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("reading the body after "), "{output}");
    let call = &report.effects.outbound[0];
    assert!(call.response_bytes <= DEFAULT_OUTBOUND_BUDGET_BYTES, "{call:?}");
    let why = call.error.as_deref().unwrap_or_default();
    assert!(why.starts_with("the run's outbound budget of 67108864 bytes ran out reading"), "{call:?}");
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent < GIGABYTE / 4, "the server sent {sent} bytes: the host kept reading past the budget");
    let grown_mib = peak_kib.saturating_sub(idle_kib) >> 10;
    assert!(grown_mib < 128, "the host's resident size grew by {grown_mib} MiB (idle {idle_kib} KiB)");
}
