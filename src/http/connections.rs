//! The server's connections, bounded against a client that holds them
//! open (slowloris): at most [`ConnectionLimits::max_connections`] at once
//! (the rest wait in the kernel's accept queue, holding no descriptor of
//! this process, which in `run --http` is the worker's too), and each
//! closed when it has not sent a whole request head within
//! [`ConnectionLimits::header_timeout`], whether it is new, half-way
//! through its headers, or idle between keep-alive requests. A request
//! once read is bounded by the request timeout (see [`super::within`]).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::{Extension, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// How many connections a server holds, and for how long one may send
/// nothing useful.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// How long a connection may take to send a request's head, counted
    /// from when the server starts waiting for it (a new connection, or
    /// one idle after its last answer).
    pub header_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits { max_connections: 256, header_timeout: Duration::from_secs(10) }
    }
}

/// How long connections in flight may finish after a shutdown.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` within `limits` until `shutdown`, then
/// lets the connections in flight finish their requests (for at most
/// [`DRAIN`]).
pub async fn serve(listener: TcpListener, router: Router, limits: ConnectionLimits, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let mut told = false;
    loop {
        let slot = tokio::select! {
            () = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        if slots.available_permits() == 0 && !told {
            tracing::warn!(connections = limits.max_connections, "the HTTP server holds all the connections it serves");
            told = true;
        } else if slots.available_permits() > limits.max_connections / 2 {
            told = false;
        }
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, or a connection reset while queued:
                    // wait a moment rather than spin.
                    tracing::warn!(%error, "the HTTP server could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Each request knows the address it came from (wrong tokens are counted by it).
        let service = TowerToHyperService::new(router.clone().layer(Extension(ConnectInfo(peer))));
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A client that went away, or one closed for its timeout.
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!(?DRAIN, "HTTP connections still open after the shutdown's grace; closing them");
    }
}
