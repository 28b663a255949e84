//! The HTTP side of jobhost, on either backend and with or without
//! components loaded: the JSON API under `/api` ([`api`], described by
//! `/api/openapi.json`), the operator's dashboard at `/` ([`dashboard`]),
//! and Prometheus metrics at `/metrics` ([`scrape`]).
//!
//! Read-only unless started with a token: every request that changes
//! something presents it ([`access`]), as a bearer token to the API or as
//! a signed-in session with a CSRF token to the dashboard's forms; with a
//! token, reads need it too unless the server reads publicly. Who a request
//! comes from is worked out, and what it may not do refused, before its
//! body is read ([`guard`]). Connections and request bodies are bounded;
//! every input is validated before the store sees it.

mod access;
mod api;
mod connections;
mod dashboard;
mod deploy;
mod error;
mod guard;
mod hide;
mod hooks;
mod query;
mod roles;
mod schedules;
mod scrape;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::store::Store;

pub use crate::store::session::SessionLifetime;
pub use access::{MIN_TOKEN_BITS, token_bits};
pub use connections::ConnectionLimits;
pub use roles::{Need, ROUTES};

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The address to listen on; `127.0.0.1:8080` unless told otherwise.
    pub listen: SocketAddr,
    /// The token that unlocks changes, and reads unless `public_read`;
    /// without one the server is read-only.
    pub token: Option<String>,
    /// A token that only scrapes `/metrics`; without one (and without
    /// `token`) metrics are open.
    pub metrics_token: Option<String>,
    /// Reads are open to anyone who reaches the server, token or not.
    pub public_read: bool,
    /// How long a dashboard session lasts.
    pub sessions: SessionLifetime,
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
    /// The hosts' key, which opens the secrets inbound webhooks verify
    /// signatures with; without it a webhook answers 503.
    pub secret_key: Option<crate::outbound::secrets::SecretKey>,
}

impl HttpConfig {
    /// Checks what can be checked before binding: each token is hard
    /// enough to guess, and a server every network can reach does not show
    /// every job to all of it by oversight.
    ///
    /// # Errors
    /// [`HttpError::WeakToken`], [`HttpError::OpenToNetwork`].
    pub fn validate(&self) -> Result<(), HttpError> {
        for (which, token) in [("--token", &self.token), ("--metrics-token", &self.metrics_token)] {
            if let Some(bits) = token.as_deref().map(token_bits).filter(|bits| *bits < MIN_TOKEN_BITS) {
                return Err(HttpError::WeakToken { which, bits: bits.floor() as u32 });
            }
        }
        if self.token.is_none() && !self.public_read && !self.listen.ip().is_loopback() {
            return Err(HttpError::OpenToNetwork { listen: self.listen });
        }
        Ok(())
    }
}

impl HttpConfig {
    /// What `serve` prints and `run --http` logs once bound: the address
    /// to open, and who may read and change.
    pub fn announcement(&self, bound: SocketAddr) -> String {
        let access = match (self.token.is_some(), self.public_read) {
            (true, false) => "reads and changes need the token",
            (true, true) => "changes need the token; reads are public",
            (false, _) => "read-only but to named tokens: no --token",
        };
        format!("dashboard and API on http://{bound} ({access})")
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
            metrics_token: None,
            public_read: false,
            sessions: SessionLifetime::default(),
            max_body_bytes: body_limit(crate::store::EnqueueLimits::default().max_payload_bytes),
            request_timeout: REQUEST_TIMEOUT,
            allowed_hosts: Vec::new(),
            connections: ConnectionLimits::default(),
            secret_key: None,
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
    /// A token too easy to guess.
    #[error(
        "{which} is too easy to guess (about {bits} bits; at least {MIN_TOKEN_BITS} are needed): \
         make one with `openssl rand -hex 32`"
    )]
    WeakToken {
        /// Which token.
        which: &'static str,
        /// About how many guesses, in bits, it would take.
        bits: u32,
    },
    /// A server without a token on an address other machines reach would
    /// show every job to them.
    #[error(
        "{listen} can be reached from other machines, and without --token anyone there could read every job: \
         give a --token (then reads need it too), or --public-read to serve them to all on purpose"
    )]
    OpenToNetwork {
        /// The address.
        listen: SocketAddr,
    },
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
    store: Store,
    access: Arc<access::Access>,
    metrics: Metrics,
    /// How long a request's own work may go on (a scrape's reads, a bulk
    /// action's jobs) before it answers with what it has, within the
    /// request's deadline.
    work_budget: std::time::Duration,
    /// The runtime that validates components deployed over the API,
    /// started by the first deploy.
    validator: Arc<tokio::sync::OnceCell<crate::component::Runtime>>,
    /// Opens the secrets inbound webhooks are signed with.
    secret_key: Option<Arc<crate::outbound::secrets::SecretKey>>,
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
    pub async fn bind(config: &HttpConfig, store: Store, metrics: Metrics) -> Result<Server, HttpError> {
        config.validate()?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| HttpError::Bind { address: config.listen, source })?;
        let port = listener.local_addr().map_or(config.listen.port(), |a| a.port());
        let access = access::Access::new(
            config.token.as_deref(),
            config.metrics_token.as_deref(),
            config.public_read,
            port,
            config.sessions,
        );
        let state = AppState {
            store,
            access: Arc::new(access),
            metrics,
            work_budget: config.request_timeout / 2,
            validator: Arc::default(),
            secret_key: config.secret_key.clone().map(Arc::new),
        };
        let max_body = config.max_body_bytes;
        let timeout = config.request_timeout;
        let allowed = Arc::new(config.allowed_hosts.clone());
        let router = Router::new()
            .merge(api::routes())
            .merge(deploy::routes())
            .merge(schedules::routes())
            .merge(dashboard::routes())
            .merge(scrape::routes())
            .merge(hooks::routes())
            .layer(DefaultBodyLimit::max(max_body))
            .layer(axum::middleware::from_fn_with_state(state.clone(), guard::admit))
            .layer(axum::middleware::from_fn(move |request: axum::extract::Request, next| {
                // A deploy's body is a component; every other is at most an enqueue's.
                let max = if request.uri().path() == deploy::DEPLOY_PATH {
                    crate::store::deploy::MAX_COMPONENT_BYTES
                } else {
                    max_body
                };
                guard::refuse_oversized(max, request, next)
            }))
            .layer(axum::middleware::from_fn(move |request, next| guard::within(timeout, request, next)))
            .layer(axum::middleware::from_fn(move |request, next| {
                let allowed = allowed.clone();
                async move { guard::only_known_hosts(&allowed, request, next).await }
            }))
            .with_state(state);
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
