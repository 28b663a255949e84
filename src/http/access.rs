//! Who may change things. The API takes the token as `Authorization:
//! Bearer TOKEN`. The dashboard signs in once with the token and keeps a
//! session cookie derived from it (HttpOnly, SameSite=Strict), and each of
//! its forms carries a CSRF token derived from it too, checked with the
//! request's `Origin`: another site can neither send the cookie nor know
//! the form's token. Secrets are compared by their SHA-256 digests, so
//! the comparison's time says nothing about the token.

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};
use sha2::{Digest, Sha256};

/// The shortest token accepted: long enough that guessing it is hopeless.
pub const MIN_TOKEN_LENGTH: usize = 16;

/// The dashboard's session cookie.
pub const SESSION_COOKIE: &str = "jobhost_session";

/// The token's derivatives, or nothing on a read-only server.
pub struct Access {
    keys: Option<Keys>,
}

struct Keys {
    token: [u8; 32],
    session: String,
    csrf: String,
}

/// Why a change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The server was started without a token: nothing may change.
    ReadOnly,
    /// No token, or the wrong one.
    Unauthorized,
    /// A form without its CSRF token, or sent from another origin.
    Forged,
}

impl Refusal {
    /// What the caller is told.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::ReadOnly => "this server is read-only: start it with --token (or JOBHOST_TOKEN) to allow changes",
            Refusal::Unauthorized => "this request changes something and needs the token: Authorization: Bearer TOKEN",
            Refusal::Forged => {
                "the form's CSRF token is missing or wrong, or it came from another site: reload the page"
            }
        }
    }
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

impl Access {
    /// Access with `token`, or read-only without one; `None` for a token
    /// shorter than [`MIN_TOKEN_LENGTH`].
    pub fn new(token: Option<&str>) -> Option<Access> {
        let Some(token) = token.map(str::trim) else {
            return Some(Access { keys: None });
        };
        if token.chars().count() < MIN_TOKEN_LENGTH {
            return None;
        }
        Some(Access {
            keys: Some(Keys {
                token: digest(token),
                session: hex::encode(digest(&format!("jobhost session\n{token}"))),
                csrf: hex::encode(digest(&format!("jobhost csrf\n{token}"))),
            }),
        })
    }

    /// Whether changes can be made at all.
    pub fn writable(&self) -> bool {
        self.keys.is_some()
    }

    /// Checks an API request's bearer token.
    pub fn check_bearer(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let keys = self.keys.as_ref().ok_or(Refusal::ReadOnly)?;
        let presented = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.get(..7).filter(|scheme| scheme.eq_ignore_ascii_case("bearer ")).map(|_| &v[7..]))
            .ok_or(Refusal::Unauthorized)?;
        if digest(presented.trim()) == keys.token { Ok(()) } else { Err(Refusal::Unauthorized) }
    }

    /// Whether `token` is this server's: signing in to the dashboard.
    pub fn token_matches(&self, token: &str) -> bool {
        self.keys.as_ref().is_some_and(|keys| digest(token.trim()) == keys.token)
    }

    /// The session cookie's value for a signed-in dashboard.
    pub fn session_value(&self) -> Option<&str> {
        self.keys.as_ref().map(|keys| keys.session.as_str())
    }

    /// Whether the request carries a signed-in session.
    pub fn signed_in(&self, headers: &HeaderMap) -> bool {
        let Some(keys) = &self.keys else { return false };
        cookie(headers, SESSION_COOKIE).is_some_and(|value| digest(value) == digest(&keys.session))
    }

    /// The CSRF token the dashboard's forms carry, for a signed-in session.
    pub fn csrf_for(&self, headers: &HeaderMap) -> Option<&str> {
        self.signed_in(headers).then(|| self.keys.as_ref().map(|keys| keys.csrf.as_str())).flatten()
    }

    /// Checks a dashboard form: a signed-in session, its CSRF token, and
    /// an `Origin` (when the browser sends one) of this very server.
    pub fn check_form(&self, headers: &HeaderMap, csrf: &str) -> Result<(), Refusal> {
        let keys = self.keys.as_ref().ok_or(Refusal::ReadOnly)?;
        if !self.signed_in(headers) {
            return Err(Refusal::Unauthorized);
        }
        if digest(csrf) != digest(&keys.csrf) || !same_origin(headers) {
            return Err(Refusal::Forged);
        }
        Ok(())
    }
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

    fn headers(pairs: &[(axum::http::HeaderName, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_short_token_is_refused() {
        assert!(Access::new(Some("short")).is_none());
        assert!(Access::new(Some(TOKEN)).is_some());
    }

    #[test]
    fn without_a_token_nothing_changes() {
        let access = Access::new(None).unwrap();
        let bearer = headers(&[(AUTHORIZATION, "Bearer anything-at-all-here")]);
        assert_eq!(access.check_bearer(&bearer), Err(Refusal::ReadOnly));
        assert!(!access.token_matches("anything-at-all-here"));
    }

    #[test]
    fn the_bearer_token_must_match() {
        let access = Access::new(Some(TOKEN)).unwrap();
        assert_eq!(access.check_bearer(&headers(&[])), Err(Refusal::Unauthorized));
        assert_eq!(access.check_bearer(&headers(&[(AUTHORIZATION, "Bearer wrong")])), Err(Refusal::Unauthorized));
        assert_eq!(access.check_bearer(&headers(&[(AUTHORIZATION, &format!("Bearer {TOKEN}"))])), Ok(()));
    }

    #[test]
    fn a_form_needs_the_session_its_csrf_token_and_this_origin() {
        let access = Access::new(Some(TOKEN)).unwrap();
        let session = format!("{SESSION_COOKIE}={}", access.session_value().unwrap());
        let signed_in = headers(&[(COOKIE, &session), (HOST, "127.0.0.1:8080")]);
        let csrf = access.csrf_for(&signed_in).unwrap().to_string();
        assert_eq!(access.check_form(&signed_in, &csrf), Ok(()));
        assert_eq!(access.check_form(&signed_in, "guess"), Err(Refusal::Forged));
        assert_eq!(access.check_form(&headers(&[(HOST, "127.0.0.1:8080")]), &csrf), Err(Refusal::Unauthorized));
        let elsewhere = headers(&[(COOKIE, &session), (HOST, "127.0.0.1:8080"), (ORIGIN, "http://evil.example")]);
        assert_eq!(access.check_form(&elsewhere, &csrf), Err(Refusal::Forged));
        let here = headers(&[(COOKIE, &session), (HOST, "127.0.0.1:8080"), (ORIGIN, "http://127.0.0.1:8080")]);
        assert_eq!(access.check_form(&here, &csrf), Ok(()));
    }
}
