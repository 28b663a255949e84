//! Sends one allowed request: resolves its host once, checks every address
//! against the grant, connects to a checked address (never looking the
//! name up again, so a rebinding resolver cannot swap in another), speaks
//! TLS for https with the name as the server name, and bounds each step.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, WasiBody};

use crate::store::grant::GrantTimeouts;
use crate::types::OutboundCall;

use super::budget::{BodyBudget, Direction, Metered};
use super::origin::{Origin, Scheme};
use super::policy::{Allowed, Refusal};
use super::pool::{Connection, ConnectionPool, Destination, Returning};

/// How long each step of a request may take when the guest asks for no
/// shorter bound: connecting (name lookup, TCP and TLS), waiting for the
/// response's head, and waiting between two pieces of its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepTimeouts {
    /// Name lookup, TCP connect and TLS handshake together.
    pub connect: Duration,
    /// From the request sent to the response's status and headers.
    pub first_byte: Duration,
    /// Between two frames of the response body.
    pub between_bytes: Duration,
}

impl Default for StepTimeouts {
    fn default() -> Self {
        StepTimeouts {
            connect: Duration::from_secs(10),
            first_byte: Duration::from_secs(30),
            between_bytes: Duration::from_secs(30),
        }
    }
}

impl StepTimeouts {
    /// These bounds, with each step a grant sets replaced by its value.
    pub fn granted(self, grant: GrantTimeouts) -> Self {
        let set = |ours: Duration, theirs: Option<u64>| theirs.map_or(ours, Duration::from_millis);
        StepTimeouts {
            connect: set(self.connect, grant.connect_ms),
            first_byte: set(self.first_byte, grant.first_byte_ms),
            between_bytes: set(self.between_bytes, grant.between_bytes_ms),
        }
    }

    /// These bounds, lowered to what the guest's request options ask.
    pub fn within(self, options: Option<wasmtime_wasi_http::RequestOptions>) -> Self {
        let Some(options) = options else { return self };
        let lower = |ours: Duration, theirs: Option<Duration>| theirs.map_or(ours, |t| t.min(ours));
        StepTimeouts {
            connect: lower(self.connect, options.connect_timeout),
            first_byte: lower(self.first_byte, options.first_byte_timeout),
            between_bytes: lower(self.between_bytes, options.between_bytes_timeout),
        }
    }
}

/// What the sender needs besides the request.
pub struct Sending {
    /// The job type, for refusals.
    pub job_type: String,
    /// The request's origin, as the policy judged it.
    pub origin: Origin,
    /// What the policy allowed.
    pub allowed: Allowed,
    /// The step bounds.
    pub timeouts: StepTimeouts,
    /// The TLS settings and the kept connections.
    pub connections: Arc<Connections>,
    /// The run's body budget, and the request's record the response's
    /// bytes are counted into.
    pub meter: (BodyBudget, Arc<std::sync::Mutex<OutboundCall>>),
}

/// The response, and a future that ends when its body has been read to
/// the end or dropped (what holds the run's in-flight slot until then).
pub type Sent = (http::Response<WasiBody>, Box<dyn Future<Output = Result<(), Error>> + Send>);

/// What every request of a host shares: the TLS settings, and the
/// connections kept open between requests.
pub struct Connections {
    /// Roots for https.
    pub tls: Arc<rustls::ClientConfig>,
    /// Idle connections, by origin and address.
    pub pool: Arc<ConnectionPool>,
}

impl Connections {
    /// Mozilla's roots, and no connection kept yet.
    pub fn new() -> Self {
        Connections { tls: tls_config(), pool: Arc::default() }
    }
}

impl Default for Connections {
    fn default() -> Self {
        Self::new()
    }
}

/// Sends `request` as `sending` allows, on a kept connection to a checked
/// address of its origin where one is idle, else on a new one.
///
/// # Errors
/// A refused address (returned apart, for the job's log), or the wasi:http
/// error the guest receives.
pub async fn send(mut request: http::Request<WasiBody>, sending: Sending) -> Result<Sent, SendError> {
    let Sending { job_type, origin, allowed, timeouts, connections, meter: (budget, call) } = sending;
    let (destination, mut connection) =
        tokio::time::timeout(timeouts.connect, connection_for(&job_type, &origin, &allowed, &connections))
            .await
            .map_err(|_| SendError::Failed(Error::ConnectionTimeout))??;
    // On the wire the request line carries the path only, and `Host` names
    // the origin the grant judged: never the guest's own authority text,
    // whatever wasi:http or the guest put in that header.
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    *request.uri_mut() = http::Uri::try_from(path).map_err(|_| SendError::Failed(Error::HttpRequestUriInvalid))?;
    let host = http::HeaderValue::from_str(&origin.authority())
        .map_err(|_| SendError::Failed(Error::HttpRequestUriInvalid))?;
    request.headers_mut().insert(http::header::HOST, host);
    // Dropped with this future (a timeout, or the run's end), the
    // connection's task is aborted and its socket closed at once.
    let response = tokio::time::timeout(timeouts.first_byte, connection.sender.send_request(request))
        .await
        .map_err(|_| SendError::Failed(Error::ConnectionReadTimeout))?
        .map_err(|e| SendError::Failed(Error::from(e)))?;
    let between = timeouts.between_bytes.max(Duration::from_millis(1));
    let (done, finished) = tokio::sync::oneshot::channel();
    let lease = (connections.pool.clone(), destination, connection);
    let response = response.map(|body| {
        use http_body_util::BodyExt;
        let paced = PacedBody { body, between, idle: Box::pin(tokio::time::sleep(between)) };
        let returning = Returning::new(paced, lease, done);
        Metered::new(returning, budget, Direction::Received, call).boxed_unsync()
    });
    let driver = async move {
        let _ = finished.await;
        Ok(())
    };
    Ok((response, Box::new(driver)))
}

/// Why a request did not go out.
#[derive(Debug)]
pub enum SendError {
    /// The destination is not one the grant reaches: logged with the job.
    Refused(Refusal),
    /// It failed on the way: the guest gets this error.
    Failed(Error),
}

impl From<Refusal> for SendError {
    fn from(refusal: Refusal) -> Self {
        SendError::Refused(refusal)
    }
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// A connection to a checked address of the origin: an idle one kept for
/// it, or a new one (TLS for https).
async fn connection_for(
    job_type: &str,
    origin: &Origin,
    allowed: &Allowed,
    connections: &Connections,
) -> Result<(Destination, Connection), SendError> {
    let addresses: Vec<SocketAddr> = match origin.address() {
        Some(address) => vec![SocketAddr::new(address, origin.port)],
        None => tokio::net::lookup_host((origin.host.as_str(), origin.port))
            .await
            .map_err(|e| SendError::Failed(Error::DnsError { rcode: Some(e.to_string()), info_code: None }))?
            .collect(),
    };
    // Every address the name resolves to is checked, not only the first:
    // one public answer must not carry a private one along. A kept
    // connection is used only once its address has passed this check.
    for address in &addresses {
        allowed.destination(job_type, origin, address.ip())?;
    }
    for address in &addresses {
        let destination = Destination::new(origin, *address);
        if let Some(connection) = connections.pool.take(&destination) {
            return Ok((destination, connection));
        }
    }
    let mut last = Error::DestinationNotFound;
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(tcp) => {
                let _ = tcp.set_nodelay(true);
                let stream: Box<dyn Stream> = match origin.scheme {
                    Scheme::Http => Box::new(tcp),
                    Scheme::Https => {
                        let name = rustls::pki_types::ServerName::try_from(origin.host.clone())
                            .map_err(|_| SendError::Failed(Error::HttpRequestUriInvalid))?;
                        let connector = tokio_rustls::TlsConnector::from(connections.tls.clone());
                        Box::new(connector.connect(name, tcp).await.map_err(|e| SendError::Failed(Error::Tls(e)))?)
                    }
                };
                let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| SendError::Failed(Error::from(e)))?;
                let driver = wasmtime_wasi::runtime::spawn(async move {
                    let _ = driver.await;
                });
                return Ok((Destination::new(origin, address), Connection { sender, driver }));
            }
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => last = Error::ConnectionRefused,
            Err(error) => last = Error::Connect(error),
        }
    }
    Err(SendError::Failed(last))
}

/// The TLS settings of every https request: Mozilla's roots, no client certificate.
pub fn tls_config() -> Arc<rustls::ClientConfig> {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// A response body that fails when the server pauses longer than
/// `between` between two frames: a trickle cannot hold a run's request open
/// forever.
struct PacedBody {
    body: Incoming,
    between: Duration,
    idle: Pin<Box<tokio::time::Sleep>>,
}

impl Body for PacedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = tokio::time::Instant::now() + self.between;
                self.idle.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(Error::from(error)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Error::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
