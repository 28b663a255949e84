//! `jobhost serve`: the HTTP API, dashboard and metrics over a database,
//! with no components and no jobs run (see [`crate::http`]).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::{DbArgs, fail};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on; only this machine unless told otherwise.
    #[arg(long, default_value = crate::http::DEFAULT_LISTEN, value_name = "ADDR")]
    listen: SocketAddr,
    #[command(flatten)]
    token: TokenArgs,
    /// Do not apply migrations at start.
    #[arg(long)]
    no_migrate: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// Who may use the HTTP side.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// Allow changes over HTTP (enqueue, retry, cancel, pause), and reads
    /// unless --public-read, to requests presenting this token (at least 64
    /// bits: `openssl rand -hex 32`); without it the API and dashboard are
    /// read-only.
    #[arg(long, env = "JOBHOST_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A host name the server is reached by (repeat for more): requests
    /// addressed to other names are refused. IP addresses and localhost
    /// always pass.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// Serve reads (the dashboard's pages and the API's GETs, every job's
    /// payload and output among them) to anyone who reaches the server,
    /// with or without the token. Without it, a server with a token needs
    /// it (or a signed-in session) for reads too, and one without a token
    /// refuses to listen where other machines reach it.
    #[arg(long)]
    public_read: bool,
    /// A token that scrapes /metrics and nothing else (at least 64 bits).
    /// Without it, /metrics is open to anyone who reaches the server.
    #[arg(long, env = "JOBHOST_METRICS_TOKEN", hide_env_values = true)]
    metrics_token: Option<String>,
}

impl TokenArgs {
    /// Serving on `listen` with this token, bodies bounded by `limits`.
    pub fn http_config(&self, listen: SocketAddr, limits: crate::store::EnqueueLimits) -> crate::http::HttpConfig {
        crate::http::HttpConfig {
            token: self.token.clone(),
            metrics_token: self.metrics_token.clone(),
            public_read: self.public_read,
            max_body_bytes: crate::http::body_limit(limits.max_payload_bytes),
            allowed_hosts: self.allow_hosts.clone(),
            // A malformed key stops `run` before this; `serve` then verifies no webhook.
            secret_key: crate::outbound::secrets::SecretKey::from_environment().ok().flatten(),
            ..crate::http::HttpConfig::new(listen)
        }
    }

    /// Whether any of it was given (it means nothing without a server).
    pub fn given(&self) -> bool {
        self.token.is_some() || !self.allow_hosts.is_empty() || self.public_read || self.metrics_token.is_some()
    }
}

/// Connections the server's requests share.
const MAX_CONNECTIONS: u32 = 8;

pub async fn serve(args: ServeArgs) -> ExitCode {
    let limits = args.db.limits();
    let config = args.token.http_config(args.listen, limits);
    // A setting that cannot work fails before the wait for the database.
    if let Err(error) = config.validate() {
        return fail(error);
    }
    let shutdown = CancellationToken::new();
    super::signals::stop_on_signals(shutdown.clone());
    // Like a host, it waits for a database that is not up yet (and
    // migrates it), on a connection it then lets go.
    let opened = crate::host::open_waiting(&args.db.database_url, 1, limits, !args.no_migrate, &shutdown).await;
    match opened {
        Ok(Some(_ready)) => {}
        Ok(None) => return ExitCode::SUCCESS,
        Err(error) => return fail(error),
    }
    // Every statement a request makes is given up at half its deadline.
    let limit = config.request_timeout / 2;
    let store = match crate::store::open_for_http(&args.db.database_url, MAX_CONNECTIONS, limits, limit).await {
        Ok(bounded) => bounded,
        Err(error) => return fail(error),
    };
    let server = match crate::http::Server::bind(&config, store.clone(), crate::metrics::Metrics::default()).await {
        Ok(server) => server,
        Err(error) => return fail(error),
    };
    // On stdout, so scripts starting it on port 0 can read the address.
    println!("{}; database {}", config.announcement(server.local_addr()), store.location());
    server.serve(shutdown).await;
    ExitCode::SUCCESS
}
