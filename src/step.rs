//! What a workflow step is declared as, wherever it comes from (a file, an
//! HTTP body, the Rust client, a running job's `workflows.add-step`): its
//! job, its payload and options, and the steps it waits for with their
//! policies. The store checks and writes them (`store::workflow`).

use serde::{Deserialize, Deserializer, Serialize};

/// The most steps one workflow is created with, and one run adds.
pub const MAX_WORKFLOW_STEPS: usize = 10_000;

/// The longest step name given, in bytes.
pub const MAX_STEP_NAME_BYTES: usize = 128;

/// The longest name a step a run adds to its own workflow is stored
/// under (`STEP/NAME`, nested as steps grow steps), in bytes.
pub const MAX_GROWN_STEP_NAME_BYTES: usize = 1024;

/// The longest label, in bytes.
pub const MAX_WORKFLOW_LABEL_BYTES: usize = 256;

/// The payload key a released step finds its dependencies' outputs under.
pub const DEPS_KEY: &str = "_deps";

/// The payload key naming the dependencies that did not complete.
pub const DEPS_FAILED_KEY: &str = "_deps_failed";

/// The payload key a step that waited for an event finds its payload under.
pub const EVENT_KEY: &str = "_event";

/// The longest event key, in bytes.
pub const MAX_EVENT_KEY_BYTES: usize = 256;

/// The most payload fields one wait matches.
pub const MAX_MATCH_FIELDS: usize = 16;

/// The longest wait a step may declare (a timeout, a look back, a sleep):
/// 100 years, within what both databases' times hold.
pub const MAX_WAIT_MS: u64 = 100 * 365 * 86_400_000;

/// Checks a step's name as given: 1 to 128 bytes of letters, digits, `_`,
/// `-`, `.` and `:`. (`/` is left for the names of steps a run adds to its
/// own workflow, `STEP/NAME`, so those never collide with a given one.)
///
/// # Errors
/// The name breaks the rule, said in words.
pub fn check_step_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
    if name.is_empty() || name.len() > MAX_STEP_NAME_BYTES || !name.chars().all(allowed) {
        return Err(format!(
            "step name {name:?} must be 1 to {MAX_STEP_NAME_BYTES} letters, digits, '_', '-', '.' or ':'"
        ));
    }
    Ok(())
}

/// One step: a job to enqueue once its dependencies have ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewStep {
    /// Unique in its workflow: 1 to 128 bytes of letters, digits, `_`, `-`, `.` and `:`.
    pub name: String,
    /// The job type.
    pub job: String,
    /// The payload object (`{}` when left out); `_deps` is added when it is released.
    #[serde(default = "empty_object")]
    pub payload: serde_json::Value,
    /// Overrides the type's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Overrides the type's priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i16>,
    /// How long after its release it runs, in milliseconds (`"delay": "30s"` in JSON).
    #[serde(default, rename = "delay", with = "delay_text", skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// The steps it waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<Dependency>,
    /// What it does when a dependency does not complete, unless that
    /// dependency says otherwise: `cancel` when neither says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_failed: Option<IfFailed>,
    /// What it waits for besides its dependencies, once they have ended:
    /// a time or an event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Wait>,
}

impl NewStep {
    /// A step running `job` with `payload`, depending on nothing yet.
    pub fn new(name: impl Into<String>, job: impl Into<String>, payload: serde_json::Value) -> NewStep {
        NewStep {
            name: name.into(),
            job: job.into(),
            payload,
            queue: None,
            priority: None,
            delay_ms: None,
            after: Vec::new(),
            if_failed: None,
            wait: None,
        }
    }

    /// The same step, waiting for `wait` once its dependencies have ended.
    pub fn wait(mut self, wait: Wait) -> NewStep {
        self.wait = Some(wait);
        self
    }

    /// The same step, waiting for `steps` under the step's policy.
    pub fn after<S: Into<String>>(mut self, steps: impl IntoIterator<Item = S>) -> NewStep {
        self.after.extend(steps.into_iter().map(|step| Dependency { step: step.into(), if_failed: None }));
        self
    }
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// A durable wait: a step that has one is released only once its
/// dependencies have ended *and* its wait has ended, by its time, its event
/// or its timeout (exactly one of them: guarantee 17). Nothing runs and no
/// host holds anything while it waits; the database's clock decides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wait {
    /// Waits for an event with this key (`order.confirmed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Fields the event's payload must hold, each a template of the step's
    /// own payload fields (`{"order_id": "{order_id}"}`), rendered when the
    /// workflow is created and compared as text.
    #[serde(default, rename = "match", skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub matching: std::collections::BTreeMap<String, String>,
    /// How long an event wait lasts once armed (`"3d"`); none: for ever.
    #[serde(default, rename = "timeout", with = "delay_text", skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// What the step does when its event wait times out: `fail` (the
    /// default), `cancel`, or `run` without an event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<IfFailed>,
    /// An event sent this long before the wait was armed still matches
    /// (`"10m"`); none by default.
    #[serde(default, rename = "lookback", with = "delay_text", skip_serializing_if = "Option::is_none")]
    pub lookback_ms: Option<u64>,
    /// Sleeps this long after the dependencies have ended (`"24h"`).
    #[serde(default, rename = "sleep", with = "delay_text", skip_serializing_if = "Option::is_none")]
    pub sleep_ms: Option<u64>,
    /// Sleeps until this instant (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

impl Wait {
    /// A wait for an event with `key`.
    pub fn event(key: impl Into<String>) -> Wait {
        Wait { event: Some(key.into()), ..Wait::default() }
    }

    /// A sleep of `ms` milliseconds after the dependencies have ended.
    pub fn sleep_ms(ms: u64) -> Wait {
        Wait { sleep_ms: Some(ms), ..Wait::default() }
    }

    /// Checks its shape: exactly one of `event`, `sleep` and `until`; the
    /// event's options only with an event; a key of 1 to 256 bytes without
    /// control characters; at most 16 match fields.
    ///
    /// # Errors
    /// The rule broken, in words.
    pub fn check(&self) -> Result<(), String> {
        let kinds = [self.event.is_some(), self.sleep_ms.is_some(), self.until.is_some()];
        if kinds.iter().filter(|&&k| k).count() != 1 {
            return Err("a wait has exactly one of \"event\", \"sleep\" and \"until\"".into());
        }
        match &self.event {
            Some(key) => check_event_key(key)?,
            None if !self.matching.is_empty()
                || self.timeout_ms.is_some()
                || self.on_timeout.is_some()
                || self.lookback_ms.is_some() =>
            {
                return Err("\"match\", \"timeout\", \"on_timeout\" and \"lookback\" go with an \"event\" wait".into());
            }
            None => {}
        }
        let spans = [("timeout", self.timeout_ms), ("lookback", self.lookback_ms), ("sleep", self.sleep_ms)];
        if let Some((what, _)) = spans.iter().find(|(_, ms)| ms.is_some_and(|ms| ms > MAX_WAIT_MS)) {
            return Err(format!("a wait's {what} is at most 100 years"));
        }
        if self.matching.len() > MAX_MATCH_FIELDS {
            return Err(format!("a wait matches at most {MAX_MATCH_FIELDS} fields"));
        }
        if let Some(field) = self.matching.keys().find(|f| f.is_empty() || f.len() > MAX_EVENT_KEY_BYTES) {
            return Err(format!("match field {field:?} must be 1 to {MAX_EVENT_KEY_BYTES} bytes"));
        }
        Ok(())
    }
}

/// Checks an event's key: 1 to 256 bytes, no control characters.
///
/// # Errors
/// The rule broken, in words.
pub fn check_event_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_EVENT_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(format!("event key {key:?} must be 1 to {MAX_EVENT_KEY_BYTES} bytes without control characters"));
    }
    Ok(())
}

/// `"30s"`-style delays.
mod delay_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
        let text: Option<String> = Option::deserialize(deserializer)?;
        text.map(|t| humantime::parse_duration(&t).map(|d| d.as_millis() as u64).map_err(serde::de::Error::custom))
            .transpose()
    }

    pub fn serialize<S: Serializer>(ms: &Option<u64>, serializer: S) -> Result<S::Ok, S::Error> {
        match ms {
            Some(ms) => serializer.serialize_str(&format!("{ms}ms")),
            None => serializer.serialize_none(),
        }
    }
}

/// A step waited for, and what to do if it does not complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dependency {
    /// The step's name.
    pub step: String,
    /// Overrides the dependent's policy for this dependency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub if_failed: Option<IfFailed>,
}

/// `"name"` or `{"step": "name", "if_failed": "run"}`.
impl<'de> Deserialize<'de> for Dependency {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            step: String,
            #[serde(default)]
            if_failed: Option<IfFailed>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Name(String),
            Full(Full),
        }
        match Either::deserialize(deserializer).map_err(|_| {
            serde::de::Error::custom(r#"a dependency is a step's name or {"step": NAME, "if_failed": POLICY}"#)
        })? {
            Either::Name(step) => Ok(Dependency { step, if_failed: None }),
            Either::Full(full) => Ok(Dependency { step: full.step, if_failed: full.if_failed }),
        }
    }
}

/// What a dependent does when a dependency failed after its last attempt,
/// was discarded or was cancelled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IfFailed {
    /// It is cancelled, and in turn its own dependents decide.
    #[default]
    Cancel,
    /// It runs anyway; `_deps` carries that dependency's state and error.
    Run,
    /// It fails, naming the dependency.
    Fail,
}

impl IfFailed {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            IfFailed::Cancel => "cancel",
            IfFailed::Run => "run",
            IfFailed::Fail => "fail",
        }
    }
}
