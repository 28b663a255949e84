//! What a run may reach and carry, read when it starts: its type's declared
//! rules with the operator's grants as they stand, and the values of the
//! secrets both let it send, opened with this host's key.

use std::sync::Arc;

use super::redact::RunSecrets;
use super::secrets::Sealed;
use super::shared_read::SharedReads;
use super::substitute::Places;
use super::{GrantRule, Policy, Rule};
use crate::store::grant::OutboundGrant;
use crate::types::JobConfig;

/// Reads a job type's outbound grants, as they stand when a run starts.
pub type GrantSource = Arc<
    dyn Fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<OutboundGrant>, String>> + Send>>
        + Send
        + Sync,
>;

/// Opens the named secrets: each name with its value, or why not.
pub type SecretSource = Arc<
    dyn Fn(
            Vec<String>,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<(String, String)>, String>> + Send>>
        + Send
        + Sync,
>;

/// What a run of `config`'s type may reach: its declared rules, and the
/// grants read now. A type that declares nothing reads no grants.
///
/// # Errors
/// The grants cannot be read: the run should not start (its requests
/// would be refused as if nothing were granted).
pub async fn policy_for(grants: Option<&GrantSource>, config: &JobConfig) -> Result<Policy, String> {
    let declared: Vec<Rule> = config
        .outbound
        .iter()
        .filter_map(|rule| {
            let origin = rule.origin.parse().ok()?;
            Some(Rule { origin, methods: rule.methods.clone(), secrets: rule.secrets.clone() })
        })
        .collect();
    let mut policy = Policy { job_type: config.name.clone(), declared, granted: Vec::new() };
    let Some(source) = grants.filter(|_| !policy.declared.is_empty()) else {
        return Ok(policy);
    };
    let grants = source(config.name.clone())
        .await
        .map_err(|error| format!("cannot read the outbound grants of job type {}: {error}", config.name))?;
    policy.granted = grants.iter().filter_map(grant_rule).collect();
    Ok(policy)
}

/// The run's secrets: a placeholder for each name its component
/// declares, and the values of those a grant lets it send.
///
/// # Errors
/// A secret both sides name that this host cannot open: the run does not start.
pub async fn secrets_for(source: Option<&SecretSource>, policy: &Policy) -> Result<RunSecrets, String> {
    let mut declared: Vec<String> = policy.declared.iter().flat_map(|r| r.secrets.clone()).collect();
    declared.sort();
    declared.dedup();
    let granted: Vec<String> =
        declared.iter().filter(|name| policy.granted.iter().any(|g| g.rule.secrets.contains(name))).cloned().collect();
    let values = match (source, granted.is_empty()) {
        (_, true) => Vec::new(),
        (None, false) => return Err("this runtime opens no secrets".into()),
        (Some(source), false) => {
            let values = source(granted.clone()).await?;
            if let Some(missing) = granted.iter().find(|name| !values.iter().any(|(n, _)| n == *name)) {
                return Err(format!("secret {missing} is granted but not set (`jobhost secret set {missing}`)"));
            }
            values
        }
    };
    RunSecrets::new(&declared, values)
}

/// Grants read from the fleet's database, as hosts read them: each run
/// gets a read begun after it started, shared with the runs of its type
/// starting with it.
pub fn grants_from(store: crate::store::Store) -> GrantSource {
    shared_grants(Arc::new(move |job_type| {
        let store = store.clone();
        Box::pin(async move { store.grants(Some(&job_type)).await.map_err(|e| e.to_string()) })
    }))
}

/// `source`, with runs of one type starting together sharing one read
/// (see [`SharedReads`]).
pub fn shared_grants(source: GrantSource) -> GrantSource {
    let shared = Arc::new(SharedReads::<String, Vec<OutboundGrant>>::default());
    Arc::new(move |job_type| {
        let (source, shared) = (source.clone(), shared.clone());
        Box::pin(async move {
            let grants = shared.read(&job_type, || source(job_type.clone())).await?;
            Ok(grants.as_ref().clone())
        })
    })
}

/// Secrets opened from the fleet's database with this host's key.
pub fn secrets_from(store: crate::store::Store, key: Option<crate::outbound::secrets::SecretKey>) -> SecretSource {
    // Sealed values are shared between runs as grants are; each run opens its own.
    let shared = Arc::new(SharedReads::<Vec<String>, Vec<(String, Sealed)>>::default());
    Arc::new(move |names| {
        let (store, key, shared) = (store.clone(), key.clone(), shared.clone());
        Box::pin(async move {
            let Some(key) = key else {
                return Err(format!(
                    "this host has no key ({} or {})",
                    crate::outbound::secrets::KEY_VARIABLE,
                    crate::outbound::secrets::KEY_FILE_VARIABLE
                ));
            };
            let read = || async { store.secrets_sealed(&names).await.map_err(|e| e.to_string()) };
            let sealed = shared.read(&names, read).await?;
            sealed.iter().map(|(name, sealed)| Ok((name.clone(), key.open(name, sealed)?))).collect()
        })
    })
}

/// A stored grant as the policy reads it; one whose pattern this binary
/// cannot read grants nothing.
fn grant_rule(grant: &OutboundGrant) -> Option<GrantRule> {
    let origin = grant.origin.parse().ok()?;
    let rule = Rule { origin, methods: grant.methods.clone(), secrets: grant.secrets.clone() };
    Some(GrantRule {
        rule,
        private: grant.private,
        idempotency_key: grant.idempotency_key,
        timeouts: grant.timeouts,
        secrets_in: Places::of(&grant.secrets_in),
        secret_headers: grant.secret_headers.clone(),
    })
}
