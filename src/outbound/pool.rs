//! Connections kept open between requests, as a browser or Node's `fetch`
//! keeps them: a job that makes one request to an API no longer pays for a
//! TCP (and TLS) handshake each time, nor the server for accepting one.
//!
//! A connection is kept by its origin and the very address it reached, so
//! a request reuses it only after its own policy has judged that address
//! (the same check a new connection passes). It goes back to the pool only
//! once its response was read to the end; a request that ends any other
//! way (the run fenced or cancelled, a timeout, the guest dropping the
//! body) drops it, which closes the socket at once.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::client::conn::http1::SendRequest;
use wasmtime_wasi::runtime::AbortOnDropJoinHandle;
use wasmtime_wasi_http::{Error, WasiBody};

use super::origin::{Origin, Scheme};

/// How long an idle connection is kept.
pub const IDLE_FOR: Duration = Duration::from_secs(20);
/// The most idle connections kept per origin and address.
pub const IDLE_PER_DESTINATION: usize = 1024;
/// The most idle connections kept in all: a guest granted
/// `https://*.example.com` that calls ten thousand names must not leave
/// ten thousand sockets open.
pub const IDLE_IN_ALL: usize = 4096;

/// Where a connection goes: an origin, at one of its checked addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    scheme: Scheme,
    host: String,
    port: u16,
    address: SocketAddr,
}

impl Destination {
    /// `origin`, reached at `address`.
    pub fn new(origin: &Origin, address: SocketAddr) -> Self {
        Destination { scheme: origin.scheme, host: origin.host.clone(), port: origin.port, address }
    }
}

/// An open connection: what sends on it, and the task that drives it
/// (aborted, closing the socket, when this is dropped).
pub struct Connection {
    /// Sends requests on the connection.
    pub sender: SendRequest<WasiBody>,
    /// Drives the connection.
    pub driver: AbortOnDropJoinHandle<()>,
}

/// Idle connections by destination, the oldest first: the newest is
/// taken (the likeliest still open), the oldest expire.
pub struct ConnectionPool {
    idle: Mutex<Idle>,
    in_all: usize,
}

impl Default for ConnectionPool {
    fn default() -> Self {
        ConnectionPool { idle: Default::default(), in_all: IDLE_IN_ALL }
    }
}

#[derive(Default)]
struct Idle {
    by_destination: HashMap<Destination, VecDeque<(Instant, Connection)>>,
    count: usize,
}

impl Idle {
    /// Drops every connection idle for [`IDLE_FOR`], and emptied entries.
    fn expire(&mut self, now: Instant) {
        let mut dropped = 0;
        self.by_destination.retain(|_, kept| {
            while kept.front().is_some_and(|(since, _)| now.duration_since(*since) >= IDLE_FOR) {
                kept.pop_front();
                dropped += 1;
            }
            !kept.is_empty()
        });
        self.count -= dropped;
    }
}

impl ConnectionPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An idle connection to `destination` ready for a request, if one is kept.
    pub fn take(&self, destination: &Destination) -> Option<Connection> {
        let mut idle = self.lock();
        let kept = idle.by_destination.get_mut(destination)?;
        let mut found = None;
        let mut dropped = 0;
        while let Some((since, mut connection)) = kept.pop_back() {
            dropped += 1;
            if since.elapsed() >= IDLE_FOR {
                // The rest are older still.
                dropped += kept.len();
                kept.clear();
                break;
            }
            // Ready now, or dropped: a connection the server closed, or one
            // still finishing its last exchange, is not worth waiting for.
            if let Poll::Ready(Ok(())) = connection.sender.poll_ready(&mut Context::from_waker(Waker::noop())) {
                found = Some(connection);
                break;
            }
        }
        if kept.is_empty() {
            idle.by_destination.remove(destination);
        }
        idle.count -= dropped;
        found
    }

    /// Keeps `connection` for the next request to `destination`, unless
    /// the pool is full of fresher ones (then it is closed).
    pub fn keep(&self, destination: Destination, connection: Connection) {
        let mut idle = self.lock();
        let now = Instant::now();
        if idle.count >= self.in_all {
            idle.expire(now);
            if idle.count >= self.in_all {
                return;
            }
        }
        let kept = idle.by_destination.entry(destination).or_default();
        let mut dropped = 0;
        while kept.front().is_some_and(|(since, _)| now.duration_since(*since) >= IDLE_FOR)
            || kept.len() >= IDLE_PER_DESTINATION
        {
            kept.pop_front();
            dropped += 1;
        }
        kept.push_back((now, connection));
        idle.count = idle.count + 1 - dropped;
    }

    /// How many idle connections are kept.
    pub fn idle_count(&self) -> usize {
        self.lock().count
    }
}

/// A response body that gives its connection back to the pool once read
/// to the end, and otherwise closes it; `done` fires either way.
pub struct Returning<B> {
    body: B,
    /// The connection, and where it goes back.
    lease: Option<(Arc<ConnectionPool>, Destination, Connection)>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl<B> Returning<B> {
    /// `body`, read from `connection` to `destination`.
    pub fn new(
        body: B,
        lease: (Arc<ConnectionPool>, Destination, Connection),
        done: tokio::sync::oneshot::Sender<()>,
    ) -> Self {
        Returning { body, lease: Some(lease), done: Some(done) }
    }

    fn give_back(&mut self) {
        if let Some((pool, destination, connection)) = self.lease.take() {
            pool.keep(destination, connection);
        }
        self.done.take();
    }
}

impl<B> Body for Returning<B>
where
    B: Body<Data = Bytes, Error = Error> + Unpin,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Err(_))) => {
                self.lease.take();
                self.done.take();
            }
            _ if self.body.is_end_stream() => self.give_back(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};
    use wasmtime_wasi_http::io::TokioIo;

    /// A connection to a listener on 127.0.0.1, and the server's side of it.
    async fn connection(listener: &TcpListener) -> (Connection, TcpStream) {
        let tcp = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server_side, _) = listener.accept().await.unwrap();
        let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
        let driver = wasmtime_wasi::runtime::spawn(async move {
            let _ = driver.await;
        });
        (Connection { sender, driver }, server_side)
    }

    fn destination(host: &str, listener: &TcpListener) -> Destination {
        let address = listener.local_addr().unwrap();
        let origin = Origin::of_uri(&format!("http://{host}:{}", address.port()).parse().unwrap()).unwrap();
        Destination::new(&origin, address)
    }

    #[tokio::test]
    async fn idle_connections_are_bounded_in_all_and_the_rest_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = ConnectionPool { idle: Default::default(), in_all: 4 };
        let mut server_sides = Vec::new();
        for n in 0..6 {
            let (connection, server_side) = connection(&listener).await;
            pool.keep(destination(&format!("host-{n}.example"), &listener), connection);
            server_sides.push(server_side);
        }
        assert_eq!(pool.idle_count(), 4, "kept up to the bound");
        // The two past it were closed: their server sides read the end.
        for mut server_side in server_sides.drain(4..) {
            let read = tokio::time::timeout(Duration::from_secs(10), server_side.read(&mut [0u8; 1])).await;
            assert_eq!(read.expect("closed at once").unwrap(), 0);
        }
        let taken = pool.take(&destination("host-0.example", &listener));
        assert!(taken.is_some(), "a kept connection is taken by its own destination");
        assert!(pool.take(&destination("host-0.example", &listener)).is_none(), "and only once");
        assert!(pool.take(&destination("other.example", &listener)).is_none(), "never by another origin");
        assert_eq!(pool.idle_count(), 3);
    }
}
