//! I/O-bound jobs, and what outbound HTTP costs per request:
//!
//! - one host at `--concurrency 1000` (PostgreSQL), 20,000 `fetcher` jobs
//!   that each send one GET to a local server answering after 100 ms: the
//!   ideal is concurrency ÷ latency, 10,000 jobs/s. Reported: jobs/s from
//!   the first start to the last finish (the database's clock), the host's
//!   CPU time and peak resident memory (`/proc/PID`), and how busy the
//!   whole machine was (host, database and server together);
//! - the allow-list's decision and the placeholder substitution, per
//!   request, in this process (µs).
//!
//! `cargo bench --bench outbound` (after `guests/build.sh`). Drops and
//! recreates database `jobhost_bench`. `cargo bench --bench outbound --
//! --serve 127.0.0.1:8099` only runs the slow server, for the peers'
//! script (`benches/peers/io.mjs`), so both sides talk to the same server.
//! `OUTBOUND_JOBS`, `OUTBOUND_RUNS` and `OUTBOUND_DELAY_MS` change the
//! workload.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{BenchDb, cpu_seconds, start_host_with, stop};
use http_body_util::{BodyExt, Full};
use jobhost::outbound::policy::SecretRoute;
use jobhost::outbound::redact::RunSecrets;
use jobhost::outbound::substitute::Places;
use jobhost::outbound::{GrantRule, Origin, Policy, Rule};
use jobhost::store::EnqueueParams;
use jobhost::store::grant::{GrantTimeouts, NewGrant};

const CONCURRENCY: &str = "1000";
const SECRET: &str = "key-0123456789abcdef";
const HOSTS: &str = "SELECT count(*)::float8 FROM jobhost.hosts";
const ARCHIVED: &str = "SELECT count(*)::float8 FROM jobhost.archive";
const ANSWERED: &str = "SELECT count(*)::float8 FROM jobhost.archive WHERE output->>'status' = '200'";
const SPAN_SECS: &str = "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM jobhost.archive";

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A server on its own thread answering `ok` to every request after
/// `delay`, keeping connections alive for clients that reuse them.
fn slow_server(address: SocketAddr, delay: Duration) -> SocketAddr {
    let (bound_tx, bound) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            // A backlog for a thousand clients connecting at once (std's is
            // 128: connections past it would wait a second for a resent SYN).
            let socket =
                if address.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() };
            let socket = socket.unwrap();
            socket.set_reuseaddr(true).unwrap();
            socket.bind(address).expect("bind the slow server");
            let listener = socket.listen(4096).unwrap();
            bound_tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new().fallback(move || async move {
                tokio::time::sleep(delay).await;
                "ok"
            });
            axum::serve(listener, app).await.unwrap();
        });
    });
    bound.recv().unwrap()
}

/// A `/proc/PID/status` field in MB (`VmRSS`, `VmHWM`).
fn memory_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() / 1024.0
}

/// The machine's busy and total ticks so far, from `/proc/stat`.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let ticks: Vec<u64> = stat.lines().next().unwrap().split_whitespace().skip(1).map(|t| t.parse().unwrap()).collect();
    let total: u64 = ticks.iter().sum();
    (total - ticks[3] - ticks.get(4).copied().unwrap_or(0), total)
}

/// One run: a fresh database, the grant, one host, `jobs` requests.
async fn run(jobs: usize, target: SocketAddr, components: &Path, cache: &Path) {
    let db = BenchDb::fresh(false).await;
    let grant = NewGrant {
        job_type: "fetcher".into(),
        origin: format!("http://{target}"),
        methods: vec!["GET".into()],
        ..Default::default()
    };
    db.store().grant_set(&grant).await.unwrap();
    let host = start_host_with(db.url(), components, cache, &["--concurrency", CONCURRENCY]);
    db.wait_for(HOSTS, HOSTS, 1.0).await;
    let (pid, idle_mb) = (host.id(), memory_mb(host.id(), "VmRSS"));
    let url = format!("http://{target}/job");
    let payload: Vec<_> =
        (0..jobs).map(|_| EnqueueParams::new("fetcher", serde_json::json!({ "url": url, "discard": true }))).collect();
    let (cpu_before, machine_before, clock) = (cpu_seconds(pid), machine_ticks(), Instant::now());
    db.store().job_enqueue(&payload).await.unwrap();
    db.wait_for(ARCHIVED, ARCHIVED, jobs as f64).await;
    let (cpu, machine_after, wall) = (cpu_seconds(pid) - cpu_before, machine_ticks(), clock.elapsed());
    let peak_mb = memory_mb(pid, "VmHWM");
    stop(host);
    let answered = db.float(ANSWERED, ANSWERED).await;
    assert_eq!(answered as usize, jobs, "every request answered 200");
    let span = db.float(SPAN_SECS, SPAN_SECS).await;
    let busy = (machine_after.0 - machine_before.0) as f64 / (machine_after.1 - machine_before.1) as f64;
    println!(
        "| {:.0} | {:.2} s | {:.1} s ({:.0}% of a core) | {:.0} MB → {:.0} MB | {:.0}% |",
        jobs as f64 / span,
        span,
        cpu,
        100.0 * cpu / wall.as_secs_f64(),
        idle_mb,
        peak_mb,
        100.0 * busy,
    );
}

/// Mean time of `f` over `rounds` calls, in µs.
fn per_call(rounds: u32, mut f: impl FnMut()) -> f64 {
    f();
    let clock = Instant::now();
    for _ in 0..rounds {
        f();
    }
    clock.elapsed().as_secs_f64() * 1e6 / f64::from(rounds)
}

fn rule(origin: &str, methods: &[&str], secrets: &[&str]) -> Rule {
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
    Rule { origin: origin.parse().unwrap(), methods: strings(methods), secrets: strings(secrets) }
}

fn grant(rule: Rule, secrets_in: Places) -> GrantRule {
    let timeouts = GrantTimeouts::default();
    GrantRule { rule, private: false, idempotency_key: false, timeouts, secrets_in, secret_headers: Vec::new() }
}

/// A request as the guest hands it over: the key's placeholder in a
/// header, and (for `body`) a 4 KiB JSON body with it once.
fn request(secrets: &RunSecrets, body: bool) -> http::Request<wasmtime_wasi_http::WasiBody> {
    let placeholder = &secrets.environment()[0].1;
    let text =
        if body { format!("{{\"key\":\"{placeholder}\",\"pad\":\"{}\"}}", "x".repeat(4_000)) } else { String::new() };
    let body = Full::new(Bytes::from(text)).map_err(|never| match never {}).boxed_unsync();
    http::Request::post("https://api.mailer.example/v3/messages")
        .header("authorization", format!("Bearer {placeholder}"))
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

/// Mean µs to build, substitute (where `places` allow) and read a request
/// with a 4 KiB body.
async fn swapped_body_cost(secrets: &RunSecrets, allowed: &[String], places: Places) -> f64 {
    let routes: Vec<SecretRoute> =
        allowed.iter().map(|name| SecretRoute { name: name.clone(), places, headers: None }).collect();
    const ROUNDS: u32 = 20_000;
    let swapped = secrets.substitute(request(secrets, true), &routes);
    let sent = swapped.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(sent.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), places.body, "the body carries the secret");
    let clock = Instant::now();
    for _ in 0..ROUNDS {
        let swapped = secrets.substitute(request(secrets, true), &routes);
        std::hint::black_box(swapped.into_body().collect().await.unwrap().to_bytes());
    }
    clock.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS)
}

/// A response as a server sends it: `size` bytes in 16 KiB frames (as
/// hyper reads them), the value echoed once in a header and once in the
/// body when `echoed`.
fn response(size: usize, echoed: bool) -> http::Response<wasmtime_wasi_http::WasiBody> {
    let mut text = "x".repeat(size);
    if echoed {
        text.replace_range(size / 2..size / 2 + SECRET.len(), SECRET);
    }
    let frames = text.as_bytes().chunks(16 << 10).map(Bytes::copy_from_slice).collect();
    http::Response::builder()
        .header("x-echo", if echoed { SECRET } else { "none" })
        .header("content-length", size)
        .body(Frames(frames).boxed_unsync())
        .unwrap()
}

/// A body of the given frames, each ready at once.
struct Frames(std::collections::VecDeque<Bytes>);

impl hyper::body::Body for Frames {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|bytes| Ok(hyper::body::Frame::data(bytes))))
    }
}

/// Mean µs to read a response of `size` bytes swapped back, less reading
/// it untouched.
async fn swap_back_cost(secrets: &RunSecrets, size: usize, rounds: u32) -> (f64, f64) {
    let read = secrets.swap_back(response(size, true), false).unwrap().into_body().collect().await.unwrap().to_bytes();
    assert!(!read.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "swapped back");
    let mut timed = [0.0f64; 2];
    for (n, swapping) in [false, true].into_iter().enumerate() {
        let clock = Instant::now();
        for _ in 0..rounds {
            let response = response(size, true);
            let response = if swapping { secrets.swap_back(response, false).unwrap() } else { response };
            std::hint::black_box(response.into_body().collect().await.unwrap().to_bytes());
        }
        timed[n] = clock.elapsed().as_secs_f64() * 1e6 / f64::from(rounds);
    }
    (timed[0], timed[1])
}

/// The per-request costs, in this process.
async fn costs() {
    let policy = Policy {
        job_type: "mailer".into(),
        declared: vec![
            rule("https://api.mailer.example", &["POST"], &["MAIL_KEY"]),
            rule("https://*.storage.example", &["GET", "PUT"], &[]),
            rule("http://127.0.0.1:*", &[], &[]),
        ],
        granted: vec![
            grant(rule("https://api.mailer.example", &["POST"], &["MAIL_KEY"]), Places::of(&["body".into()])),
            grant(rule("https://*.storage.example", &["GET"], &[]), Places::default()),
        ],
    };
    let origin = Origin::of_uri(&"https://api.mailer.example/v3/messages".parse().unwrap()).unwrap();
    let decide = per_call(200_000, || {
        std::hint::black_box(policy.decide("POST", std::hint::black_box(&origin)).unwrap());
    });
    let refuse = per_call(200_000, || {
        std::hint::black_box(policy.decide("DELETE", std::hint::black_box(&origin)).unwrap_err());
    });
    let secrets = RunSecrets::new(&["MAIL_KEY".into()], vec![("MAIL_KEY".into(), SECRET.into())]).unwrap();
    let allowed = vec!["MAIL_KEY".to_string()];
    let header_routes = [SecretRoute { name: "MAIL_KEY".into(), places: Places::default(), headers: None }];
    let header = per_call(100_000, || {
        std::hint::black_box(secrets.substitute(request(&secrets, false), &header_routes));
    });
    let unsubstituted = per_call(100_000, || {
        std::hint::black_box(request(&secrets, true));
    });
    let body = swapped_body_cost(&secrets, &allowed, Places::of(&["body".into()])).await;
    let building = swapped_body_cost(&secrets, &allowed, Places::default()).await;
    let back_small = swap_back_cost(&secrets, 4 << 10, 20_000).await;
    let back_large = swap_back_cost(&secrets, 1 << 20, 200).await;
    let line = format!("answer 200: {{\"headers\": {{\"x-request-id\": \"{}\"}}}}", "r".repeat(160));
    let redact_line = (
        per_call(200_000, || {
            let mut line = std::hint::black_box(line.clone());
            secrets.redact_text(&mut line);
            std::hint::black_box(line);
        }),
        per_call(200_000, || {
            std::hint::black_box(std::hint::black_box(line.clone()));
        }),
    );
    println!("| step | µs per request |");
    println!("|---|---|");
    println!("| allow-list decision, allowed (3 declared rules, 2 grants) | {decide:.2} |");
    println!("| allow-list decision, refused with its hint | {refuse:.2} |");
    println!("| placeholder swapped in a header | {:.2} |", header - unsubstituted.min(header));
    println!("| placeholder swapped in a 4 KiB body, streamed | {:.2} |", body - building.min(body));
    let cost = |(untouched, swapped): (f64, f64)| {
        format!("{:.2} ({untouched:.2} read untouched, {swapped:.2} swapped)", swapped - untouched)
    };
    println!("| response swapped back, header and 4 KiB body | {} |", cost(back_small));
    println!("| response swapped back, header and 1 MiB body | {} |", cost(back_large));
    println!(
        "| a 200-byte guest log line redacted (no value in it) | {:.3} ({:.3} copying it alone) |",
        redact_line.0 - redact_line.1,
        redact_line.1
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let delay = Duration::from_millis(setting("OUTBOUND_DELAY_MS", 100));
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--serve") {
        let address = args.get(at + 1).map_or("127.0.0.1:8099", String::as_str).parse().expect("an address");
        println!("serving on http://{}, answering after {delay:?}", slow_server(address, delay));
        std::future::pending::<()>().await;
    }
    costs().await;

    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/dist");
    assert!(guests.join("fetcher.wasm").exists(), "run guests/build.sh first");
    let components = tempfile::tempdir().unwrap();
    std::fs::copy(guests.join("fetcher.wasm"), components.path().join("fetcher.wasm")).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let target = slow_server("127.0.0.1:0".parse().unwrap(), delay);
    let jobs = setting("OUTBOUND_JOBS", 20_000) as usize;
    println!();
    println!(
        "| `fetcher`, one host, --concurrency {CONCURRENCY}, {jobs} jobs of one request ({delay:?}) | jobs/s | span | host CPU | host RSS idle → peak | machine busy |"
    );
    println!("|---|---|---|---|---|---|");
    for _ in 0..setting("OUTBOUND_RUNS", 3) {
        print!("| jobhost ");
        run(jobs, target, components.path(), cache.path()).await;
    }
}
