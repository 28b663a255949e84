//! A TCP proxy in front of a PostgreSQL server, for fault injection.
//!
//! Frozen, it is a cut cable: it forwards nothing in either direction and
//! closes or resets nothing, so neither end learns anything until it gives
//! up by itself or the proxy thaws. Connections accepted while frozen
//! forward nothing either.
//!
//! Armed with a piece of SQL, it loses one reply: the next execution of a
//! statement whose text contains it goes through to the server, the
//! server's whole answer is dropped, and once that answer is complete the
//! connection is closed at both ends. That is the ambiguous commit: a
//! statement in autocommit has committed, and its client cannot tell.
//! Armed to hang instead, it keeps that connection open and silent: a
//! session the network lost with neither end told.
//!
//! For that the proxy reads the wire protocol. A client sends a prepared
//! statement's text once per connection, in a Parse message, and then
//! executes it by name (Bind, Execute, Sync) as often as it likes, so a
//! byte pattern in the stream would find only the first Parse, whose
//! answer commits nothing. The proxy remembers each connection's statements
//! instead, recognises an execution by its Bind (or a simple Query by its
//! text), and knows the answer is complete at the server's ReadyForQuery
//! for that execution's Sync.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

/// The test server's `host:port`, for the proxy to forward to.
pub fn server_address() -> String {
    let options: sqlx::postgres::PgConnectOptions = super::db::server_url().parse().expect("a PostgreSQL URL");
    format!("{}:{}", options.get_host(), options.get_port())
}

/// `url` with its host and port replaced by 127.0.0.1 and `port`.
pub fn url_via(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, database) = rest.split_once('/').expect("a URL naming its database");
    let user = authority.rsplit_once('@').map(|(user, _)| format!("{user}@")).unwrap_or_default();
    format!("{scheme}://{user}127.0.0.1:{port}/{database}")
}

/// A running proxy; dropping it drops every connection through it.
pub struct Proxy {
    port: u16,
    frozen: watch::Sender<bool>,
    /// The armed lost-reply fault, taken by the connection that fires it.
    fault: Arc<Mutex<Option<Armed>>>,
    stop: CancellationToken,
}

/// What the server answered to the execution whose reply was lost.
#[derive(Debug, Clone)]
pub struct LostReply {
    /// The text of the statement executed.
    pub statement: String,
    /// The server completed the statement without an error and then was
    /// idle, in no transaction block: in autocommit, the statement committed.
    pub committed: bool,
    /// Bytes of the answer the client never saw.
    pub dropped_bytes: usize,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to
    /// `upstream` (`host:port`).
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("the proxy listens");
        let port = listener.local_addr().expect("the proxy's address").port();
        let (frozen, _) = watch::channel(false);
        let fault = Arc::new(Mutex::new(None));
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, upstream, frozen.subscribe(), fault.clone(), stop.clone()));
        Proxy { port, frozen, fault, stop }
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

    /// Arms the lost-reply fault, once: the next execution, on any
    /// connection, of a statement whose text contains `sql` reaches the
    /// server, the server's answer is dropped, and when the answer is
    /// complete both ends of that connection are closed. Other connections
    /// are untouched. The receiver resolves with what the server answered
    /// once the fault has fired, or fails if that connection ended before
    /// the server answered. Arming again replaces an unfired fault.
    pub fn lose_reply_to(&self, sql: &str) -> oneshot::Receiver<LostReply> {
        let (fired, report) = oneshot::channel();
        *self.fault.lock().expect("the fault's lock") =
            Some(Armed { needle: sql.to_string(), skip: 0, hang: false, fired });
        report
    }

    /// Arms the hung-reply fault, once: as [`Proxy::lose_reply_to`], but
    /// on the execution after the next `skip` matching ones, and the
    /// connection is then kept open and silent, never closed: a session
    /// the network lost without either end hearing of it. Everything the
    /// server sends on it afterwards is dropped too.
    pub fn hang_reply_to(&self, sql: &str, skip: u32) -> oneshot::Receiver<LostReply> {
        let (fired, report) = oneshot::channel();
        *self.fault.lock().expect("the fault's lock") =
            Some(Armed { needle: sql.to_string(), skip, hang: true, fired });
        report
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The lost-reply fault, armed and not yet fired.
struct Armed {
    needle: String,
    /// Matching executions to let through before the one faulted.
    skip: u32,
    /// Keep the connection open and silent instead of closing it.
    hang: bool,
    fired: oneshot::Sender<LostReply>,
}

/// The fault, fired on one connection, waiting for the server's answer.
struct Losing {
    statement: String,
    /// The number of ReadyForQuery messages from the server, counted from
    /// the start of the connection, that ends the lost answer.
    answered_at: u64,
    hang: bool,
    fired: oneshot::Sender<LostReply>,
}

/// What the two directions of one connection share.
struct Wire {
    fault: Arc<Mutex<Option<Armed>>>,
    /// Set when this connection fires the fault.
    losing: Mutex<Option<Losing>>,
    /// The matching statement ran inside a transaction, whose commit is
    /// what could be lost: the answer lost is the next COMMIT's.
    losing_at_commit: Mutex<Option<Armed>>,
    /// The server's last ReadyForQuery said a transaction was open.
    in_transaction: AtomicBool,
    /// Sync and Query messages the client sent: the server answers each
    /// with one ReadyForQuery.
    syncs: AtomicU64,
    /// The client asked for encryption; the server's one-byte answer comes next.
    encryption_asked: AtomicBool,
    /// Encrypted, or not the protocol the proxy reads: forwarded as it is,
    /// never faulted.
    opaque: AtomicBool,
    /// Cancelled to close both ends.
    cut: CancellationToken,
    /// The hung-reply fault fired here: nothing more reaches the client.
    hung: AtomicBool,
}

async fn accept(
    listener: TcpListener,
    upstream: String,
    frozen: watch::Receiver<bool>,
    fault: Arc<Mutex<Option<Armed>>>,
    stop: CancellationToken,
) {
    loop {
        let client = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        tokio::spawn(connection(client, upstream.clone(), frozen.clone(), fault.clone(), stop.clone()));
    }
}

async fn connection(
    client: TcpStream,
    upstream: String,
    frozen: watch::Receiver<bool>,
    fault: Arc<Mutex<Option<Armed>>>,
    stop: CancellationToken,
) {
    // A server that cannot be reached: the client sees its connection closed.
    let Ok(server) = TcpStream::connect(&upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let wire = Arc::new(Wire {
        fault,
        losing: Mutex::new(None),
        losing_at_commit: Mutex::new(None),
        in_transaction: AtomicBool::new(false),
        syncs: AtomicU64::new(0),
        encryption_asked: AtomicBool::new(false),
        opaque: AtomicBool::new(false),
        cut: CancellationToken::new(),
        hung: AtomicBool::new(false),
    });
    let (requests, answers) = (FromClient::new(wire.clone()), FromServer::new(wire.clone()));
    // Returning drops both sockets, which closes them.
    tokio::select! {
        () = stop.cancelled() => {}
        () = wire.cut.cancelled() => {}
        _ = async {
            tokio::join!(pipe(client_read, server_write, frozen.clone(), requests), pipe(server_read, client_write, frozen, answers))
        } => {}
    }
}

/// Reads the bytes going one way and says whether to forward them.
trait Tap {
    fn forward(&mut self, bytes: &[u8]) -> bool;
}

/// Copies bytes one way while thawed, as far as `tap` lets them through.
/// Frozen, it stops before reading and before writing, so bytes already
/// read wait for the thaw, and so does an end of stream.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut frozen: watch::Receiver<bool>, mut tap: impl Tap) {
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        if frozen.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if !tap.forward(&buffer[..read]) {
            continue;
        }
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

/// The wire protocol's framing, one direction: a message is a type byte
/// and a length (counting itself), except the client's first messages
/// (startup, and a request for encryption before it), which have no type.
#[derive(Default)]
struct Frames {
    buffer: Vec<u8>,
}

/// One message: its type (0 for the untyped startup messages) and body.
type Message = (u8, Vec<u8>);

impl Frames {
    /// Takes the next whole message from what has arrived; `Err` for bytes
    /// that are not the protocol.
    fn next(&mut self, typed: bool) -> Result<Option<Message>, ()> {
        let header = if typed { 5 } else { 4 };
        if self.buffer.len() < header {
            return Ok(None);
        }
        let at = header - 4;
        let length = u32::from_be_bytes(self.buffer[at..header].try_into().expect("four bytes")) as usize;
        if length < 4 {
            return Err(());
        }
        if self.buffer.len() < at + length {
            return Ok(None);
        }
        let kind = if typed { self.buffer[0] } else { 0 };
        let body = self.buffer[header..at + length].to_vec();
        self.buffer.drain(..at + length);
        Ok(Some((kind, body)))
    }
}

/// A NUL-terminated string at the start of `bytes`, and what follows it.
fn c_string(bytes: &[u8]) -> (&[u8], &[u8]) {
    match bytes.iter().position(|&b| b == 0) {
        Some(end) => (&bytes[..end], &bytes[end + 1..]),
        None => (bytes, &[]),
    }
}

/// The client's side: remembers its prepared statements and fires the
/// fault on an execution of a matching one.
struct FromClient {
    wire: Arc<Wire>,
    frames: Frames,
    /// Past the startup message: messages are typed.
    started: bool,
    /// The text of each prepared statement, by name ("" is the unnamed one).
    statements: HashMap<Vec<u8>, String>,
}

impl FromClient {
    fn new(wire: Arc<Wire>) -> FromClient {
        FromClient { wire, frames: Frames::default(), started: false, statements: HashMap::new() }
    }

    fn read(&mut self, (kind, body): Message) {
        match kind {
            0 => {
                const SSL_REQUEST: u32 = 80_877_103;
                const GSSENC_REQUEST: u32 = 80_877_104;
                let code = body.get(..4).map_or(0, |code| u32::from_be_bytes(code.try_into().expect("four bytes")));
                if code == SSL_REQUEST || code == GSSENC_REQUEST {
                    self.wire.encryption_asked.store(true, Ordering::SeqCst);
                } else {
                    self.started = true;
                }
            }
            b'P' => {
                let (name, rest) = c_string(&body);
                let (text, _) = c_string(rest);
                self.statements.insert(name.to_vec(), String::from_utf8_lossy(text).into_owned());
            }
            b'B' => {
                let (_portal, rest) = c_string(&body);
                let (name, _) = c_string(rest);
                if let Some(text) = self.statements.get(name) {
                    self.execution(text.clone());
                }
            }
            b'Q' => {
                let (text, _) = c_string(&body);
                self.execution(String::from_utf8_lossy(text).into_owned());
                self.wire.syncs.fetch_add(1, Ordering::SeqCst);
            }
            b'S' => {
                self.wire.syncs.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    /// An execution of `text` is about to reach the server: fires the
    /// fault if it matches. The answer ends at the ReadyForQuery for the
    /// next sync point, this one's.
    /// A match inside a transaction moves the fault to that transaction's
    /// COMMIT, the message whose answer tells whether it took effect.
    fn execution(&self, text: String) {
        let answered_at = self.wire.syncs.load(Ordering::SeqCst) + 1;
        let mut at_commit = self.wire.losing_at_commit.lock().expect("the connection's lock");
        if at_commit.is_some() && text.trim().eq_ignore_ascii_case("COMMIT") {
            let armed = at_commit.take().expect("checked above");
            *self.wire.losing.lock().expect("the connection's lock") = Some(Losing {
                statement: format!("{}; COMMIT", armed.needle),
                answered_at,
                hang: armed.hang,
                fired: armed.fired,
            });
            return;
        }
        let mut fault = self.wire.fault.lock().expect("the fault's lock");
        let Some(matching) = fault.as_mut().filter(|armed| text.contains(&armed.needle)) else { return };
        if matching.skip > 0 {
            matching.skip -= 1;
            return;
        }
        let armed = fault.take().expect("checked above");
        if self.wire.in_transaction.load(Ordering::SeqCst) {
            *at_commit = Some(Armed { needle: text, ..armed });
            return;
        }
        *self.wire.losing.lock().expect("the connection's lock") =
            Some(Losing { statement: text, answered_at, hang: armed.hang, fired: armed.fired });
    }
}

impl Tap for FromClient {
    fn forward(&mut self, bytes: &[u8]) -> bool {
        if self.wire.opaque.load(Ordering::SeqCst) {
            return true;
        }
        self.frames.buffer.extend_from_slice(bytes);
        loop {
            match self.frames.next(self.started) {
                Ok(Some(message)) => self.read(message),
                Ok(None) => return true,
                Err(()) => {
                    self.wire.opaque.store(true, Ordering::SeqCst);
                    return true;
                }
            }
        }
    }
}

/// The server's side: counts its answers and, once the fault fired on this
/// connection, drops them, closing the connection after the lost one.
struct FromServer {
    wire: Arc<Wire>,
    frames: Frames,
    /// ReadyForQuery messages so far.
    ready: u64,
    /// Since the last ReadyForQuery: a CommandComplete, an ErrorResponse.
    completed: bool,
    failed: bool,
    /// Bytes dropped since the fault fired on this connection.
    dropped: usize,
}

impl FromServer {
    fn new(wire: Arc<Wire>) -> FromServer {
        FromServer { wire, frames: Frames::default(), ready: 0, completed: false, failed: false, dropped: 0 }
    }

    /// Reads one message; true once the lost answer is complete.
    fn read(&mut self, (kind, body): Message) -> bool {
        match kind {
            b'C' => self.completed = true,
            b'E' => self.failed = true,
            b'Z' => {
                self.ready += 1;
                let status = body.first().copied();
                self.wire.in_transaction.store(matches!(status, Some(b'T' | b'E')), Ordering::SeqCst);
                let mut losing = self.wire.losing.lock().expect("the connection's lock");
                if losing.as_ref().is_some_and(|losing| self.ready >= losing.answered_at) {
                    let losing = losing.take().expect("checked above");
                    let idle = body.first() == Some(&b'I');
                    let committed = self.completed && !self.failed && idle;
                    let _ = losing.fired.send(LostReply {
                        statement: losing.statement,
                        committed,
                        dropped_bytes: self.dropped,
                    });
                    if losing.hang {
                        self.wire.hung.store(true, Ordering::SeqCst);
                        return false;
                    }
                    return true;
                }
                (self.completed, self.failed) = (false, false);
            }
            _ => {}
        }
        false
    }

    fn losing(&self) -> bool {
        self.wire.losing.lock().expect("the connection's lock").is_some()
    }
}

impl Tap for FromServer {
    fn forward(&mut self, bytes: &[u8]) -> bool {
        if self.wire.hung.load(Ordering::SeqCst) {
            return false;
        }
        if self.wire.opaque.load(Ordering::SeqCst) {
            return true;
        }
        self.frames.buffer.extend_from_slice(bytes);
        if self.wire.encryption_asked.swap(false, Ordering::SeqCst) {
            // The one-byte answer: N for no, anything else starts encryption.
            if self.frames.buffer.remove(0) != b'N' {
                self.wire.opaque.store(true, Ordering::SeqCst);
                return true;
            }
        }
        let losing = self.losing();
        if losing {
            self.dropped += bytes.len();
        }
        loop {
            match self.frames.next(true) {
                Ok(Some(message)) => {
                    if self.read(message) {
                        self.wire.cut.cancel();
                        return false;
                    }
                }
                Ok(None) => return !losing,
                Err(()) => {
                    self.wire.opaque.store(true, Ordering::SeqCst);
                    return !losing;
                }
            }
        }
    }
}
