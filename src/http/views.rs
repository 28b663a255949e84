//! What the API and the dashboard both show and do, assembled once from
//! the store: queues with their counts, job types with the hosts serving
//! them, schedules at the database's time, throughput, bulk actions.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::store::{Cancel, JobFilter, JobState, JobTypeRow, ScheduleStatus, Store};

/// A queue: its live and archived jobs by state, and whether it is paused.
#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    /// Its name.
    pub name: String,
    /// Whether hosts are kept from leasing its jobs.
    pub paused: bool,
    /// Its jobs by state (only states it has).
    pub counts: BTreeMap<JobState, i64>,
}

/// Every queue with jobs or a pause, by name.
pub async fn queues(store: &Store) -> crate::store::Result<Vec<QueueView>> {
    Ok(queues_of(store.job_stats().await?))
}

/// The queues `stats` counts, for a page that has read them already.
pub fn queues_of(stats: crate::store::Stats) -> Vec<QueueView> {
    let mut queues: BTreeMap<String, QueueView> = stats
        .queues
        .into_iter()
        .map(|(name, counts)| (name.clone(), QueueView { name, paused: false, counts }))
        .collect();
    for name in stats.paused_queues {
        queues
            .entry(name.clone())
            .or_insert_with(|| QueueView { name, paused: false, counts: BTreeMap::new() })
            .paused = true;
    }
    queues.into_values().collect()
}

/// What to do to a queue, as the path names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueAction {
    /// Keep hosts from leasing its jobs.
    Pause,
    /// Let hosts lease its jobs again.
    Resume,
}

/// Why a queue action did not apply.
#[derive(Debug, thiserror::Error)]
pub enum QueueActionError {
    /// The name is not a queue's: the caller's mistake.
    #[error("queue {0}")]
    BadName(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

impl QueueAction {
    /// Pauses or resumes `queue`, a valid queue name: whether it changed.
    ///
    /// # Errors
    /// A name that is not a queue's; a store failure.
    pub async fn apply(self, store: &Store, queue: &str) -> Result<bool, QueueActionError> {
        crate::types::check_name(queue).map_err(QueueActionError::BadName)?;
        Ok(match self {
            QueueAction::Pause => store.queue_pause(queue).await?,
            QueueAction::Resume => store.queue_resume(queue).await?,
        })
    }

    /// What it did, for a person.
    pub fn done(self, queue: &str) -> String {
        match self {
            QueueAction::Pause => format!("Queue {queue} paused: no host leases from it; running jobs finish"),
            QueueAction::Resume => format!("Queue {queue} resumed"),
        }
    }
}

/// A host serving a job type, with the component it serves.
#[derive(Debug, Clone, Serialize)]
pub struct ServingHost {
    /// The host's id.
    pub host: String,
    /// The digest of its component for the type.
    pub digest: Option<String>,
    /// Whether it is alive by its own heartbeat.
    pub alive: bool,
}

/// A registered job type, with the hosts that loaded it.
#[derive(Debug, Clone, Serialize)]
pub struct JobTypeView {
    /// The registration.
    #[serde(flatten)]
    pub registered: JobTypeRow,
    /// The hosts (live or presumed dead) that list it.
    pub hosts: Vec<ServingHost>,
    /// The version the fleet serves from the database, if it was deployed
    /// through it (`jobhost deploy`, `POST /api/deployments`).
    pub deployed: Option<crate::store::Deployment>,
    /// The operator's outbound grants for it, shown beside the rules its
    /// component declares.
    pub grants: Vec<crate::store::grant::OutboundGrant>,
}

/// Every registered job type, by name.
pub async fn job_types(store: &Store) -> crate::store::Result<Vec<JobTypeView>> {
    let hosts = store.host_list().await?;
    let mut grants: BTreeMap<String, Vec<crate::store::grant::OutboundGrant>> = BTreeMap::new();
    for grant in store.grants(None).await? {
        grants.entry(grant.job_type.clone()).or_default().push(grant);
    }
    let mut deployed: BTreeMap<String, crate::store::Deployment> =
        store.deployments_current().await?.into_iter().map(|d| (d.job_type.clone(), d)).collect();
    Ok(store
        .job_types_list()
        .await?
        .into_iter()
        .map(|registered| {
            let hosts = hosts
                .iter()
                .filter(|h| h.job_types.contains(&registered.name))
                .map(|h| ServingHost {
                    host: h.id.clone(),
                    digest: h.digests.get(&registered.name).cloned(),
                    alive: h.alive,
                })
                .collect();
            let deployed = deployed.remove(&registered.name);
            let grants = grants.remove(&registered.name).unwrap_or_default();
            JobTypeView { registered, hosts, deployed, grants }
        })
        .collect())
}

/// Every schedule as of the database's clock.
pub async fn schedules(store: &Store) -> crate::store::Result<Vec<ScheduleStatus>> {
    let listing = store.schedule_list(None).await?;
    Ok(listing.schedules.iter().map(|state| ScheduleStatus::new(state, listing.now)).collect())
}

/// Jobs ended in a recent window, by final state.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// The window, in seconds.
    pub window_secs: f64,
    /// Jobs that ended in it, by final state (every final state listed).
    pub finished: BTreeMap<JobState, i64>,
    /// Completed jobs per second over the window.
    pub completed_per_sec: f64,
}

/// What ended in the last `window_secs` seconds.
pub async fn throughput(store: &Store, window_secs: f64) -> crate::store::Result<Throughput> {
    let counted = store.job_finished_since(window_secs).await?;
    let finished: BTreeMap<JobState, i64> = JobState::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .map(|s| (s, counted.get(&s).copied().unwrap_or(0)))
        .collect();
    let completed_per_sec = finished[&JobState::Completed] as f64 / window_secs;
    Ok(Throughput { window_secs, finished, completed_per_sec })
}

/// What a bulk action is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    /// Run again.
    Retry,
    /// Cancel.
    Cancel,
}

/// A job a bulk action left as it was, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Unchanged {
    /// The job.
    pub id: i64,
    /// Why (its state does not allow the action, say).
    pub reason: String,
}

/// What a bulk action did.
#[derive(Debug, Clone, Serialize, Default)]
pub struct BulkOutcome {
    /// Jobs this pass took of those the filter matches (at most its
    /// limit, and fewer when it ran out of time).
    pub matched: usize,
    /// Jobs retried or cancelled at once.
    pub changed: usize,
    /// Running jobs asked to stop (a cancel): their hosts end them.
    pub requested: usize,
    /// Jobs left as they were, with the reason (the first 100).
    pub unchanged: Vec<Unchanged>,
    /// Whether the filter may match more jobs than this pass took (it
    /// took its limit, or ran out of time): send the same request again
    /// with `before` set to `next`.
    pub more: bool,
    /// The cursor past this pass's jobs (the last id it took), when `more`.
    pub next: Option<i64>,
}

/// The most unchanged jobs a bulk outcome names.
const UNCHANGED_LISTED: usize = 100;

/// Applies `action` to each job `filter` matches, newest first, one job at
/// a time through the same rules as the single action (a retry passes the
/// gate again; a running job's cancel goes through its host). A job whose
/// state does not allow it is left, with the reason; a database failure
/// stops the pass and is returned. The pass stops at `budget` too, with the
/// cursor of the jobs it took, so a request never outlives its deadline
/// with some of its jobs done and no word of which.
pub async fn bulk(
    store: &Store,
    filter: &JobFilter,
    action: BulkAction,
    budget: std::time::Duration,
) -> crate::store::Result<BulkOutcome> {
    let deadline = tokio::time::Instant::now() + budget;
    // One action may wait long on a lock (a busy SQLite file): it is given
    // up at one and a half budgets, inside the request's two (and never
    // sooner than a quarter second after the pass's end, which a pass out
    // of time reaches at once).
    let given_up = deadline + (budget / 2).max(std::time::Duration::from_millis(250));
    let jobs = store.job_list(filter).await?;
    let mut outcome = BulkOutcome { more: jobs.len() as i64 == filter.limit, ..Default::default() };
    for (index, job) in jobs.into_iter().enumerate() {
        // At least one job a pass, so following the cursor always ends.
        if index > 0 && tokio::time::Instant::now() >= deadline {
            outcome.more = true;
            break;
        }
        outcome.matched += 1;
        outcome.next = Some(job.id);
        let acting = async {
            match action {
                BulkAction::Retry => store.job_retry(job.id).await.map(|()| Cancel::Cancelled),
                BulkAction::Cancel => store.job_cancel(job.id).await,
            }
        };
        let Ok(done) = tokio::time::timeout_at(given_up, acting).await else {
            outcome.more = true;
            outcome.unchanged.push(Unchanged {
                id: job.id,
                reason: "no answer from the database in time: it may or may not have changed".into(),
            });
            break;
        };
        match done {
            Ok(Cancel::Cancelled) => outcome.changed += 1,
            Ok(Cancel::Requested) => outcome.requested += 1,
            Err(error)
                if error.is_refusal()
                    || matches!(
                        error,
                        crate::store::Error::NotFound { .. } | crate::store::Error::WrongState { .. }
                    ) =>
            {
                if outcome.unchanged.len() < UNCHANGED_LISTED {
                    outcome.unchanged.push(Unchanged { id: job.id, reason: error.to_string() });
                }
            }
            Err(error) => return Err(error),
        }
    }
    if !outcome.more {
        outcome.next = None;
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EnqueueParams, JobState};

    /// A pass out of time still takes one job, and following its cursor
    /// takes every job once.
    #[tokio::test]
    async fn a_bulk_action_out_of_time_goes_on_from_its_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("jobhost.db").display());
        let store = crate::store::open(&url, 2).await.unwrap();
        store.schema_migrate().await.unwrap();
        let config: crate::types::JobConfig = serde_json::from_value(serde_json::json!({
            "name": "mail", "queue": "default", "priority": 0, "max_attempts": 1,
            "backoff": {"base_ms": 10, "cap_ms": 10}, "timeout_ms": 1000, "memory_limit_bytes": 1048576
        }))
        .unwrap();
        store.job_types_register(&[(config, "v1".into())]).await.unwrap();
        let jobs: Vec<_> = (0..3).map(|i| EnqueueParams::new("mail", serde_json::json!({ "i": i }))).collect();
        let ids = store.job_enqueue(&jobs).await.unwrap();
        let mut filter = JobFilter { job: Some("mail".into()), limit: 100, ..JobFilter::default() };
        let mut passes = 0;
        loop {
            let pass = bulk(&store, &filter, BulkAction::Cancel, std::time::Duration::ZERO).await.unwrap();
            passes += 1;
            assert_eq!((pass.matched, pass.changed), (1, 1), "pass {passes}: {pass:?}");
            match pass.next.filter(|_| pass.more) {
                Some(next) => filter.before_id = Some(next),
                None => break,
            }
            assert!(passes < 10, "the cursor ends");
        }
        assert_eq!(passes, 3);
        for id in ids {
            assert_eq!(store.job_get(id).await.unwrap().unwrap().row.state, JobState::Cancelled);
        }
    }
}
