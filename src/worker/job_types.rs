//! The job types registered anywhere in the fleet, with their
//! configurations, so a guest's `enqueue` is checked at the call with the
//! rules its completion will apply ([`crate::store::enqueue::prepare_child`]):
//! an unknown type, a payload or option the enqueue refuses, or a `raise`
//! limit with no room returns an error to the guest at once. Refreshed from
//! the database every heartbeat; a type this host has loaded is always known.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::component::{ChildCheck, ChildProbe, JobStep, Registry, StepLookup};
use crate::store::enqueue::prepare_child;
use crate::store::{EnqueueLimits, Error, Store};
use crate::types::{JobConfig, OnConflict};

/// The fleet's job types, as last read.
#[derive(Clone, Default)]
pub struct KnownJobTypes {
    configs: Arc<RwLock<HashMap<String, JobConfig>>>,
}

impl KnownJobTypes {
    /// Rereads the job types; on failure the previous set stays.
    pub async fn refresh(&self, store: &Store) {
        let read = async {
            let names = store.job_types_names().await?;
            store.job_types_get(&names).await
        };
        match read.await {
            Ok(configs) => *self.configs.write().unwrap_or_else(|p| p.into_inner()) = configs,
            Err(error) => tracing::warn!(%error, "cannot read the fleet's job types"),
        }
    }

    /// The check for the sandbox: the type is registered in the fleet or
    /// loaded here, the child passes the enqueue rules, and a `raise` limit
    /// has a free slot for the child's key after the children of that key
    /// this run enqueued before (the probe counts them per key; it returns
    /// the key it rendered for that count). The gate still decides when the
    /// run completes; this only answers early.
    pub fn check(&self, registry: Arc<Registry>, store: Store, limits: EnqueueLimits) -> ChildCheck {
        let configs = self.configs.clone();
        Arc::new(move |probe: ChildProbe| {
            let job = &probe.child.job;
            let fleet = configs.read().unwrap_or_else(|p| p.into_inner()).get(job).cloned();
            let config = fleet.or_else(|| registry.get(job).map(|c| c.config.clone()));
            let store = store.clone();
            Box::pin(async move {
                let config = config.ok_or_else(|| Error::UnknownJobType(probe.child.job.clone()).to_string())?;
                // The parent's id is not known to the guest's call; the
                // rules do not depend on it.
                let prepared = prepare_child(0, probe.child.clone(), &config, &limits).map_err(|e| e.to_string())?;
                if probe.at_release {
                    return Ok(prepared.concurrency_key);
                }
                room_under_limit(&store, &config, prepared.concurrency_key, &probe).await
            })
        })
    }

    /// Which workflow step a job is, asked of the store.
    pub fn step_lookup(store: Store) -> StepLookup {
        Arc::new(move |job_id: i64| {
            let store = store.clone();
            Box::pin(async move {
                let step = store.workflow_of_job(job_id).await.map_err(|e| format!("cannot ask the store: {e}"))?;
                Ok(step.map(|(workflow_id, name)| JobStep { workflow_id, name }))
            })
        })
    }

    /// Refreshes every `interval` until `shutdown`.
    pub async fn refresh_loop(self, store: Store, interval: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(interval);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => self.refresh(&store).await,
            }
        }
    }
}

/// Refuses a child of a `raise` type whose key has no slot left for it.
/// Returns the child's rendered key, for a limited type.
async fn room_under_limit(
    store: &Store,
    config: &JobConfig,
    key: Option<String>,
    probe: &ChildProbe,
) -> Result<Option<String>, String> {
    let (Some(limit), Some(key)) = (&config.concurrency, key) else {
        return Ok(None);
    };
    if limit.on_conflict != OnConflict::Raise {
        return Ok(Some(key));
    }
    let job = &probe.child.job;
    let earlier = i64::from(probe.earlier.count(job, &key));
    match store.semaphore_free_slots(job, &key).await {
        Ok(free) if free <= earlier => Err(format!(
            "job {job:?} refused: concurrency limit reached: all {} slots of key {key:?} are taken",
            limit.limit
        )),
        Ok(_) => Ok(Some(key)),
        Err(error) => {
            tracing::warn!(%error, job, "cannot check a limit at enqueue; the completion's gate decides");
            Ok(Some(key))
        }
    }
}
