//! Each example guest through the real sandbox: results, limits, isolation
//! and interruption.

use crate::common;

use std::time::Duration;

use jobhost::component::{Runtime, StopSignal};
use jobhost::config::RuntimeConfig;
use jobhost::types::{Crash, LogLevel, OnConflict, RunOutcome};
use serde_json::json;

use common::{context, load, run, runtime};

fn output(outcome: &RunOutcome) -> serde_json::Value {
    common::completed_output(outcome)
}

#[tokio::test]
async fn hello_transforms_its_payload_and_logs() {
    let (runtime, _cache) = runtime();
    let hello = load(&runtime, "hello").await;
    let report = run(&runtime, &hello, json!({"name": "Ada"})).await;
    assert_eq!(output(&report.outcome), json!({"greeting": "hello, Ada", "job_id": 7}));
    assert_eq!(report.effects.logs.len(), 1);
    assert_eq!(report.effects.logs[0].level, LogLevel::Info);
    assert_eq!(report.effects.logs[0].message, "greeting Ada");
    assert_eq!(report.effects.stdout, "attempt 1 of job 7\n");
    assert!(!report.effects.truncated);
}

/// A guest cannot flood the host's own log: it echoes at most 64 KiB of a
/// run's log lines, then says it stopped; the job keeps its lines.
#[tokio::test]
async fn a_run_echoes_a_bounded_share_of_its_log_into_the_hosts_log() {
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let (runtime, _cache) = runtime();
    let hello = load(&runtime, "hello").await;
    let name = "x".repeat(4000);
    let report = run(&runtime, &hello, json!({"name": name, "log_times": 100})).await;
    assert_eq!(report.effects.logs.len(), 100, "the job keeps every line");
    let host_log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let echoed = host_log.lines().filter(|line| line.contains("greeting x")).count();
    assert_eq!(echoed, 16, "64 KiB of 4 KiB lines reach the host's log, and no more");
    assert!(host_log.contains("further lines are kept with the job only"), "{}", &host_log[..200]);
}

#[tokio::test]
async fn a_payload_that_is_not_json_fails_without_retry() {
    let (runtime, _cache) = runtime();
    let hello = load(&runtime, "hello").await;
    let report = runtime.run(&hello, &context(1, 1), "{not json", StopSignal::new()).await;
    assert!(
        matches!(&report.outcome, RunOutcome::Failed { reason } if reason.contains("payload is not JSON")),
        "{:?}",
        report.outcome
    );
}

#[tokio::test]
async fn sleep_reports_wall_clock_start_and_end() {
    let (runtime, _cache) = runtime();
    let sleep = load(&runtime, "sleep").await;
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let report = run(&runtime, &sleep, json!({"ms": 50})).await;
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let out = output(&report.outcome);
    let (started, ended) = (out["started_ms"].as_u64().unwrap(), out["ended_ms"].as_u64().unwrap());
    assert!(before <= started && started <= ended && ended <= after, "{before} {started} {ended} {after}");
    assert!(ended - started >= 50, "slept {} ms", ended - started);
}

#[tokio::test]
async fn flaky_fails_its_first_attempts_then_succeeds() {
    let (runtime, _cache) = runtime();
    let flaky = load(&runtime, "flaky").await;
    let payload = json!({"fail_times": 2}).to_string();
    for attempt in 1..=2 {
        let report = runtime.run(&flaky, &context(3, attempt), &payload, StopSignal::new()).await;
        assert!(matches!(report.outcome, RunOutcome::Retry { .. }), "attempt {attempt}: {:?}", report.outcome);
    }
    let report = runtime.run(&flaky, &context(3, 3), &payload, StopSignal::new()).await;
    assert_eq!(output(&report.outcome), json!({"succeeded_on_attempt": 3}));
    assert_eq!(flaky.config.max_attempts, 5);
}

#[tokio::test]
async fn spin_is_interrupted_at_its_timeout() {
    let (runtime, _cache) = runtime();
    let spin = load(&runtime, "spin").await;
    let report = run(&runtime, &spin, json!({})).await;
    assert_eq!(report.outcome, RunOutcome::Crashed { crash: Crash::Timeout { limit_ms: 500 } });
    assert!(report.elapsed_us >= 500_000);
}

#[tokio::test(flavor = "current_thread")]
async fn other_jobs_keep_running_while_a_guest_spins() {
    let (runtime, _cache) = runtime();
    let mut spin = load(&runtime, "spin").await;
    // Nothing but the stop signal below can end this run within the test.
    spin.config.timeout_ms = 30_000;
    let spin = std::sync::Arc::new(spin);
    let hello = load(&runtime, "hello").await;
    let signal = StopSignal::new();
    let spinning = {
        let (runtime, spin, signal) = (runtime.clone(), spin.clone(), signal.clone());
        tokio::spawn(async move { runtime.run(&spin, &context(1, 1), "{}", signal).await })
    };
    // Hand the thread to the spinning guest; it gives it back only by yielding.
    tokio::task::yield_now().await;
    // One thread only: these complete only because the spinning guest yields.
    for i in 0..5 {
        let report = run(&runtime, &hello, json!({"name": i})).await;
        assert!(report.outcome.is_completed());
    }
    assert!(!spinning.is_finished(), "the spinning guest ended before it was stopped");
    signal.stop("test over");
    let report = spinning.await.unwrap();
    assert_eq!(report.outcome, RunOutcome::Crashed { crash: Crash::Interrupted { reason: "test over".into() } });
}

#[tokio::test]
async fn a_guest_waiting_in_a_host_call_still_times_out() {
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig { default_timeout: Duration::from_millis(200), ..common::runtime_config(&cache) };
    let runtime = Runtime::new(config).unwrap();
    let sleep = load(&runtime, "sleep").await;
    let report = run(&runtime, &sleep, json!({"ms": 60_000})).await;
    assert_eq!(report.outcome, RunOutcome::Crashed { crash: Crash::Timeout { limit_ms: 200 } });
}

#[tokio::test]
async fn hog_is_stopped_at_its_memory_cap() {
    let (runtime, _cache) = runtime();
    let hog = load(&runtime, "hog").await;
    assert_eq!(hog.config.memory_limit_bytes, 32 << 20);
    let report = run(&runtime, &hog, json!({})).await;
    assert_eq!(report.outcome, RunOutcome::Crashed { crash: Crash::MemoryExceeded { limit_bytes: 32 << 20 } });
    // The host is fine: the next job runs.
    let hello = load(&runtime, "hello").await;
    assert!(run(&runtime, &hello, json!({})).await.outcome.is_completed());
}

/// A pool whose memory slots reserve only what the largest memory needs
/// (`--memory-reservation`, for hosts at a high concurrency) compiles guests
/// with explicit bounds checks: the memory cap still holds, and guests run
/// as before.
#[tokio::test]
async fn a_bounded_memory_reservation_still_caps_memory_and_runs_guests() {
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        max_memory_limit_bytes: 64 << 20,
        default_memory_limit_bytes: 64 << 20,
        memory_reservation_bytes: Some(64 << 20),
        ..common::runtime_config(&cache)
    };
    let runtime = Runtime::new(config).unwrap();
    let hog = load(&runtime, "hog").await;
    let report = run(&runtime, &hog, json!({})).await;
    assert_eq!(report.outcome, RunOutcome::Crashed { crash: Crash::MemoryExceeded { limit_bytes: 32 << 20 } });
    let hello = load(&runtime, "hello").await;
    assert!(run(&runtime, &hello, json!({"name": "bounded"})).await.outcome.is_completed());
}

#[tokio::test]
async fn a_reservation_smaller_than_the_largest_memory_is_refused() {
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig { memory_reservation_bytes: Some(16 << 20), ..common::runtime_config(&cache) };
    let error = Runtime::new(config).err().expect("refused");
    assert!(error.to_string().contains("memory_reservation_bytes"), "{error}");
}

/// A guest's sleep is timed finer than milliseconds, and never short.
#[tokio::test]
async fn a_guests_short_sleep_lasts_at_least_what_it_asked() {
    let (runtime, _cache) = runtime();
    let sleep = load(&runtime, "sleep").await;
    for ms in [1, 3] {
        let out = output(&run(&runtime, &sleep, json!({"ms": ms})).await.outcome);
        let slept_us = out["ended_us"].as_u64().unwrap() - out["started_us"].as_u64().unwrap();
        assert!(slept_us >= ms * 1000, "asked {ms} ms, slept {slept_us} µs");
    }
}

#[tokio::test]
async fn trap_reports_the_panic_message() {
    let (runtime, _cache) = runtime();
    let trap = load(&runtime, "trap").await;
    let report = run(&runtime, &trap, json!({"message": "the disk is lava"})).await;
    match &report.outcome {
        RunOutcome::Crashed { crash: Crash::Trap { message } } => {
            assert!(message.contains("the disk is lava"), "{message}");
            assert!(message.contains("unreachable"), "{message}");
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    assert!(report.effects.stderr.contains("the disk is lava"));
}

#[tokio::test]
async fn snoop_gets_nothing_from_the_host() {
    // The host has all of these; the guest must see none of them.
    assert!(std::path::Path::new("/etc/passwd").exists());
    assert!(std::env::vars().count() > 0);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (runtime, _cache) = runtime();
    let snoop = load(&runtime, "snoop").await;
    let report = run(&runtime, &snoop, json!({"port": listener.local_addr().unwrap().port()})).await;
    let out = output(&report.outcome);
    for probe in ["file", "dir", "tcp", "udp", "dns"] {
        assert!(out[probe].get("error").is_some(), "{probe} reached the host: {}", out[probe]);
    }
    // WASI's working directory is a name with nothing behind it, not the host's.
    assert_eq!(out["cwd"], json!({"ok": "\"/\""}));
    assert_eq!(out["env"], json!([]));
    assert_eq!(out["args"], json!([]));
}

#[tokio::test]
async fn a_stop_signal_interrupts_a_busy_guest_with_its_reason() {
    let (runtime, _cache) = runtime();
    let spin = load(&runtime, "spin").await;
    let signal = StopSignal::new();
    let stopper = signal.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        stopper.stop("lease lost");
    });
    let report = runtime.run(&spin, &context(1, 1), "{}", signal).await;
    // Interrupted, not timed out: the stop reached a guest that never yields on its own.
    assert_eq!(report.outcome, RunOutcome::Crashed { crash: Crash::Interrupted { reason: "lease lost".into() } });
}

#[tokio::test]
async fn a_stop_signal_interrupts_a_sleeping_guest() {
    let (runtime, _cache) = runtime();
    let sleep = load(&runtime, "sleep").await;
    let signal = StopSignal::new();
    signal.stop("shutting down");
    let report = runtime.run(&sleep, &context(1, 1), r#"{"ms": 60000}"#, signal).await;
    assert_eq!(report.outcome, RunOutcome::Crashed { crash: Crash::Interrupted { reason: "shutting down".into() } });
}

#[tokio::test]
async fn fanout_buffers_children_and_reports_progress() {
    let (runtime, _cache) = runtime();
    let fanout = load(&runtime, "fanout").await;
    let report = run(&runtime, &fanout, json!({"count": 3})).await;
    let out = output(&report.outcome);
    assert_eq!(out["enqueued"], 3);
    assert!(out["bad_name_error"].as_str().unwrap().contains("job name"), "{out}");
    assert!(out["bad_payload_error"].as_str().unwrap().contains("not valid JSON"), "{out}");
    // A runtime without a queue knows no job types, so it accepts any well-formed name.
    assert_eq!(out["unknown_type_error"], serde_json::Value::Null);
    let children = &report.effects.children;
    assert_eq!(children.len(), 4);
    assert_eq!(children.iter().filter(|c| c.job == "hello").count(), 3);
    // Stored as documents, not as JSON text inside a string.
    assert_eq!(children[0].payload, json!({"name": "child 0 of 7"}));
    assert_eq!(report.effects.progress, Some((3, 3)));
    assert_eq!(report.effects.heartbeats, 3);

    // With the fleet's job types known, an unknown one is an error the guest sees.
    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(common::runtime_config(&cache)).unwrap().with_child_check(std::sync::Arc::new(
        |probe: jobhost::component::ChildProbe| {
            Box::pin(async move {
                let job = probe.child.job;
                if job == "hello" { Ok(None) } else { Err(format!("unknown job type {job:?}")) }
            })
        },
    ));
    let fanout = load(&runtime, "fanout").await;
    let checked = run(&runtime, &fanout, json!({"count": 1})).await;
    let out = output(&checked.outcome);
    assert!(out["unknown_type_error"].as_str().unwrap().contains("unknown job type \"no-such-job\""), "{out}");
    assert_eq!(checked.effects.children.len(), 1);

    let failed = run(&runtime, &fanout, json!({"count": 2, "fail": true})).await;
    assert!(matches!(failed.outcome, RunOutcome::Failed { .. }));
    // The report still carries them; the queue commits children only with a completion.
    assert_eq!(failed.effects.children.len(), 2);
}

#[tokio::test]
async fn limited_declares_its_concurrency() {
    let (runtime, _cache) = runtime();
    let limited = load(&runtime, "limited").await;
    let concurrency = limited.config.concurrency.clone().unwrap();
    assert_eq!(concurrency.limit, 2);
    assert_eq!(concurrency.on_conflict, OnConflict::Block);
    assert_eq!(concurrency.key.render(&json!({"key": "k7"})).unwrap(), "k7");
    assert_eq!(concurrency.duration_secs, 10);
    let report = run(&runtime, &limited, json!({"key": "a", "ms": 5})).await;
    assert!(output(&report.outcome)["ended_ms"].is_u64());
}

#[tokio::test]
async fn runs_in_parallel_do_not_share_state() {
    let (runtime, _cache) = runtime();
    let hello = std::sync::Arc::new(load(&runtime, "hello").await);
    let runs: Vec<_> = (0..32)
        .map(|i| {
            let (runtime, hello) = (runtime.clone(), hello.clone());
            tokio::spawn(async move {
                runtime
                    .run(&hello, &context(i, 1), &json!({"name": i.to_string()}).to_string(), StopSignal::new())
                    .await
            })
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        let report = run.await.unwrap();
        assert_eq!(output(&report.outcome)["greeting"], format!("hello, {i}"));
        assert_eq!(report.effects.stdout, format!("attempt 1 of job {i}\n"));
        assert_eq!(report.effects.logs.len(), 1);
    }
}

// --- A hostile guest's reach is bounded by its run's limits. ---

/// A runtime whose runs have a budget of `budget` bytes and outputs of at
/// most `max_output`.
fn bounded_runtime(budget: usize, max_output: usize) -> (Runtime, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    let config =
        RuntimeConfig { run_budget_bytes: budget, max_output_bytes: max_output, ..common::runtime_config(&cache) };
    (Runtime::new(config).unwrap(), cache)
}

#[tokio::test]
async fn an_output_over_the_limit_fails_the_run_with_its_size() {
    let (runtime, _cache) = runtime();
    let hostile = load(&runtime, "hostile").await;
    let report = run(&runtime, &hostile, json!({"output_bytes": 3_000_000})).await;
    let RunOutcome::Crashed { crash } = &report.outcome else { panic!("{:.200}", format!("{:?}", report.outcome)) };
    assert_eq!(crash, &Crash::OutputTooLarge { bytes: 3_000_000, limit_bytes: 1 << 20 });
    assert_eq!(crash.to_string(), "output is 3000000 bytes, more than the limit of 1048576 bytes");
    assert!(crash.is_deterministic(), "the same run would return the same output: no retry");

    let fits = run(&runtime, &hostile, json!({"output_bytes": 500_000})).await;
    let RunOutcome::Completed { output: Some(text) } = &fits.outcome else { panic!("{:?}", fits.outcome.kind()) };
    assert_eq!(text.len(), 500_000, "kept as the text the guest returned");
    assert_eq!(output(&fits.outcome)["report"]["enqueued"], 0);
}

#[tokio::test]
async fn children_past_the_run_budget_are_refused_and_the_guest_sees_why() {
    let (runtime, _cache) = runtime();
    let hostile = load(&runtime, "hostile").await;
    let report = run(&runtime, &hostile, json!({"children": 100, "child_bytes": 1_000_000})).await;
    let out = output(&report.outcome);
    // 16 MiB holds 16 children of 1,000,007 bytes (type name and payload).
    assert_eq!(out["enqueued"], 16, "{out}");
    assert_eq!(report.effects.children.len(), 16);
    let error = out["enqueue_error"].as_str().unwrap();
    assert!(error.contains("more than the 777104 bytes left of the run's budget of 16777216 bytes"), "{error}");
}

#[tokio::test]
async fn log_lines_and_stdout_past_the_run_budget_are_dropped_and_flagged() {
    let (runtime, _cache) = bounded_runtime((256 << 10) + 100, 64 << 10);
    let hostile = load(&runtime, "hostile").await;
    let report = run(&runtime, &hostile, json!({"log_bytes": 1 << 20, "stdout_bytes": 64 << 10})).await;
    let kept: usize = report.effects.logs.iter().map(|line| line.message.len()).sum();
    assert_eq!(report.effects.logs.len(), 64, "64 of the 256 lines of 4 KiB fit");
    assert_eq!(kept, 256 << 10);
    assert_eq!(report.effects.stdout.len(), 100, "stdout kept what the lines left");
    assert!(report.effects.truncated);
    assert!(
        matches!(report.outcome, RunOutcome::Crashed { crash: Crash::OverBudget { left_bytes: 0, .. } }),
        "nothing was left for the output: {:?}",
        report.outcome
    );
}

#[tokio::test]
async fn an_output_past_what_the_budget_left_fails_the_run() {
    let (runtime, _cache) = bounded_runtime(256 << 10, 128 << 10);
    let hostile = load(&runtime, "hostile").await;
    let report = run(&runtime, &hostile, json!({"log_bytes": 200 << 10, "output_bytes": 100_000})).await;
    let crash = Crash::OverBudget { bytes: 100_000, left_bytes: (256 - 200) << 10, budget_bytes: 256 << 10 };
    assert_eq!(report.outcome, RunOutcome::Crashed { crash: crash.clone() });
    assert_eq!(
        crash.to_string(),
        "output is 100000 bytes, more than the 57344 bytes left of the run's budget of 262144 bytes"
    );
}

/// The check a guest's `enqueue` makes is given counts per (type, key), not
/// every earlier child: its cost does not grow with the children before it.
#[tokio::test]
async fn each_enqueue_check_carries_counts_per_key_not_earlier_children() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let cache = tempfile::tempdir().unwrap();
    let check = std::sync::Arc::new(move |probe: jobhost::component::ChildProbe| {
        record.lock().unwrap().push((probe.earlier.len(), probe.earlier.count(&probe.child.job, "one-key")));
        Box::pin(async { Ok(Some("one-key".to_string())) }) as _
    });
    let runtime = Runtime::new(common::runtime_config(&cache)).unwrap().with_child_check(check);
    let hostile = load(&runtime, "hostile").await;
    let report = run(&runtime, &hostile, json!({"children": 200, "child_bytes": 100})).await;
    assert_eq!(output(&report.outcome)["enqueued"], 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 200, "one check per call");
    for (i, (entries, same_key)) in seen.iter().enumerate() {
        assert!(*entries <= 1, "call {i} carried {entries} entries");
        assert_eq!(*same_key as usize, i, "call {i} knows the {i} children of its key before it");
    }
}
