//! What this process counts as it works, for Prometheus: runs by type and
//! outcome with their durations, sandbox instantiation, lease renewals and
//! losses, expiries, enqueues. The database's own numbers (jobs by state
//! and queue, keys, hosts) are read at each scrape instead, by
//! [`crate::http`], so they agree with `jobhost stats` whichever host is
//! scraped. One [`Metrics`] per host, shared by its tasks; cloning shares it.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a per-type metric: `job_type`, since Prometheus keeps `job`
/// for the scrape target.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    job_type: String,
}

/// Labels of a fetch: whether it leased any job.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FetchLabels {
    found: &'static str,
}

/// Labels of a run's end.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    job_type: String,
    outcome: String,
}

/// Labels of an outbound request: the declared rule it fell under (bounded
/// by the rules a component may declare, where origins are not), and how it
/// went: `2xx` to `5xx`, `error`, or `refused`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutboundLabels {
    job_type: String,
    rule: String,
    result: String,
}

/// Labels of an outbound request's duration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutboundRuleLabels {
    job_type: String,
    rule: String,
}

/// Labels of an inbound webhook request: the webhook (`unknown` for a name
/// none has, so a caller cannot make up label values) and its outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    webhook: String,
    outcome: &'static str,
}

type Histograms = Family<TypeLabels, Histogram, fn() -> Histogram>;

/// This process's counters and histograms.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    runs: Family<RunLabels, Counter>,
    run_seconds: Histograms,
    instantiate_seconds: Histograms,
    enqueued: Family<TypeLabels, Counter>,
    fetches: Family<FetchLabels, Counter>,
    lease_renewals: Counter,
    leases_lost: Counter,
    leases_expired: Counter,
    jobs_expired_to_archive: Counter,
    outbound: Family<OutboundLabels, Counter>,
    outbound_seconds: Family<OutboundRuleLabels, Histogram, fn() -> Histogram>,
    webhooks: Family<WebhookLabels, Counter>,
}

/// Run durations from 1 ms to about 4.7 hours.
fn run_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 25))
}

/// Instantiation times from 10 µs to about 0.16 s.
fn instantiate_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let runs = Family::<RunLabels, Counter>::default();
        registry.register(
            "jobhost_runs",
            "Runs this host ended, by job type and outcome (completed, retried, failed, snoozed, throttled, crashed, interrupted)",
            runs.clone(),
        );
        let run_seconds: Histograms = Family::new_with_constructor(run_buckets);
        registry.register(
            "jobhost_run_duration_seconds",
            "Wall time of runs on this host, from entering the sandbox to leaving it",
            run_seconds.clone(),
        );
        let instantiate_seconds: Histograms = Family::new_with_constructor(instantiate_buckets);
        registry.register(
            "jobhost_sandbox_instantiate_seconds",
            "Time to instantiate a run's sandbox from its pre-linked component",
            instantiate_seconds.clone(),
        );
        let enqueued = Family::<TypeLabels, Counter>::default();
        registry.register("jobhost_enqueued", "Jobs this process enqueued through its HTTP API", enqueued.clone());
        let fetches = Family::<FetchLabels, Counter>::default();
        registry.register(
            "jobhost_fetches",
            "Fetches this host's fetch loop sent for free slots, by whether they leased any job (found=jobs) or none (found=none); jobs leased along with results are not counted",
            fetches.clone(),
        );
        let lease_renewals = Counter::default();
        registry.register("jobhost_lease_renewals", "Leases this host renewed", lease_renewals.clone());
        let leases_lost = Counter::default();
        registry.register(
            "jobhost_leases_lost",
            "Runs this host stopped because their lease was no longer theirs",
            leases_lost.clone(),
        );
        let leases_expired = Counter::default();
        registry.register(
            "jobhost_lease_expiries",
            "Expired leases this host's maintenance handed back for another attempt",
            leases_expired.clone(),
        );
        let jobs_expired_to_archive = Counter::default();
        registry.register(
            "jobhost_lease_expiries_archived",
            "Expired leases this host's maintenance archived: their attempts were spent",
            jobs_expired_to_archive.clone(),
        );
        let outbound = Family::<OutboundLabels, Counter>::default();
        registry.register(
            "jobhost_outbound_requests",
            "Outbound HTTP requests of runs on this host, by job type, declared rule and result (2xx..5xx, error, refused)",
            outbound.clone(),
        );
        let outbound_seconds: Family<OutboundRuleLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(run_buckets);
        registry.register(
            "jobhost_outbound_request_seconds",
            "Time from an outbound request sent to its response's head, by job type and declared rule",
            outbound_seconds.clone(),
        );
        let webhooks = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "jobhost_webhook_requests",
            "Requests to inbound webhooks this process served, by webhook and outcome (accepted, duplicate, unsigned, bad_signature, stale, invalid, unavailable)",
            webhooks.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry,
                runs,
                run_seconds,
                instantiate_seconds,
                enqueued,
                fetches,
                lease_renewals,
                leases_lost,
                leases_expired,
                jobs_expired_to_archive,
                outbound,
                outbound_seconds,
                webhooks,
            }),
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Counts a run's end and its duration, and the sandbox's instantiation.
    pub fn run_ended(&self, job: &str, outcome: &str, elapsed: Duration, instantiate: Option<Duration>) {
        let labels = TypeLabels { job_type: job.to_string() };
        self.inner.runs.get_or_create(&RunLabels { job_type: job.to_string(), outcome: outcome.to_string() }).inc();
        self.inner.run_seconds.get_or_create(&labels).observe(elapsed.as_secs_f64());
        if let Some(instantiate) = instantiate {
            self.inner.instantiate_seconds.get_or_create(&labels).observe(instantiate.as_secs_f64());
        }
    }

    /// Counts a run's outbound requests.
    pub fn outbound_calls(&self, job: &str, calls: &[crate::types::OutboundCall]) {
        for call in calls {
            let result = match (call.status, call.error.as_deref()) {
                (Some(status), _) => format!("{}xx", status / 100),
                (None, Some("refused")) => "refused".to_string(),
                _ => "error".to_string(),
            };
            let labels = OutboundLabels { job_type: job.to_string(), rule: call.rule.clone(), result };
            self.inner.outbound.get_or_create(&labels).inc();
            if call.status.is_some() {
                let labels = OutboundRuleLabels { job_type: job.to_string(), rule: call.rule.clone() };
                self.inner.outbound_seconds.get_or_create(&labels).observe(call.ms as f64 / 1000.0);
            }
        }
    }

    /// Counts a request to an inbound webhook (`unknown` for no such webhook).
    pub fn webhook(&self, webhook: &str, outcome: &'static str) {
        self.inner.webhooks.get_or_create(&WebhookLabels { webhook: webhook.to_string(), outcome }).inc();
    }

    /// Counts jobs of a type this process enqueued.
    pub fn enqueued(&self, job: &str, count: u64) {
        self.inner.enqueued.get_or_create(&TypeLabels { job_type: job.to_string() }).inc_by(count);
    }

    /// Counts a fetch of the fetch loop, by whether it leased any job.
    pub fn fetched(&self, jobs: usize) {
        let found = if jobs > 0 { "jobs" } else { "none" };
        self.inner.fetches.get_or_create(&FetchLabels { found }).inc();
    }

    /// Counts a heartbeat's renewals and the runs it found lost.
    pub fn leases_renewed(&self, renewed: usize, lost: usize) {
        self.inner.lease_renewals.inc_by(renewed as u64);
        self.inner.leases_lost.inc_by(lost as u64);
    }

    /// Counts a maintenance pass's expired leases: handed back, archived.
    pub fn leases_expired(&self, requeued: u64, archived: u64) {
        self.inner.leases_expired.inc_by(requeued);
        self.inner.jobs_expired_to_archive.inc_by(archived);
    }

    /// The registry to encode at a scrape.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }
}
