//! A TCP proxy in front of a database server that can be frozen like a cut
//! cable: frozen, it forwards nothing in either direction and closes or
//! resets nothing, so neither end learns anything until it gives up by
//! itself or the proxy thaws. Connections accepted while frozen forward
//! nothing either.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A running proxy; dropping it drops every connection through it.
pub struct Proxy {
    port: u16,
    frozen: watch::Sender<bool>,
    stop: CancellationToken,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to
    /// `upstream` (`host:port`).
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("the proxy listens");
        let port = listener.local_addr().expect("the proxy's address").port();
        let (frozen, _) = watch::channel(false);
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, upstream, frozen.subscribe(), stop.clone()));
        Proxy { port, frozen, stop }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops forwarding on every connection, now and new.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Resumes forwarding, with whatever each end sent meanwhile.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept(listener: TcpListener, upstream: String, frozen: watch::Receiver<bool>, stop: CancellationToken) {
    loop {
        let client = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        tokio::spawn(connection(client, upstream.clone(), frozen.clone(), stop.clone()));
    }
}

async fn connection(client: TcpStream, upstream: String, frozen: watch::Receiver<bool>, stop: CancellationToken) {
    // A server that cannot be reached: the client sees its connection closed.
    let Ok(server) = TcpStream::connect(&upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = stop.cancelled() => {}
        _ = async {
            tokio::join!(pipe(client_read, server_write, frozen.clone()), pipe(server_read, client_write, frozen))
        } => {}
    }
}

/// Copies bytes one way while thawed. Frozen, it stops before reading and
/// before writing, so bytes already read wait for the thaw, and so does an
/// end of stream.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut frozen: watch::Receiver<bool>) {
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        if frozen.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if frozen.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
    if frozen.wait_for(|frozen| !frozen).await.is_ok() {
        let _ = to.shutdown().await;
    }
}
