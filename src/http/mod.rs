//! The HTTP side of jobhost, on either backend and with or without
//! components loaded: the JSON API under `/api` ([`api`], described by
//! `/api/openapi.json`), the operator's dashboard at `/` ([`dashboard`]),
//! and Prometheus metrics at `/metrics` ([`scrape`]).
//!
//! Read-only unless started with a token: every request that changes
//! something presents it ([`access`]), as a bearer token to the API or as
//! a signed-in session with a CSRF token to the dashboard's forms. Request
//! bodies are bounded; every input is validated before the store sees it.

mod access;
mod api;
mod connections;
mod dashboard;
mod error;
mod query;
mod scrape;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::store::Store;

pub use access::MIN_TOKEN_LENGTH;
pub use connections::ConnectionLimits;

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The address to listen on; `127.0.0.1:8080` unless told otherwise.
    pub listen: SocketAddr,
    /// The token that unlocks changes; without one the server is read-only.
    pub token: Option<String>,
    /// The largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// How long a request may take: past it the answer is 503, so a page
    /// or a scrape never hangs on a database that stopped answering.
    pub request_timeout: std::time::Duration,
    /// Host names requests may be addressed to besides IP addresses and
    /// `localhost`: a name not listed is refused, so a page elsewhere
    /// whose name was rebound to this address cannot read through it.
    pub allowed_hosts: Vec<String>,
    /// How many connections are served at once, and how long one may take
    /// to send a request's head.
    pub connections: ConnectionLimits,
}

impl HttpConfig {
    /// Checks what can be checked before binding: the token's length.
    ///
    /// # Errors
    /// [`HttpError::WeakToken`].
    pub fn validate(&self) -> Result<(), HttpError> {
        access::Access::new(self.token.as_deref()).map(|_| ()).ok_or(HttpError::WeakToken)
    }
}

/// The default address: this machine only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

impl HttpConfig {
    /// Serving on `listen`, read-only, with bodies up to the largest
    /// payload an enqueue takes plus room for its options.
    pub fn new(listen: SocketAddr) -> Self {
        HttpConfig {
            listen,
            token: None,
            max_body_bytes: body_limit(crate::store::EnqueueLimits::default().max_payload_bytes),
            request_timeout: REQUEST_TIMEOUT,
            allowed_hosts: Vec::new(),
            connections: ConnectionLimits::default(),
        }
    }
}

/// How long a request may take by default.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The largest body for enqueues of payloads up to `max_payload` bytes
/// (as compact JSON): six times it, since a client may escape every
/// character of its payload as `\uXXXX` (Python's `json.dumps` does for
/// all but ASCII), plus room for the options.
pub fn body_limit(max_payload: usize) -> usize {
    max_payload.saturating_mul(6).saturating_add(BODY_SLACK)
}

/// Room in a request body beyond its payload: the job type, options, JSON.
pub const BODY_SLACK: usize = 16 * 1024;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The token is too short to resist guessing.
    #[error("the token must be at least {MIN_TOKEN_LENGTH} characters")]
    WeakToken,
    /// The address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// What every handler shares.
#[derive(Clone)]
struct AppState {
    store: Arc<dyn Store>,
    access: Arc<access::Access>,
    metrics: Metrics,
    /// How long a request's own work may go on (a scrape's reads, a bulk
    /// action's jobs) before it answers with what it has, within the
    /// request's deadline.
    work_budget: std::time::Duration,
}

/// Refuses a request whose declared length is past the limit before any of
/// its body is read; one that declares none is cut off at the limit as it
/// is read (the body limit layer).
async fn refuse_oversized(
    max: usize,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(length) if length > max as u64 => error::ApiError {
            status: axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is {length} bytes, more than the {max} bytes accepted"),
        }
        .into_response(),
        _ => next.run(request).await,
    }
}

/// Refuses a request that would change something from a caller without
/// the credentials for it before any of its body is read or parsed (the
/// handlers check again, with the body): a bearer token under `/api`, a
/// signed-in session for the dashboard's forms. Reads pass.
async fn credentials_first(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let method = request.method();
    if method == axum::http::Method::GET || method == axum::http::Method::HEAD {
        return next.run(request).await;
    }
    if request.uri().path().starts_with("/api") {
        return match state.access.check_bearer(request.headers()) {
            Ok(()) => next.run(request).await,
            // The rest of the body is never read: the connection closes.
            Err(refusal) => {
                let mut response = error::ApiError::from(refusal).into_response();
                response
                    .headers_mut()
                    .insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
                response
            }
        };
    }
    dashboard::require_session(&state, request, next).await
}

/// Refuses a request addressed to a host name other than `localhost` and
/// the `allowed` names (an IP address always passes): what a browser sends
/// when a page of another site has rebound its name to this address.
async fn only_known_hosts(
    allowed: &[String],
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let host = request.headers().get(axum::http::header::HOST).and_then(|v| v.to_str().ok()).map(str::to_string);
    match host {
        Some(host) if !host_allowed(&host, allowed) => error::ApiError {
            status: axum::http::StatusCode::FORBIDDEN,
            message: format!(
                "requests addressed to {host:?} are refused: name it with --allow-host to serve it (IP addresses and \
                 localhost always pass)"
            ),
        }
        .into_response(),
        _ => next.run(request).await,
    }
}

/// Whether a `Host` header names an IP address, `localhost` or an allowed name.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => {
            return bracketed.split(']').next().is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
        }
        None => {
            host.rsplit_once(':').map_or(host, |(name, port)| if port.parse::<u16>().is_ok() { name } else { host })
        }
    };
    name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Answers 503 for a request not done within `timeout`: a database cut
/// off mid-statement would otherwise hold the page (and its connection)
/// until the operating system gave up on it.
async fn within(
    timeout: std::time::Duration,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let path = request.uri().path().to_string();
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(path, ?timeout, "an HTTP request got no answer from the database in time");
            let message =
                format!("no answer within {}: the database may be unreachable", humantime::format_duration(timeout));
            if path.starts_with("/api") {
                error::ApiError { status: axum::http::StatusCode::SERVICE_UNAVAILABLE, message }.into_response()
            } else {
                (axum::http::StatusCode::SERVICE_UNAVAILABLE, message).into_response()
            }
        }
    }
}

/// A bound server, not yet serving: its address is known (port 0 picks one).
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ConnectionLimits,
}

impl Server {
    /// Binds `config.listen` and builds the routes over `store`, exposing
    /// `metrics` (this process's counters) at `/metrics`.
    ///
    /// # Errors
    /// A token too short, or an address that cannot be bound.
    pub async fn bind(config: &HttpConfig, store: Arc<dyn Store>, metrics: Metrics) -> Result<Server, HttpError> {
        let access = access::Access::new(config.token.as_deref()).ok_or(HttpError::WeakToken)?;
        let state = AppState { store, access: Arc::new(access), metrics, work_budget: config.request_timeout / 2 };
        let max_body = config.max_body_bytes;
        let timeout = config.request_timeout;
        let allowed = Arc::new(config.allowed_hosts.clone());
        let router = Router::new()
            .merge(api::routes())
            .merge(dashboard::routes())
            .merge(scrape::routes())
            .layer(DefaultBodyLimit::max(max_body))
            .layer(axum::middleware::from_fn_with_state(state.clone(), credentials_first))
            .layer(axum::middleware::from_fn(move |request, next| refuse_oversized(max_body, request, next)))
            .layer(axum::middleware::from_fn(move |request, next| within(timeout, request, next)))
            .layer(axum::middleware::from_fn(move |request, next| {
                let allowed = allowed.clone();
                async move { only_known_hosts(&allowed, request, next).await }
            }))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| HttpError::Bind { address: config.listen, source })?;
        Ok(Server { listener, router, limits: config.connections })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Serves until `shutdown`, then lets requests in flight finish.
    pub async fn serve(self, shutdown: CancellationToken) {
        connections::serve(self.listener, self.router, self.limits, shutdown).await;
    }
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn only_addresses_localhost_and_allowed_names_pass() {
        let allowed = vec!["jobs.internal".to_string()];
        for host in ["127.0.0.1:8080", "10.0.0.7", "[::1]:8080", "localhost:8080", "LOCALHOST", "jobs.internal:80"] {
            assert!(host_allowed(host, &allowed), "{host}");
        }
        for host in ["evil.example:8080", "evil.example", "127.0.0.1.evil.example", "[evil]:80", "jobs.internal.evil"] {
            assert!(!host_allowed(host, &allowed), "{host}");
        }
    }
}
