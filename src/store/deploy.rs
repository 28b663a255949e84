//! Components deployed through the database: their bytes by digest, and
//! each job type's history of deploys, rollbacks and undeploys, whose newest
//! entry says what the fleet serves. The rules (what a rollback goes back
//! to, when a deploy changes nothing) are decided here once for both
//! backends; each backend reads the history and appends the entry in one
//! transaction that holds the type's lock.

use chrono::{DateTime, Utc};

use super::{Error, Result};

/// The largest component accepted: past it a deploy is refused before
/// anything is sent. An interpreter bundled with its runtime (Python,
/// JavaScript) takes 10 to 40 MiB.
pub const MAX_COMPONENT_BYTES: usize = 256 << 20;

/// The shortest digest prefix that names a version (`rollback --to`).
pub const MIN_DIGEST_PREFIX: usize = 8;

/// What an entry of a job type's history did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeployAction {
    /// A new version, from `jobhost deploy`.
    Deploy,
    /// An earlier version again, from `jobhost rollback`.
    Rollback,
    /// No version: hosts stop serving the type from the database.
    Undeploy,
}

impl DeployAction {
    /// The name stored in the history.
    pub fn as_str(self) -> &'static str {
        match self {
            DeployAction::Deploy => "deploy",
            DeployAction::Rollback => "rollback",
            DeployAction::Undeploy => "undeploy",
        }
    }

    /// The action a stored name stands for.
    ///
    /// # Errors
    /// A name this binary does not know.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "deploy" => Ok(DeployAction::Deploy),
            "rollback" => Ok(DeployAction::Rollback),
            "undeploy" => Ok(DeployAction::Undeploy),
            other => Err(Error::Decode(format!("unknown deployment action {other:?}"))),
        }
    }
}

/// What the fleet serves for one job type from the database.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Deployment {
    /// The history entry that made it so: a host that refused a version
    /// tries again at a newer entry, even of the same digest (a repaired row).
    pub entry: i64,
    /// The job type.
    pub job_type: String,
    /// The serving component's digest (SHA-256 of its bytes, hex).
    pub digest: String,
    /// The component's size in bytes.
    pub size_bytes: i64,
    /// When this version became the one served.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub deployed_at: DateTime<Utc>,
    /// Whether it got there by a rollback.
    pub action: DeployAction,
}

/// One entry of a job type's history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeploymentEntry {
    /// Increasing across all types: the newest entry has the largest.
    pub id: i64,
    /// The job type.
    pub job_type: String,
    /// The version served from this entry on; `None` after an undeploy.
    pub digest: Option<String>,
    /// What the entry did.
    pub action: DeployAction,
    /// When.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub at: DateTime<Utc>,
}

/// What a deploy, rollback or undeploy changed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeployChange {
    /// The version served before (`None`: none was).
    pub previous: Option<String>,
    /// The version served now (`None` after an undeploy).
    pub current: Option<String>,
    /// False when it was already so: no entry was added and hosts see
    /// nothing new. A deploy of the served version whose stored bytes
    /// differed (a damaged row) repairs them and counts as a change, so
    /// hosts that refused the damaged bytes try again.
    pub changed: bool,
}

/// A change to what the fleet serves for one job type.
#[derive(Debug, Clone, Copy)]
pub enum DeployRequest<'a> {
    /// Serve this validated component (stored once per digest).
    Deploy {
        /// SHA-256 of `bytes`, hex.
        digest: &'a str,
        /// The component.
        bytes: &'a [u8],
        /// The configuration it declared, validated.
        config: &'a crate::types::JobConfig,
    },
    /// Serve an earlier version: the one named, or the one before.
    Rollback {
        /// A digest or digest prefix from the type's history.
        to: Option<&'a str>,
    },
    /// Serve nothing from the database.
    Undeploy,
}

/// What `request` does to a type whose history, newest first, is
/// `history`, and the action to record (nothing is recorded when
/// `changed` is false).
///
/// # Errors
/// [`Error::DeployRefused`] for a request that cannot apply.
pub fn decide(
    job_type: &str,
    history: &[DeploymentEntry],
    request: DeployRequest<'_>,
) -> Result<(DeployChange, DeployAction)> {
    match request {
        DeployRequest::Deploy { digest, .. } => Ok((deploy_change(history, digest), DeployAction::Deploy)),
        DeployRequest::Rollback { to } => Ok((rollback_change(job_type, history, to)?, DeployAction::Rollback)),
        DeployRequest::Undeploy => Ok((undeploy_change(job_type, history)?, DeployAction::Undeploy)),
    }
}

/// What a deploy of `digest` does to a type whose history, newest first, is
/// `history`: nothing when that version is served already.
fn deploy_change(history: &[DeploymentEntry], digest: &str) -> DeployChange {
    let previous = current_of(history);
    let changed = previous.as_deref() != Some(digest);
    DeployChange { previous, current: Some(digest.to_string()), changed }
}

/// What an undeploy does.
///
/// # Errors
/// [`Error::DeployRefused`] when nothing is deployed.
fn undeploy_change(job_type: &str, history: &[DeploymentEntry]) -> Result<DeployChange> {
    match current_of(history) {
        Some(previous) => Ok(DeployChange { previous: Some(previous), current: None, changed: true }),
        None => Err(Error::DeployRefused(format!("job type {job_type:?} is not deployed"))),
    }
}

/// What a rollback goes back to: the version named by `to` (a digest or a
/// prefix of at least [`MIN_DIGEST_PREFIX`] characters, from this type's
/// history), or else the newest version before the one served, so two
/// rollbacks in a row undo each other. After an undeploy, the version it
/// removed.
///
/// # Errors
/// [`Error::DeployRefused`] for a type never deployed, a `to` that is too
/// short, names no version of the type or more than one, and a type with
/// no earlier version.
fn rollback_change(job_type: &str, history: &[DeploymentEntry], to: Option<&str>) -> Result<DeployChange> {
    if history.is_empty() {
        return Err(Error::DeployRefused(format!("job type {job_type:?} was never deployed")));
    }
    let current = current_of(history);
    let mut versions: Vec<&str> = Vec::new();
    for digest in history.iter().filter_map(|e| e.digest.as_deref()) {
        if !versions.contains(&digest) {
            versions.push(digest);
        }
    }
    let target = match to {
        Some(prefix) => {
            let prefix = prefix.trim().to_ascii_lowercase();
            if prefix.len() < MIN_DIGEST_PREFIX {
                return Err(Error::DeployRefused(format!(
                    "--to needs at least {MIN_DIGEST_PREFIX} characters of a digest, got {prefix:?}"
                )));
            }
            let matching: Vec<&str> = versions.iter().copied().filter(|d| d.starts_with(&prefix)).collect();
            match matching.as_slice() {
                [one] => one.to_string(),
                [] => {
                    return Err(Error::DeployRefused(format!(
                        "no version of {job_type:?} has a digest starting {prefix:?} (`jobhost components --history {job_type}` lists them)"
                    )));
                }
                _ => return Err(Error::DeployRefused(format!("{prefix:?} names several versions of {job_type:?}"))),
            }
        }
        None => versions.iter().find(|d| Some(**d) != current.as_deref()).map(|d| d.to_string()).ok_or_else(|| {
            Error::DeployRefused(format!("job type {job_type:?} has no earlier version to roll back to"))
        })?,
    };
    let changed = current.as_deref() != Some(target.as_str());
    Ok(DeployChange { previous: current, current: Some(target), changed })
}

/// The version served according to a history, newest entry first.
fn current_of(history: &[DeploymentEntry]) -> Option<String> {
    history.first().and_then(|entry| entry.digest.clone())
}

/// Refuses a component that cannot be stored.
///
/// # Errors
/// [`Error::DeployRefused`] for one past [`MAX_COMPONENT_BYTES`].
pub fn check_size(bytes: &[u8]) -> Result<()> {
    if bytes.len() > MAX_COMPONENT_BYTES {
        return Err(Error::DeployRefused(format!(
            "the component is {} bytes, more than the largest deployable, {MAX_COMPONENT_BYTES} bytes",
            bytes.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: i64, digest: Option<&str>, action: DeployAction) -> DeploymentEntry {
        DeploymentEntry { id, job_type: "t".into(), digest: digest.map(str::to_string), action, at: Utc::now() }
    }

    fn digest(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    #[test]
    fn a_rollback_goes_to_the_version_before_and_a_second_one_comes_back() {
        let (a, b) = (digest('a'), digest('b'));
        let mut history = vec![entry(2, Some(&b), DeployAction::Deploy), entry(1, Some(&a), DeployAction::Deploy)];
        let back = rollback_change("t", &history, None).unwrap();
        assert_eq!((back.previous.as_deref(), back.current.as_deref()), (Some(b.as_str()), Some(a.as_str())));
        history.insert(0, entry(3, Some(&a), DeployAction::Rollback));
        let again = rollback_change("t", &history, None).unwrap();
        assert_eq!(again.current.as_deref(), Some(b.as_str()));
    }

    #[test]
    fn a_rollback_after_an_undeploy_restores_what_it_removed() {
        let (a, b) = (digest('a'), digest('b'));
        let history = vec![
            entry(3, None, DeployAction::Undeploy),
            entry(2, Some(&b), DeployAction::Deploy),
            entry(1, Some(&a), DeployAction::Deploy),
        ];
        let back = rollback_change("t", &history, None).unwrap();
        assert_eq!((back.previous, back.current.as_deref()), (None, Some(b.as_str())));
    }

    #[test]
    fn rollback_refusals_say_why() {
        let (a, b) = (digest('a'), digest('b'));
        assert!(rollback_change("t", &[], None).unwrap_err().to_string().contains("never deployed"));
        let one = vec![entry(1, Some(&a), DeployAction::Deploy)];
        assert!(rollback_change("t", &one, None).unwrap_err().to_string().contains("no earlier version"));
        let two = vec![entry(2, Some(&b), DeployAction::Deploy), entry(1, Some(&a), DeployAction::Deploy)];
        assert!(rollback_change("t", &two, Some("aaaa")).unwrap_err().to_string().contains("at least 8"));
        assert!(rollback_change("t", &two, Some("cccccccc")).unwrap_err().to_string().contains("no version"));
        let to = rollback_change("t", &two, Some("AAAAAAAA")).unwrap();
        assert_eq!(to.current.as_deref(), Some(a.as_str()));
    }

    #[test]
    fn deploying_the_served_version_changes_nothing() {
        let a = digest('a');
        let history = vec![entry(1, Some(&a), DeployAction::Deploy)];
        assert!(!deploy_change(&history, &a).changed);
        assert!(deploy_change(&history, &digest('b')).changed);
        assert!(undeploy_change("t", &[entry(2, None, DeployAction::Undeploy)]).is_err());
    }
}
