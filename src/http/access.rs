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
use crate::store::session::SessionLifetime;

/// The least guessing a token may take, in bits, as estimated by
/// [`token_bits`]: `openssl rand -hex 32` gives 128.
pub const MIN_TOKEN_BITS: f64 = 64.0;

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
    /// Signs the notice a form leaves for the next page: derived from the
    /// token, so every server of a fleet reads another's.
    notice_key: [u8; 32],
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The server was started without a token: nothing may change.
    ReadOnly,
    /// No token or session, or the wrong one.
    Unauthorized,
    /// A form without its CSRF token, or sent from another origin.
    Forged,
    /// Too many wrong tokens from this address of late.
    Throttled,
}

impl Refusal {
    /// What the caller is told.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::ReadOnly => "this server is read-only: start it with --token (or JOBHOST_TOKEN) to allow changes",
            Refusal::Unauthorized => "this needs the token: Authorization: Bearer TOKEN, or sign in to the dashboard",
            Refusal::Forged => {
                "the form's CSRF token is missing or wrong, or it came from another site: reload the page"
            }
            Refusal::Throttled => "too many wrong tokens from this address: wait a minute before trying again",
        }
    }
}

/// Who a request comes from, worked out once per request.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// It presented this server's token as a bearer token.
    pub bearer: bool,
    /// Its signed-in dashboard session.
    pub session: Option<Session>,
}

/// A signed-in session, as a request presents it.
#[derive(Debug, Clone)]
pub struct Session {
    /// The digest the store knows it by.
    pub digest: String,
    /// The CSRF token its forms carry.
    pub csrf: String,
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

    /// Checks an API request's bearer token.
    pub fn check_bearer(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let token = self.token.as_ref().ok_or(Refusal::ReadOnly)?;
        let presented = Self::bearer(headers).ok_or(Refusal::Unauthorized)?;
        if digest(presented) == *token { Ok(()) } else { Err(Refusal::Unauthorized) }
    }

    /// Whether a request may scrape `/metrics`: with no metrics token, any;
    /// with one, a request bearing it or the server's token.
    pub fn may_scrape(&self, headers: &HeaderMap) -> bool {
        let Some(metrics) = &self.metrics_token else { return true };
        Self::bearer(headers).is_some_and(|presented| {
            let presented = digest(presented);
            presented == *metrics || self.token.is_some_and(|token| presented == token)
        })
    }

    /// Whether a request carries a bearer token that is not this server's.
    pub fn wrong_bearer(&self, headers: &HeaderMap) -> bool {
        Self::bearer(headers).is_some_and(|presented| {
            let presented = digest(presented);
            self.token != Some(presented) && self.metrics_token != Some(presented)
        })
    }

    /// Whether `token` is this server's: signing in to the dashboard.
    pub fn token_matches(&self, token: &str) -> bool {
        self.token.is_some_and(|mine| digest(token.trim()) == mine)
    }

    /// Who the request comes from: its bearer token, and its session if
    /// the store knows it and it has not expired. A store that cannot be
    /// read signs no one in.
    pub async fn caller(&self, store: &Store, headers: &HeaderMap) -> Caller {
        let bearer = self.check_bearer(headers).is_ok();
        let Some(id) = cookie(headers, &self.cookie).filter(|_| self.writable()) else {
            return Caller { bearer, session: None };
        };
        let session = Session { digest: hex::encode(digest(id)), csrf: csrf_of(id) };
        let session = match store.session_check(&session.digest, self.lifetime).await {
            Ok(true) => Some(session),
            Ok(false) => None,
            Err(error) => {
                tracing::warn!(%error, "cannot read the dashboard's sessions; taking the request as not signed in");
                None
            }
        };
        Caller { bearer, session }
    }

    /// Starts a session: its cookie's value, stored by its digest.
    ///
    /// # Errors
    /// The store's.
    pub async fn sign_in(&self, store: &Store) -> crate::store::Result<String> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the operating system's random numbers");
        let id = hex::encode(bytes);
        store.session_create(&hex::encode(digest(&id)), self.lifetime).await?;
        Ok(id)
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
    /// Whether the request may read what the server shows.
    pub fn may_read(&self, access: &Access) -> bool {
        !access.reads_need_login() || self.bearer || self.session.is_some()
    }

    /// The CSRF token of its session's forms.
    pub fn csrf(&self) -> Option<&str> {
        self.session.as_ref().map(|s| s.csrf.as_str())
    }

    /// Checks a dashboard form: a signed-in session, its CSRF token, and
    /// an `Origin` (when the browser sends one) of this very server.
    pub fn check_form(&self, access: &Access, headers: &HeaderMap, csrf: &str) -> Result<(), Refusal> {
        if !access.writable() {
            return Err(Refusal::ReadOnly);
        }
        let session = self.session.as_ref().ok_or(Refusal::Unauthorized)?;
        if digest(csrf) != digest(&session.csrf) || !same_origin(headers) {
            return Err(Refusal::Forged);
        }
        Ok(())
    }
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

    #[test]
    fn without_a_token_nothing_changes_and_reads_are_open() {
        let access = access(None);
        let bearer = headers(&[(AUTHORIZATION, "Bearer anything-at-all-here")]);
        assert_eq!(access.check_bearer(&bearer), Err(Refusal::ReadOnly));
        assert!(!access.token_matches("anything-at-all-here"));
        assert!(Caller::default().may_read(&access));
    }

    #[test]
    fn the_bearer_token_must_match_and_reads_need_it() {
        let access = access(Some(TOKEN));
        assert_eq!(access.check_bearer(&headers(&[])), Err(Refusal::Unauthorized));
        assert_eq!(access.check_bearer(&headers(&[(AUTHORIZATION, "Bearer wrong")])), Err(Refusal::Unauthorized));
        assert_eq!(access.check_bearer(&headers(&[(AUTHORIZATION, &format!("Bearer {TOKEN}"))])), Ok(()));
        assert!(!Caller::default().may_read(&access));
        assert!(Caller { bearer: true, session: None }.may_read(&access));
        let public = Access::new(Some(TOKEN), None, true, 8080, SessionLifetime::default());
        assert!(Caller::default().may_read(&public));
    }

    #[test]
    fn a_form_needs_the_session_its_csrf_token_and_this_origin() {
        let access = access(Some(TOKEN));
        let session = Session { digest: "d".into(), csrf: csrf_of("an-id") };
        let caller = Caller { bearer: false, session: Some(session) };
        let here = headers(&[(HOST, "127.0.0.1:8080")]);
        let csrf = caller.csrf().unwrap().to_string();
        assert_eq!(caller.check_form(&access, &here, &csrf), Ok(()));
        assert_eq!(caller.check_form(&access, &here, "guess"), Err(Refusal::Forged));
        assert_eq!(Caller::default().check_form(&access, &here, &csrf), Err(Refusal::Unauthorized));
        let elsewhere = headers(&[(HOST, "127.0.0.1:8080"), (ORIGIN, "http://evil.example")]);
        assert_eq!(caller.check_form(&access, &elsewhere, &csrf), Err(Refusal::Forged));
        let origin = headers(&[(HOST, "127.0.0.1:8080"), (ORIGIN, "http://127.0.0.1:8080")]);
        assert_eq!(caller.check_form(&access, &origin, &csrf), Ok(()));
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
