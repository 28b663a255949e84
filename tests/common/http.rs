//! A real HTTP server over a test database, and a plain client for it.

use std::net::SocketAddr;

use axum::http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio_util::sync::CancellationToken;

use jobhost::http::{HttpConfig, Server};
use jobhost::store::Store;

/// The token test servers take.
pub const TOKEN: &str = "test-token-0123456789";

/// A server on an ephemeral port, stopped when dropped.
pub struct TestServer {
    pub address: SocketAddr,
    client: Client<HttpConnector, Full<bytes::Bytes>>,
    stop: CancellationToken,
    /// The server's token, sent with reads ([`TestServer::get`]): a server
    /// with a token lets only its holders read.
    token: Option<String>,
}

/// An answer: its status, headers and body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

impl TestServer {
    /// Serves `store` with `token` (read-only without one).
    pub async fn start(store: Store, token: Option<&str>) -> TestServer {
        Self::start_with(store, token, jobhost::metrics::Metrics::default()).await
    }

    /// [`TestServer::start`], exposing `metrics`.
    pub async fn start_with(store: Store, token: Option<&str>, metrics: jobhost::metrics::Metrics) -> TestServer {
        let config = HttpConfig { token: token.map(str::to_string), ..HttpConfig::new("127.0.0.1:0".parse().unwrap()) };
        Self::serving(&config, store, metrics).await
    }

    /// [`TestServer::start`] with reads open to anyone (`--public-read`).
    pub async fn start_public(store: Store, token: Option<&str>) -> TestServer {
        let config = HttpConfig {
            token: token.map(str::to_string),
            public_read: true,
            ..HttpConfig::new("127.0.0.1:0".parse().unwrap())
        };
        Self::serving(&config, store, jobhost::metrics::Metrics::default()).await
    }

    /// A server with `config`, on the port it names (0: any).
    pub async fn serving(config: &HttpConfig, store: Store, metrics: jobhost::metrics::Metrics) -> TestServer {
        let server = Server::bind(config, store, metrics).await.expect("bind the HTTP server");
        let address = server.local_addr();
        let stop = CancellationToken::new();
        tokio::spawn(server.serve(stop.clone()));
        let client = Client::builder(TokioExecutor::new()).build_http();
        let token = if config.public_read { None } else { config.token.clone() };
        TestServer { address, client, stop, token }
    }

    /// A client for a server another process serves at `address`.
    pub fn at(address: SocketAddr) -> TestServer {
        let client = Client::builder(TokioExecutor::new()).build_http();
        TestServer { address, client, stop: CancellationToken::new(), token: None }
    }

    /// A client for a server another process serves at `address` with
    /// `token`, which its reads present.
    pub fn at_with_token(address: SocketAddr, token: &str) -> TestServer {
        let client = Client::builder(TokioExecutor::new()).build_http();
        TestServer { address, client, stop: CancellationToken::new(), token: Some(token.to_string()) }
    }

    /// A client of the same server that presents no token.
    pub fn anonymous(&self) -> TestServer {
        TestServer::at(self.address)
    }

    /// The server's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Sends a request with `body` (JSON unless `content_type` says) and
    /// the bearer `token` if given.
    pub async fn send(&self, method: Method, path: &str, body: Option<(&str, String)>, token: Option<&str>) -> Answer {
        let bearer = token.map(|token| format!("Bearer {token}"));
        let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
        self.send_with(method, path, body, &headers).await
    }

    /// [`TestServer::send`], with these headers.
    pub async fn send_with(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, String)>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut request = Request::builder().method(method).uri(format!("{}{path}", self.url()));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let bytes = match body {
            Some((content_type, body)) => {
                request = request.header("content-type", content_type);
                body
            }
            None => String::new(),
        };
        let response = self.client.request(request.body(Full::from(bytes)).unwrap()).await.expect("HTTP request");
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.expect("HTTP body").to_bytes();
        Answer { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
    }

    /// A POST of raw bytes (a component's) with the server's token.
    pub async fn post_bytes(&self, path: &str, content_type: &str, bytes: Vec<u8>) -> Answer {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("{}{path}", self.url()))
            .header("content-type", content_type);
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = self.client.request(request.body(Full::from(bytes)).unwrap()).await.expect("HTTP request");
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.expect("HTTP body").to_bytes();
        Answer { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
    }

    /// Writes `request` as it is on a fresh connection and reads the
    /// answer until the server closes it.
    pub async fn send_raw(&self, request: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(self.address).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("write the request");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// A GET, with the server's token if it has one.
    pub async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None, self.token.as_deref()).await
    }

    /// A JSON POST with the test token.
    pub async fn post(&self, path: &str, body: serde_json::Value) -> Answer {
        self.send(Method::POST, path, Some(("application/json", body.to_string())), Some(TOKEN)).await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
