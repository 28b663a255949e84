//! The audit trail (docs/audit.md): one row for every change an operator,
//! a token or an application's SQL makes (a cancel, a deploy, a grant, a
//! secret set, a schedule removed), written by the change's own
//! transaction, so a change that rolls back leaves no row and one that
//! commits cannot lose its row. A row says who (a named token, the OS user
//! and host of a CLI, the database role of SQL), from where (address, user
//! agent), what, on which object, and the outcome; never a secret's value
//! or a payload.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Cancel, DeployChange, token};

/// How long rows are kept unless configured otherwise: 90 days.
pub const DEFAULT_RETENTION: std::time::Duration = std::time::Duration::from_secs(90 * 24 * 3600);

/// The most rows one listing returns.
pub const MAX_LIST: i64 = 1000;

/// Through what a change came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// The HTTP API, with a bearer token.
    Api,
    /// A dashboard form, in a signed-in session.
    Dashboard,
    /// The `jobhost` command.
    Cli,
    /// An application's SQL, through `jobhost.schedule_upsert` and the like.
    Sql,
    /// An application's Rust code, through `jobhost::Client`.
    Library,
    /// A signed inbound webhook.
    Webhook,
}

impl Via {
    /// Every channel.
    pub const ALL: [Via; 6] = [Via::Api, Via::Dashboard, Via::Cli, Via::Sql, Via::Library, Via::Webhook];

    /// Its name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Api => "api",
            Via::Dashboard => "dashboard",
            Via::Cli => "cli",
            Via::Sql => "sql",
            Via::Library => "library",
            Via::Webhook => "webhook",
        }
    }

    /// The channel a stored name stands for.
    pub fn parse(name: &str) -> Option<Via> {
        Via::ALL.into_iter().find(|via| via.as_str() == name)
    }
}

/// Who makes a change, and from where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Actor {
    /// Through what.
    pub via: Via,
    /// A token's name, `user@host` for the CLI and the library, a
    /// database role for SQL, a webhook's name.
    pub who: String,
    /// The client's address, for HTTP.
    pub address: Option<String>,
    /// The client's `User-Agent`, for HTTP (cut to [`USER_AGENT_CHARS`]).
    pub user_agent: Option<String>,
}

/// The most characters of a user agent a row keeps.
pub const USER_AGENT_CHARS: usize = 200;

impl Actor {
    /// This process's OS user at this machine, through `via`: the CLI's
    /// and the library's actor.
    pub fn os_user(via: Via) -> Actor {
        Actor { via, who: os_user_at_host(), address: None, user_agent: None }
    }

    /// A caller over HTTP.
    pub fn http(via: Via, who: &str, address: Option<std::net::IpAddr>, user_agent: Option<&str>) -> Actor {
        Actor {
            via,
            who: who.to_string(),
            address: address.map(|a| a.to_string()),
            user_agent: user_agent.map(|ua| ua.chars().filter(|c| !c.is_control()).take(USER_AGENT_CHARS).collect()),
        }
    }

    /// The change `action` on `object`, made by this actor.
    pub fn change(&self, action: &'static str, object: impl Into<String>) -> Change<'_> {
        Change { by: self, action, object: object.into(), outcomes: ("done", "unchanged") }
    }
}

/// `$USER@hostname`, or the numeric uid where no user name is set.
pub fn os_user_at_host() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|user| !user.is_empty())
        // SAFETY: getuid(2) reads no memory and cannot fail.
        .unwrap_or_else(|| format!("uid {}", unsafe { libc::getuid() }));
    format!("{user}@{}", super::fleet::this_hostname())
}

/// One change as a backend records it with its outcome, in its own
/// transaction.
#[derive(Debug, Clone)]
pub struct Change<'a> {
    /// Who makes it.
    pub by: &'a Actor,
    /// What: `job.cancel`, `secret.set`… (docs/audit.md lists them).
    pub action: &'static str,
    /// On what: `job 42`, `queue mail`, `schedule report/customer-42`.
    pub object: String,
    /// The outcome of a change that answers true, and of one that
    /// answers false.
    pub outcomes: (&'static str, &'static str),
}

impl Change<'_> {
    /// The same change, whose true and false answers read as given.
    pub fn answering(mut self, if_true: &'static str, if_false: &'static str) -> Self {
        self.outcomes = (if_true, if_false);
        self
    }
}

/// What a change's answer says, as its row records it.
pub trait Outcome {
    /// The outcome, in a few words.
    fn outcome(&self, change: &Change<'_>) -> String;
}

impl Outcome for bool {
    fn outcome(&self, change: &Change<'_>) -> String {
        (if *self { change.outcomes.0 } else { change.outcomes.1 }).to_string()
    }
}

impl Outcome for () {
    fn outcome(&self, change: &Change<'_>) -> String {
        change.outcomes.0.to_string()
    }
}

impl Outcome for Cancel {
    fn outcome(&self, _: &Change<'_>) -> String {
        match self {
            Cancel::Cancelled => "cancelled".into(),
            Cancel::Requested => "cancel requested of its host".into(),
        }
    }
}

impl Outcome for token::Created {
    fn outcome(&self, _: &Change<'_>) -> String {
        match self {
            token::Created::Made => "created".into(),
            token::Created::NameTaken => "refused: a live token has the name".into(),
        }
    }
}

impl Outcome for DeployChange {
    fn outcome(&self, _: &Change<'_>) -> String {
        let short = |version: &Option<String>| match version {
            Some(version) => version.chars().take(12).collect::<String>(),
            None => "none".to_string(),
        };
        let (from, to) = (short(&self.previous), short(&self.current));
        if self.changed { format!("{from} -> {to}") } else { format!("unchanged: {to}") }
    }
}

impl Outcome for super::wait::SentEvent {
    fn outcome(&self, _: &Change<'_>) -> String {
        if self.duplicate {
            format!("duplicate of event {}", self.id)
        } else {
            format!("event {}: released {} waits", self.id, self.released)
        }
    }
}

impl<T: Outcome> Outcome for Option<T> {
    fn outcome(&self, change: &Change<'_>) -> String {
        match self {
            Some(done) => done.outcome(change),
            None => change.outcomes.1.to_string(),
        }
    }
}

/// One row of the trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Its id, rising with time.
    pub id: i64,
    /// When the change's transaction wrote it.
    pub at: DateTime<Utc>,
    /// Through what.
    pub via: String,
    /// Who.
    pub who: String,
    /// From which address.
    pub address: Option<String>,
    /// With which user agent.
    pub user_agent: Option<String>,
    /// What.
    pub action: String,
    /// On what.
    pub object: String,
    /// What became of it: `cancelled`, `removed`, `refused: ...`.
    pub outcome: String,
    /// How many like it the row stands for (refusals in a flood).
    pub count: i64,
}

/// A row as a backend reads it, its time as the backend stores one.
pub type Row<T> = (i64, T, String, String, Option<String>, Option<String>, String, String, String, i64);

impl Entry {
    /// The entry of a row, its time read by `time`.
    pub fn of<T>(row: Row<T>, time: impl Fn(T) -> DateTime<Utc>) -> Entry {
        let (id, at, via, who, address, user_agent, action, object, outcome, count) = row;
        Entry { id, at: time(at), via, who, address, user_agent, action, object, outcome, count }
    }
}

/// Which rows to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Written at or after.
    pub since: Option<DateTime<Utc>>,
    /// Whose (exactly).
    pub who: Option<String>,
    /// Which action, or (ending in `.`) which family: `job.`, `secret.`.
    pub action: Option<String>,
    /// Whose object contains this.
    pub object: Option<String>,
    /// Before this id (the next page).
    pub before_id: Option<i64>,
    /// At most this many (up to [`MAX_LIST`]).
    pub limit: i64,
}

impl Filter {
    /// The action filter as a SQL `LIKE` pattern: a family (`job.`) or
    /// one action exactly, with `LIKE`'s own characters escaped.
    pub fn action_pattern(&self) -> Option<String> {
        self.action.as_ref().map(|action| {
            let escaped = escape_like(action);
            if action.ends_with('.') { format!("{escaped}%") } else { escaped }
        })
    }

    /// The object filter as a SQL `LIKE` pattern matching it anywhere.
    pub fn object_pattern(&self) -> Option<String> {
        self.object.as_ref().map(|object| format!("%{}%", escape_like(object)))
    }

    /// The limit, within 1 and [`MAX_LIST`].
    pub fn bounded_limit(&self) -> i64 {
        self.limit.clamp(1, MAX_LIST)
    }
}

/// A listing's filter as a query string gives it (`/api/audit`, the
/// dashboard's page): every field optional, `since` a time in RFC 3339.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Query {
    /// Rows written at or after this time.
    pub since: Option<String>,
    /// Rows of this actor.
    pub who: Option<String>,
    /// Rows of this action, or family (`job.`).
    pub what: Option<String>,
    /// Rows whose object contains this.
    pub object: Option<String>,
    /// Rows before this id: the next page.
    pub before: Option<i64>,
    /// At most this many rows.
    pub limit: Option<i64>,
}

impl Query {
    /// The filter it asks for, `page` rows unless it names a limit.
    ///
    /// # Errors
    /// A `since` that is not a time in RFC 3339, naming it.
    pub fn filter(&self, page: i64) -> Result<Filter, String> {
        let since = match self.since.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            Some(since) => Some(
                DateTime::parse_from_rfc3339(since)
                    .map_err(|e| format!("since: {since:?} is not a time such as 2026-12-01T09:00:00Z: {e}"))?
                    .with_timezone(&Utc),
            ),
            None => None,
        };
        let given = |field: &Option<String>| field.as_ref().map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        Ok(Filter {
            since,
            who: given(&self.who),
            action: given(&self.what),
            object: given(&self.object),
            before_id: self.before,
            limit: self.limit.unwrap_or(page),
        })
    }
}

/// `text` with `LIKE`'s `%`, `_` and the escape `\` escaped.
fn escape_like(text: &str) -> String {
    text.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_filter_is_a_family_or_one_action_and_never_a_wildcard() {
        let filter = |action: &str| Filter { action: Some(action.into()), ..Filter::default() }.action_pattern();
        assert_eq!(filter("job.").as_deref(), Some("job.%"));
        assert_eq!(filter("job.cancel").as_deref(), Some("job.cancel"));
        assert_eq!(filter("%").as_deref(), Some("\\%"));
        let object = Filter { object: Some("a_b".into()), ..Filter::default() }.object_pattern();
        assert_eq!(object.as_deref(), Some("%a\\_b%"));
    }

    #[test]
    fn a_user_agent_is_cut_and_loses_control_characters() {
        let agent = format!("curl\n{}", "x".repeat(500));
        let actor = Actor::http(Via::Api, "ci", None, Some(&agent));
        let kept = actor.user_agent.unwrap();
        assert_eq!(kept.chars().count(), USER_AGENT_CHARS);
        assert!(kept.starts_with("curlx"));
    }
}
