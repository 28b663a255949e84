//! `/metrics`: Prometheus's text format (OpenMetrics). The database's
//! numbers are read at each scrape, from the same store calls as `jobhost
//! stats` and `jobhost concurrency`, so the two always agree; this
//! process's own counters follow ([`crate::metrics`]).

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::AppState;
use crate::store::rate::{RateKeyStatus, RateTotals};
use crate::store::{KeyStatus, Stats, Store};

/// The content type of OpenMetrics text, which Prometheus reads.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub fn routes() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateQueue {
    state: String,
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Queue {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Liveness {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobType {
    job_type: String,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

async fn metrics(State(state): State<AppState>) -> Response {
    // A database that cannot be read is reported as down, and this
    // process's own counters are still scraped.
    let read = match tokio::time::timeout(state.work_budget, read(&state.store)).await {
        Ok(read) => read.map_err(|error| error.to_string()),
        Err(_) => Err(format!("no answer within {:?}", state.work_budget)),
    }
    .inspect_err(|error| tracing::warn!(%error, "cannot read the database for a metrics scrape"));
    let mut database = match &read {
        Ok(read) => database_registry(read),
        Err(_) => Registry::default(),
    };
    let up = Gauge::<i64>::default();
    up.set(i64::from(read.is_ok()));
    database.register("jobhost_database_up", "1 when this scrape could read the database, 0 when it could not", up);
    let mut text = String::new();
    let encoded = encode_registry(&mut text, &database)
        .and_then(|()| encode_registry(&mut text, state.metrics.registry()))
        .and_then(|()| encode_eof(&mut text));
    match encoded {
        Ok(()) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the metrics\n").into_response(),
    }
}

/// The database's numbers, as one scrape reads them.
struct Read {
    stats: Stats,
    keys: Vec<KeyStatus>,
    rate_keys: Vec<RateKeyStatus>,
    rate_totals: Vec<RateTotals>,
}

async fn read(store: &Store) -> crate::store::Result<Read> {
    Ok(Read {
        stats: store.job_stats().await?,
        keys: store.semaphore_list().await?,
        rate_keys: store.rate_key_list().await?,
        rate_totals: store.rate_totals().await?,
    })
}

/// The database's numbers as gauges, and the counts the database keeps.
fn database_registry(read: &Read) -> Registry {
    let Read { stats, keys, rate_keys, rate_totals } = read;
    let mut registry = Registry::default();
    let jobs = Family::<StateQueue, Gauge>::default();
    for (queue, states) in &stats.queues {
        for (state, count) in states {
            jobs.get_or_create(&StateQueue { state: state.as_str().to_string(), queue: queue.clone() }).set(*count);
        }
    }
    registry.register("jobhost_jobs", "Jobs in the database by state and queue, live and archived", jobs);
    let paused = Family::<Queue, Gauge>::default();
    for queue in &stats.paused_queues {
        paused.get_or_create(&Queue { queue: queue.clone() }).set(1);
    }
    registry.register("jobhost_queue_paused", "1 for each queue an operator paused", paused);
    let oldest = FloatGauge::default();
    oldest.set(stats.oldest_available_secs.unwrap_or(0.0));
    registry.register("jobhost_oldest_available_seconds", "How long the oldest available job has waited", oldest);
    let hosts = Family::<Liveness, Gauge>::default();
    hosts.get_or_create(&Liveness { state: "alive".into() }).set(stats.hosts_alive);
    hosts.get_or_create(&Liveness { state: "silent".into() }).set(stats.hosts_silent.len() as i64);
    registry.register("jobhost_hosts", "Hosts by liveness, each judged by its own heartbeat", hosts);
    let mut holders: BTreeMap<&str, i64> = BTreeMap::new();
    let mut blocked: BTreeMap<&str, i64> = BTreeMap::new();
    for key in keys {
        *holders.entry(&key.job).or_default() += i64::from(key.holders);
        *blocked.entry(&key.job).or_default() += key.blocked;
    }
    let holding = Family::<JobType, Gauge>::default();
    for (job, count) in holders {
        holding.get_or_create(&JobType { job_type: job.to_string() }).set(count);
    }
    registry.register("jobhost_concurrency_holders", "Slots taken per limited job type, over all its keys", holding);
    let parked = Family::<JobType, Gauge>::default();
    for (job, count) in blocked {
        parked.get_or_create(&JobType { job_type: job.to_string() }).set(count);
    }
    registry.register(
        "jobhost_concurrency_blocked",
        "Jobs parked until their key has a free slot, per job type",
        parked,
    );
    rate_metrics(&mut registry, rate_keys, rate_totals);
    registry
}

/// Rate limits, fleet-wide: what the database counted, and the keys
/// throttled now.
fn rate_metrics(registry: &mut Registry, keys: &[RateKeyStatus], totals: &[RateTotals]) {
    let sent_back = Family::<JobType, Counter>::default();
    let throttles = Family::<JobType, Counter>::default();
    for total in totals {
        let job = JobType { job_type: total.job.clone() };
        sent_back.get_or_create(&job).inc_by(total.sent_back.max(0) as u64);
        throttles.get_or_create(&job).inc_by(total.throttles.max(0) as u64);
    }
    registry.register(
        "jobhost_rate_sent_back",
        "Jobs a fetch sent back to wait because their key's rate limit or throttle had no start free, per job type",
        sent_back,
    );
    registry.register("jobhost_rate_throttles", "Throttles runs reported (\"slow down\"), per job type", throttles);
    let throttled = Family::<JobType, Gauge>::default();
    for key in keys.iter().filter(|k| k.throttled_until.is_some()) {
        throttled.get_or_create(&JobType { job_type: key.job.clone() }).inc();
    }
    registry.register("jobhost_rate_throttled_keys", "Keys throttled now, per job type", throttled);
}
