//! Who may read and who may change things.
//!
//! The API takes the token as `Authorization: Bearer TOKEN`. The dashboard
//! signs in with the token once and gets a session: a random id in an
//! HttpOnly, SameSite=Strict cookie, known to the database only by its
//! digest (so every server of a fleet accepts it, and a sign-out anywhere
//! ends it everywhere), expiring when idle and in all. Each form carries a
//! CSRF token derived from the session id, checked with the request's
//! `Origin`. A server with a token lets only signed-in sessions and bearer
//! requests read, unless it was started to read publicly.
//!
//! Secrets are compared by their SHA-256 digests, so the comparison's time
//! says nothing about them. Wrong tokens are counted per address and
//! logged; an address that sends too many is refused for a while.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::store::Store;
use crate::store::audit::{Actor, Via};
use crate::store::session::{SessionLifetime, SignedInWith};
use crate::store::token::{Role, TokenHolder};

/// The name the server's own token (`--token`, `JOBHOST_TOKEN`) goes by:
/// not a name a named token can have, so the two are never confused.
pub const SERVER_TOKEN_NAME: &str = "--token";

/// The least guessing a token may take, in bits, as estimated by
/// [`token_bits`]: `openssl rand -hex 32` gives 128.
pub const MIN_TOKEN_BITS: f64 = 64.0;

/// Refusals by address and kind: when the window began, and how many.
type RefusalTally = HashMap<(Option<IpAddr>, &'static str), (Instant, u64)>;

/// The addresses whose refusals are counted apart in one window; past
/// them, refusals from new addresses are counted together.
pub const TALLIED_ADDRESSES: usize = 10_000;

/// Wrong tokens an address may send in [`WRONG_TOKEN_WINDOW`] before it is
/// refused until the window ends.
pub const WRONG_TOKENS_ALLOWED: u32 = 10;

/// The window wrong tokens are counted in.
pub const WRONG_TOKEN_WINDOW: Duration = Duration::from_secs(60);

/// How hard a token is to guess, at most: its length times the bits of
/// one of its distinct characters. Sixteen `a`s give nothing; 32 random
/// hex digits about 128.
pub fn token_bits(token: &str) -> f64 {
    let distinct: std::collections::HashSet<char> = token.chars().collect();
    if distinct.len() < 2 {
        return 0.0;
    }
    token.chars().count() as f64 * (distinct.len() as f64).log2()
}

/// How the server admits callers, as started.
pub struct Access {
    token: Option<[u8; 32]>,
    metrics_token: Option<[u8; 32]>,
    public_read: bool,
    /// The session cookie's name, which carries the server's port: another
    /// application on the same host does not share it by accident.
    cookie: String,
    lifetime: SessionLifetime,
    wrong: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    /// Refusals per address (`None`: every address past
    /// [`TALLIED_ADDRESSES`]) and kind in the current window, as the audit
    /// trail counts them.
    refusals: Mutex<RefusalTally>,
    /// Signs the notice a form leaves for the next page: derived from the
    /// token, so every server of a fleet reads another's.
    notice_key: [u8; 32],
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The server was started without a token and the request presents
    /// no named one: nothing may change.
    ReadOnly,
    /// No token or session, or the wrong one.
    Unauthorized,
    /// A token or session whose role is below what the request needs.
    Forbidden {
        /// The role the request needs.
        needs: Role,
        /// The token presented.
        holder: String,
        /// Its role.
        has: Role,
    },
    /// A token limited to queues, asking to change another's jobs, or
    /// what spans queues.
    OutsideQueues {
        /// The token presented.
        holder: String,
        /// What it may not do.
        what: String,
    },
    /// A form without its CSRF token, or sent from another origin.
    Forged,
    /// Too many wrong tokens from this address of late.
    Throttled,
}

impl Refusal {
    /// The status it is answered with.
    pub fn status(&self) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        match self {
            Refusal::Unauthorized => StatusCode::UNAUTHORIZED,
            Refusal::Throttled => StatusCode::TOO_MANY_REQUESTS,
            Refusal::ReadOnly | Refusal::Forged | Refusal::Forbidden { .. } | Refusal::OutsideQueues { .. } => {
                StatusCode::FORBIDDEN
            }
        }
    }

    /// What the caller is told.
    pub fn message(&self) -> String {
        match self {
            Refusal::ReadOnly => "this server is read-only to callers without a named token: start it with --token \
                (or JOBHOST_TOKEN), or present a token made by `jobhost token create NAME --role ROLE`"
                .to_string(),
            Refusal::Unauthorized => {
                "this needs a token: Authorization: Bearer TOKEN, or sign in to the dashboard".to_string()
            }
            Refusal::Forbidden { needs, holder, has } => {
                format!("this needs the {needs} role; the token {holder:?} has {has}")
            }
            Refusal::OutsideQueues { holder, what } => {
                format!("the token {holder:?} is limited to some queues and may not {what}")
            }
            Refusal::Forged => {
                "the form's CSRF token is missing or wrong, or it came from another site: reload the page".to_string()
            }
            Refusal::Throttled => {
                "too many wrong tokens from this address: wait a minute before trying again".to_string()
            }
        }
    }
}

/// Who a request comes from, worked out once per request.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// Who holds the bearer token it presented, if that token is live.
    pub bearer: Option<TokenHolder>,
    /// Its signed-in dashboard session.
    pub session: Option<Session>,
    /// It presented a bearer token that is neither live nor the metrics
    /// token: counted against its address.
    pub wrong_bearer: bool,
    /// Whom its changes are recorded as in the audit trail (set by
    /// [`super::guard::admit`], which knows its address and channel).
    pub actor: Option<Actor>,
}

/// A signed-in session, as a request presents it.
#[derive(Debug, Clone)]
pub struct Session {
    /// The digest the store knows it by.
    pub digest: String,
    /// The CSRF token its forms carry.
    pub csrf: String,
    /// The token it signed in with.
    pub holder: TokenHolder,
}

/// What a presented token turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The server's own, or a live named token.
    Held(TokenHolder),
    /// The metrics token, which opens nothing but `/metrics`.
    Metrics,
    /// No live token: a wrong one.
    Unknown,
    /// The store could not be read: not counted as wrong.
    Unread,
}

/// The holder of the server's own token: an admin.
pub fn server_token_holder() -> TokenHolder {
    TokenHolder { name: SERVER_TOKEN_NAME.to_string(), role: Role::Admin, queues: None, payloads: true }
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

impl Access {
    /// Access with `token` (read-only without one), `metrics_token` for
    /// `/metrics` if given, reads open to all when `public_read`, and the
    /// session cookie of the server at `port`.
    pub fn new(
        token: Option<&str>,
        metrics_token: Option<&str>,
        public_read: bool,
        port: u16,
        lifetime: SessionLifetime,
    ) -> Access {
        Access {
            token: token.map(|t| digest(t.trim())),
            metrics_token: metrics_token.map(|t| digest(t.trim())),
            public_read,
            cookie: format!("jobhost_session_{port}"),
            lifetime,
            wrong: Mutex::new(HashMap::new()),
            refusals: Mutex::new(HashMap::new()),
            notice_key: digest(&format!("jobhost notice\n{}", token.map(str::trim).unwrap_or_default())),
        }
    }

    /// A notice as its cookie carries it: the text, and its signature.
    pub fn notice_value(&self, text: &str) -> String {
        format!("{}.{}", hex::encode(text), hex::encode(self.notice_mac(text.as_bytes())))
    }

    /// The notice a cookie carries, if this server (or another with its
    /// token) signed it: another page on the host can set the cookie, but
    /// not put words in it.
    pub fn notice_read(&self, value: &str) -> Option<String> {
        let (text, signature) = value.split_once('.')?;
        let text = hex::decode(text).ok()?;
        let signature = hex::decode(signature).ok()?;
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.notice_key).ok()?;
        mac.update(&text);
        mac.verify_slice(&signature).ok()?;
        String::from_utf8(text).ok()
    }

    fn notice_mac(&self, text: &[u8]) -> Vec<u8> {
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&self.notice_key).expect("HMAC takes a key of any length");
        mac.update(text);
        mac.finalize().into_bytes().to_vec()
    }

    /// Whether changes can be made at all.
    pub fn writable(&self) -> bool {
        self.token.is_some()
    }

    /// Whether reads need a token or a session.
    pub fn reads_need_login(&self) -> bool {
        self.token.is_some() && !self.public_read
    }

    /// The bearer token a request presents, if any.
    fn bearer(headers: &HeaderMap) -> Option<&str> {
        headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.get(..7).filter(|scheme| scheme.eq_ignore_ascii_case("bearer ")).map(|_| v[7..].trim()))
    }

    /// Whether the request bears the server's own token.
    #[cfg(test)]
    fn bears_server_token(&self, headers: &HeaderMap) -> bool {
        self.token.is_some_and(|token| Self::bearer(headers).is_some_and(|presented| digest(presented) == token))
    }

    /// Whether a request may scrape `/metrics`: with no metrics token, any;
    /// with one, a request bearing it, or bearing a live token of any role.
    pub fn may_scrape(&self, headers: &HeaderMap, caller: &Caller) -> bool {
        let Some(metrics) = &self.metrics_token else { return true };
        caller.bearer.is_some() || Self::bearer(headers).is_some_and(|presented| digest(presented) == *metrics)
    }

    /// Who holds `token`: the server's own, or a live named token.
    pub async fn holder_of(&self, store: &Store, token: &str) -> Lookup {
        let presented = digest(token.trim());
        if self.token == Some(presented) {
            return Lookup::Held(server_token_holder());
        }
        if self.metrics_token == Some(presented) {
            return Lookup::Metrics;
        }
        match store.token_holder(&hex::encode(presented)).await {
            Ok(Some(holder)) => Lookup::Held(holder),
            Ok(None) => Lookup::Unknown,
            Err(error) => {
                tracing::warn!(%error, "cannot read the named tokens; taking the request as bearing none");
                Lookup::Unread
            }
        }
    }

    /// Who the request comes from: the holder of its bearer token, and its
    /// session if the store knows it and neither it nor its token has
    /// expired. A store that cannot be read signs no one in, and counts no
    /// token as wrong.
    pub async fn caller(&self, store: &Store, headers: &HeaderMap) -> Caller {
        let lookup = match Self::bearer(headers) {
            Some(token) => self.holder_of(store, token).await,
            None => Lookup::Unknown,
        };
        let wrong_bearer = Self::bearer(headers).is_some() && matches!(lookup, Lookup::Unknown);
        let bearer = match lookup {
            Lookup::Held(holder) => Some(holder),
            _ => None,
        };
        let Some(id) = cookie(headers, &self.cookie) else {
            return Caller { bearer, session: None, wrong_bearer, actor: None };
        };
        let digest_hex = hex::encode(digest(id));
        let signed_in = match store.session_check(&digest_hex, self.lifetime).await {
            Ok(signed_in) => signed_in,
            Err(error) => {
                tracing::warn!(%error, "cannot read the dashboard's sessions; taking the request as not signed in");
                None
            }
        };
        // A session of the server's own token ends when the server has none.
        let holder = signed_in.and_then(|s| s.token.or_else(|| self.token.map(|_| server_token_holder())));
        let session = holder.map(|holder| Session { digest: digest_hex, csrf: csrf_of(id), holder });
        Caller { bearer, session, wrong_bearer, actor: None }
    }

    /// Starts a session for whoever holds `token`: its cookie's value,
    /// stored by its digest; `None` when a named token is no longer live
    /// (revoked, or made again under its name, since it was checked), and
    /// the session then ends with its token.
    ///
    /// # Errors
    /// The store's.
    pub async fn sign_in(
        &self,
        store: &Store,
        token: &str,
        holder: &TokenHolder,
    ) -> crate::store::Result<Option<String>> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the operating system's random numbers");
        let id = hex::encode(bytes);
        let with = (holder.name != SERVER_TOKEN_NAME)
            .then(|| SignedInWith { name: holder.name.clone(), digest: hex::encode(digest(token.trim())) });
        let started = store.session_create(&hex::encode(digest(&id)), self.lifetime, with.as_ref()).await?;
        Ok(started.then_some(id))
    }

    /// The cookie carrying session `id`: this server's name, for the
    /// session's whole life, never to scripts or other sites, and over
    /// TLS only when the request came over it.
    pub fn session_cookie(&self, id: &str, secure: bool) -> String {
        let secure = if secure { "; Secure" } else { "" };
        format!(
            "{}={id}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{secure}",
            self.cookie,
            self.lifetime.absolute.as_secs()
        )
    }

    /// The cookie that removes the session's from the browser.
    pub fn cleared_cookie(&self) -> String {
        format!("{}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict", self.cookie)
    }

    /// Counts a wrong token from `from`, logging it, and says whether the
    /// address is now refused for the rest of the window.
    pub fn wrong_token(&self, from: Option<IpAddr>, what: &str) -> bool {
        let Some(from) = from else { return false };
        let mut wrong = self.wrong.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        wrong.retain(|_, (since, _)| now.duration_since(*since) < WRONG_TOKEN_WINDOW);
        let (_, count) = wrong.entry(from).or_insert((now, 0));
        *count += 1;
        if *count == 1 || *count % WRONG_TOKENS_ALLOWED == 0 {
            tracing::warn!(address = %from, count = *count, what, "a wrong token was presented");
        }
        *count > WRONG_TOKENS_ALLOWED
    }

    /// Counts a refusal of `kind` from `from` and says whether it gets a
    /// row in the audit trail, with the count the row carries: the first of
    /// a window does, then the 10th, the 100th, the 1,000th…, each row
    /// carrying the window's count so far, so a flood writes a handful of
    /// rows and its last row says how big it grew.
    pub fn tally_refusal(&self, from: Option<IpAddr>, kind: &'static str) -> Option<u64> {
        let mut tally = self.refusals.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        tally.retain(|_, (since, _)| now.duration_since(*since) < WRONG_TOKEN_WINDOW);
        let from = from.filter(|from| tally.contains_key(&(Some(*from), kind)) || tally.len() < TALLIED_ADDRESSES);
        let (_, count) = tally.entry((from, kind)).or_insert((now, 0));
        *count += 1;
        let mut power = 1;
        while power < *count {
            power *= 10;
        }
        (power == *count).then_some(*count)
    }

    /// Records a refused request in the audit trail as `action`, a
    /// bounded number of rows however many come ([`Self::tally_refusal`]):
    /// its channel, headers, and method and path as `target`. A trail that
    /// cannot be written refuses the request all the same.
    #[allow(clippy::too_many_arguments)]
    pub async fn record_refused(
        &self,
        store: &Store,
        via: Via,
        headers: &HeaderMap,
        target: &str,
        from: Option<IpAddr>,
        who: &str,
        action: &'static str,
        outcome: &str,
    ) {
        let Some(count) = self.tally_refusal(from, action) else { return };
        let actor = Actor::http(via, who, from, user_agent(headers));
        let change = actor.change(action, target.chars().take(200).collect::<String>());
        if let Err(error) = store.audit_record(&change, outcome, i64::try_from(count).unwrap_or(i64::MAX)).await {
            tracing::warn!(%error, action, "cannot record a refused request in the audit trail");
        }
    }

    /// Whether `from` sent too many wrong tokens of late.
    pub fn throttled(&self, from: Option<IpAddr>) -> bool {
        let Some(from) = from else { return false };
        let wrong = self.wrong.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        wrong
            .get(&from)
            .is_some_and(|(since, count)| *count > WRONG_TOKENS_ALLOWED && since.elapsed() < WRONG_TOKEN_WINDOW)
    }
}

impl Caller {
    /// The store, its changes recorded in the audit trail as this caller's.
    pub fn store(&self, store: &Store) -> Store {
        match &self.actor {
            Some(actor) => store.acting_as(actor.clone()),
            None => store.clone(),
        }
    }

    /// Whether the request may read what the server shows.
    pub fn may_read(&self, access: &Access) -> bool {
        !access.reads_need_login() || self.bearer.is_some() || self.session.is_some()
    }

    /// The CSRF token of its session's forms.
    pub fn csrf(&self) -> Option<&str> {
        self.session.as_ref().map(|s| s.csrf.as_str())
    }

    /// Who the request acts as: its bearer token's holder for the API, its
    /// session's for the dashboard's forms (which a bearer token cannot
    /// send, and a session cannot send to the API, so no page of another
    /// site can act through the browser).
    pub fn acting(&self, api: bool) -> Option<&TokenHolder> {
        if api { self.bearer.as_ref() } else { self.session.as_ref().map(|s| &s.holder) }
    }

    /// Whether the request is shown payloads, outputs and logs: by its
    /// bearer token if it presents one, else by its session. A request with
    /// neither, on a server that lets such read, is shown them, as before
    /// roles.
    pub fn sees_payloads(&self) -> bool {
        let holder = self.bearer.as_ref().or(self.session.as_ref().map(|s| &s.holder));
        holder.is_none_or(TokenHolder::sees_payloads)
    }

    /// Checks that the request may act with `needs`.
    pub fn check_role(&self, access: &Access, api: bool, needs: Role) -> Result<&TokenHolder, Refusal> {
        match self.acting(api) {
            Some(holder) if holder.role >= needs => Ok(holder),
            Some(holder) => Err(Refusal::Forbidden { needs, holder: holder.name.clone(), has: holder.role }),
            None if !access.writable() && !self.wrong_bearer => Err(Refusal::ReadOnly),
            None => Err(Refusal::Unauthorized),
        }
    }

    /// Checks a dashboard form: a signed-in session, its CSRF token, and
    /// an `Origin` (when the browser sends one) of this very server.
    pub fn check_form(&self, headers: &HeaderMap, csrf: &str) -> Result<(), Refusal> {
        let session = self.session.as_ref().ok_or(Refusal::Unauthorized)?;
        if digest(csrf) != digest(&session.csrf) || !same_origin(headers) {
            return Err(Refusal::Forged);
        }
        Ok(())
    }
}

/// Checks that `holder` may change jobs of `queue`: any queue for a token
/// not limited to some, only its own for one that is, and nothing that
/// spans queues (`queue` is `None`) for one that is.
///
/// # Errors
/// [`Refusal::OutsideQueues`], naming what was refused.
pub fn within_queues(holder: &TokenHolder, queue: Option<&str>, what: &str) -> Result<(), Refusal> {
    let allowed = match queue {
        Some(queue) => holder.may_touch_queue(queue),
        None => holder.queues.is_none(),
    };
    if allowed {
        return Ok(());
    }
    let what = match queue {
        Some(queue) => format!("{what} in queue {queue:?}"),
        None => what.to_string(),
    };
    Err(Refusal::OutsideQueues { holder: holder.name.clone(), what })
}

/// A request's `User-Agent`, if it reads as text.
pub fn user_agent(headers: &HeaderMap) -> Option<&str> {
    headers.get(axum::http::header::USER_AGENT).and_then(|v| v.to_str().ok())
}

/// The CSRF token of session `id`: derived from the id, which only the
/// browser and this request know.
fn csrf_of(id: &str) -> String {
    hex::encode(digest(&format!("jobhost csrf\n{id}")))
}

/// A cookie's value from the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// True when the request has no `Origin` (same-origin form posts from old
/// browsers, and clients that are not browsers) or one naming this host.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let Some(host) = headers.get(HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) == Some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const TOKEN: &str = "a-token-long-enough";

    fn access(token: Option<&str>) -> Access {
        Access::new(token, None, false, 8080, SessionLifetime::default())
    }

    fn headers(pairs: &[(axum::http::HeaderName, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_token_too_easy_to_guess_is_told_apart() {
        assert_eq!(token_bits(&"a".repeat(16)), 0.0);
        assert!(token_bits("abababababababab") < MIN_TOKEN_BITS);
        assert!(token_bits(TOKEN) >= MIN_TOKEN_BITS);
        assert!(token_bits("3f9c0a7d1b2e4c6f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f") > 128.0);
    }

    fn holder(role: Role) -> TokenHolder {
        TokenHolder { name: "desk".into(), role, queues: None, payloads: false }
    }

    #[test]
    fn without_a_token_nothing_changes_but_by_a_named_token_and_reads_are_open() {
        let access = access(None);
        assert!(!access.bears_server_token(&headers(&[(AUTHORIZATION, "Bearer anything-at-all-here")])));
        assert!(Caller::default().may_read(&access));
        assert_eq!(Caller::default().check_role(&access, true, Role::Operate), Err(Refusal::ReadOnly));
        let named = Caller { bearer: Some(holder(Role::Operate)), ..Caller::default() };
        assert!(named.check_role(&access, true, Role::Operate).is_ok());
    }

    #[test]
    fn the_server_token_is_an_admin_and_reads_need_a_token() {
        let access = access(Some(TOKEN));
        assert!(!access.bears_server_token(&headers(&[])));
        assert!(!access.bears_server_token(&headers(&[(AUTHORIZATION, "Bearer wrong")])));
        assert!(access.bears_server_token(&headers(&[(AUTHORIZATION, &format!("Bearer {TOKEN}"))])));
        assert!(!Caller::default().may_read(&access));
        assert_eq!(Caller::default().check_role(&access, true, Role::Read), Err(Refusal::Unauthorized));
        let server = Caller { bearer: Some(server_token_holder()), ..Caller::default() };
        assert!(server.may_read(&access));
        assert!(server.check_role(&access, true, Role::Admin).is_ok());
        let public = Access::new(Some(TOKEN), None, true, 8080, SessionLifetime::default());
        assert!(Caller::default().may_read(&public));
    }

    #[test]
    fn a_role_below_the_need_is_refused_naming_both() {
        let access = access(Some(TOKEN));
        let reader = Caller { bearer: Some(holder(Role::Read)), ..Caller::default() };
        let refusal = reader.check_role(&access, true, Role::Operate).unwrap_err();
        assert_eq!(refusal.status(), axum::http::StatusCode::FORBIDDEN);
        assert_eq!(refusal.message(), "this needs the operate role; the token \"desk\" has read");
        // A bearer token acts through the API only, a session through forms only.
        assert_eq!(reader.check_role(&access, false, Role::Read), Err(Refusal::Unauthorized));
    }

    #[test]
    fn a_token_limited_to_queues_acts_on_those_only() {
        let limited = TokenHolder { queues: Some(vec!["mail".into()]), ..holder(Role::Operate) };
        assert!(within_queues(&limited, Some("mail"), "cancel a job").is_ok());
        let refusal = within_queues(&limited, Some("billing"), "cancel a job").unwrap_err();
        assert!(refusal.message().contains("may not cancel a job in queue \"billing\""), "{}", refusal.message());
        assert!(within_queues(&limited, None, "send an event").is_err());
        assert!(within_queues(&holder(Role::Operate), None, "send an event").is_ok());
    }

    #[test]
    fn a_form_needs_the_session_its_csrf_token_and_this_origin() {
        let session = Session { digest: "d".into(), csrf: csrf_of("an-id"), holder: holder(Role::Operate) };
        let caller = Caller { session: Some(session), ..Caller::default() };
        let here = headers(&[(HOST, "127.0.0.1:8080")]);
        let csrf = caller.csrf().unwrap().to_string();
        assert_eq!(caller.check_form(&here, &csrf), Ok(()));
        assert_eq!(caller.check_form(&here, "guess"), Err(Refusal::Forged));
        assert_eq!(Caller::default().check_form(&here, &csrf), Err(Refusal::Unauthorized));
        let elsewhere = headers(&[(HOST, "127.0.0.1:8080"), (ORIGIN, "http://evil.example")]);
        assert_eq!(caller.check_form(&elsewhere, &csrf), Err(Refusal::Forged));
        let origin = headers(&[(HOST, "127.0.0.1:8080"), (ORIGIN, "http://127.0.0.1:8080")]);
        assert_eq!(caller.check_form(&origin, &csrf), Ok(()));
    }

    #[test]
    fn an_address_sending_wrong_tokens_is_refused_for_a_while() {
        let access = access(Some(TOKEN));
        let from = Some("192.0.2.7".parse().unwrap());
        for _ in 0..WRONG_TOKENS_ALLOWED {
            assert!(!access.wrong_token(from, "test"));
        }
        assert!(!access.throttled(Some("192.0.2.8".parse().unwrap())), "another address is not");
        assert!(access.wrong_token(from, "test"));
        assert!(access.throttled(from));
    }
}
