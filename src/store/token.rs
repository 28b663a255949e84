//! Named access tokens (`jobhost token create NAME --role ROLE`): who may
//! read and change what through the HTTP API and the dashboard. The store
//! knows a token only by its value's digest; the value is shown once, when
//! it is made.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// What a token may do. Each role holds the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sees jobs, workflows, keys, schedules and history.
    Read,
    /// Also cancels, retries, enqueues, pauses and resumes queues, decides
    /// waits and triggers, pauses and resumes schedules.
    Operate,
    /// Also deploys, rolls back and undeploys components.
    Deploy,
    /// Also sets and removes schedules, and everything the CLI does to
    /// grants, secrets, variables and tokens.
    Admin,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 4] = [Role::Read, Role::Operate, Role::Deploy, Role::Admin];

    /// Its name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Deploy => "deploy",
            Role::Admin => "admin",
        }
    }

    /// The role a stored name stands for.
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == name)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who holds a live token, as a request presenting it is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHolder {
    /// The token's name.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The queues whose jobs it may change; `None` for every queue.
    pub queues: Option<Vec<String>>,
    /// Whether it is shown payloads, outputs and logs.
    pub payloads: bool,
}

impl TokenHolder {
    /// Whether it may change jobs of `queue`.
    pub fn may_touch_queue(&self, queue: &str) -> bool {
        self.queues.as_ref().is_none_or(|queues| queues.iter().any(|q| q == queue))
    }

    /// Whether it sees what jobs carry: payloads, outputs, logs. An admin
    /// always does (it could grant itself a token that does).
    pub fn sees_payloads(&self) -> bool {
        self.payloads || self.role == Role::Admin
    }
}

/// A token to make.
#[derive(Debug, Clone)]
pub struct NewToken {
    /// Its name, unique among live tokens.
    pub name: String,
    /// The SHA-256 digest of its value, in hex.
    pub digest: String,
    /// What it may do.
    pub role: Role,
    /// The queues whose jobs it may change; `None` for every queue.
    pub queues: Option<Vec<String>>,
    /// Whether it is shown payloads, outputs and logs.
    pub payloads: bool,
    /// When it stops working by itself.
    pub expires_at: Option<DateTime<Utc>>,
    /// Who made it: the OS user and host of the CLI.
    pub created_by: String,
}

/// A token as `jobhost token list` shows it: never its value or digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenInfo {
    /// Its name.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The queues whose jobs it may change; `None` for every queue.
    pub queues: Option<Vec<String>>,
    /// Whether it is shown payloads, outputs and logs.
    pub payloads: bool,
    /// When it was made.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub created_at: DateTime<Utc>,
    /// Who made it.
    pub created_by: String,
    /// When it stops working by itself.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked.
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub revoked_at: Option<DateTime<Utc>>,
    /// When a request last presented it (recorded once a minute at most).
    #[serde(serialize_with = "super::timestamp::serialize_option")]
    pub last_used_at: Option<DateTime<Utc>>,
}

/// How making a token went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// It was made.
    Made,
    /// A live token has the name: revoke it first.
    NameTaken,
}

/// The most queues one token may be limited to.
pub const MAX_QUEUES: usize = 100;

/// A token's use is recorded when the last record is older than this.
pub const TOUCH_EVERY_SECS: f64 = 60.0;

/// Checks a token's name: what the schema accepts, said before it is tried.
///
/// # Errors
/// What is wrong with it.
pub fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !first_ok || !rest_ok || name.len() > 64 {
        return Err(format!(
            "{name:?} is not a token name: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_rise_and_read_back() {
        assert!(Role::Read < Role::Operate && Role::Operate < Role::Deploy && Role::Deploy < Role::Admin);
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn a_token_limited_to_queues_touches_only_those() {
        let holder = TokenHolder {
            name: "desk".into(),
            role: Role::Operate,
            queues: Some(vec!["mail".into()]),
            payloads: false,
        };
        assert!(holder.may_touch_queue("mail"));
        assert!(!holder.may_touch_queue("billing"));
        assert!(!holder.sees_payloads());
        let admin = TokenHolder { role: Role::Admin, queues: None, ..holder };
        assert!(admin.may_touch_queue("billing") && admin.sees_payloads());
    }

    #[test]
    fn names_are_checked_as_the_schema_checks_them() {
        for good in ["ci", "support-desk", "a.b_c", &"x".repeat(64)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-ci", "two words", "é", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
