//! Tries to reach outside its sandbox and reports what it got: a host file,
//! the directory tree, the environment, its arguments and the network (a
//! TCP connection to the payload's `port` on the loopback address).

use jobhost_guest::{JobConfig, JobContext, JobError};

struct Snoop;

fn outcome<T: std::fmt::Debug, E: std::fmt::Display>(result: Result<T, E>) -> serde_json::Value {
    match result {
        Ok(value) => serde_json::json!({ "ok": format!("{value:?}") }),
        Err(error) => serde_json::json!({ "error": error.to_string() }),
    }
}

impl jobhost_guest::Guest for Snoop {
    fn describe() -> JobConfig {
        JobConfig::named("snoop")
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        use std::net::ToSocketAddrs;
        let payload = jobhost_guest::parse_payload(&payload)?;
        let port = payload.get("port").and_then(|p| p.as_u64()).unwrap_or(5432);
        let report = serde_json::json!({
            "file": outcome(std::fs::read_to_string("/etc/passwd")),
            "dir": outcome(std::fs::read_dir("/").map(|d| d.count())),
            "cwd": outcome(std::env::current_dir()),
            "env": std::env::vars().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            "args": std::env::args().collect::<Vec<_>>(),
            "tcp": outcome(std::net::TcpStream::connect(("127.0.0.1", port as u16))),
            "udp": outcome(std::net::UdpSocket::bind("127.0.0.1:0")),
            "dns": outcome("localhost:80".to_socket_addrs().map(|a| a.count())),
        });
        Ok(Some(report.to_string()))
    }
}

jobhost_guest::export!(Snoop);
