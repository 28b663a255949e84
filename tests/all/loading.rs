//! Loading components: bad input gets an error that names the file and the
//! reason, and compiled artifacts are cached by digest.

use crate::common;

use std::path::Path;

use jobhost::component::{LoadErrorKind, Runtime};
use serde_json::json;

use common::{guest, load, run, runtime};

async fn load_error(runtime: &Runtime, bytes: Vec<u8>) -> jobhost::component::LoadError {
    runtime.load_bytes(Path::new("/components/bad.wasm"), bytes).await.expect_err("must not load")
}

#[tokio::test]
async fn garbage_is_not_a_component() {
    let (runtime, _cache) = runtime();
    let error = load_error(&runtime, b"definitely not wasm".to_vec()).await;
    assert!(matches!(error.kind, LoadErrorKind::Compile(_)), "{error}");
    assert_eq!(
        error.to_string(),
        "/components/bad.wasm: not a valid WebAssembly component: the file is not WebAssembly \
         (it does not begin with the magic bytes 00 61 73 6d)",
        "one line, without the parser's arrays of bytes"
    );
}

#[tokio::test]
async fn a_core_module_is_not_a_component() {
    let (runtime, _cache) = runtime();
    let module = wat::parse_str("(module (func (export \"run\")))").unwrap();
    let error = load_error(&runtime, module).await;
    assert!(matches!(error.kind, LoadErrorKind::Compile(_)), "{error}");
}

#[tokio::test]
async fn a_component_without_the_exports_is_refused() {
    let (runtime, _cache) = runtime();
    let empty = wat::parse_str("(component)").unwrap();
    let error = load_error(&runtime, empty).await;
    assert!(matches!(error.kind, LoadErrorKind::World(_)), "{error}");
    assert!(error.to_string().contains("describe"), "{error}");
}

#[tokio::test]
async fn a_component_importing_what_the_host_lacks_is_refused() {
    let (runtime, _cache) = runtime();
    let needs_more =
        wat::parse_str(r#"(component (import "acme:secrets/vault" (instance (export "get" (func)))))"#).unwrap();
    let error = load_error(&runtime, needs_more).await;
    assert!(matches!(error.kind, LoadErrorKind::World(_)), "{error}");
    assert!(error.to_string().contains("acme:secrets/vault"), "{error}");
}

#[tokio::test]
async fn an_invalid_configuration_names_the_file_and_field() {
    let (runtime, _cache) = runtime();
    let path = guest("misconfigured");
    let error = runtime.load_file(&path).await.expect_err("limit 0 must be refused");
    match &error.kind {
        LoadErrorKind::Config(invalid) => assert_eq!(invalid.field, "concurrency.limit"),
        other => panic!("expected a config error, got {other:?}"),
    }
    let text = error.to_string();
    assert!(text.contains("misconfigured.wasm") && text.contains("concurrency.limit"), "{text}");
}

#[tokio::test]
async fn a_missing_file_is_reported() {
    let (runtime, _cache) = runtime();
    let error = runtime.load_file(Path::new("/nonexistent/x.wasm")).await.unwrap_err();
    assert!(matches!(error.kind, LoadErrorKind::Read(_)), "{error}");
}

#[tokio::test]
async fn compiled_components_are_cached_by_digest() {
    let cache = tempfile::tempdir().unwrap();
    let cached_files = || std::fs::read_dir(cache.path()).unwrap().count();
    let first = Runtime::new(common::runtime_config(&cache)).unwrap();
    let hello = load(&first, "hello").await;
    assert_eq!(cached_files(), 1);
    let artifact = std::fs::read_dir(cache.path()).unwrap().next().unwrap().unwrap().path();
    assert!(artifact.file_name().unwrap().to_str().unwrap().starts_with(&hello.digest));

    // A new runtime (a restarted host) loads from the cache and runs it.
    let second = Runtime::new(common::runtime_config(&cache)).unwrap();
    let again = load(&second, "hello").await;
    assert_eq!(again.digest, hello.digest);
    assert!(run(&second, &again, json!({"name": "cache"})).await.outcome.is_completed());
    assert_eq!(cached_files(), 1);

    // A corrupt artifact is discarded and rebuilt, never trusted.
    std::fs::write(&artifact, b"corrupt").unwrap();
    let third = Runtime::new(common::runtime_config(&cache)).unwrap();
    let rebuilt = load(&third, "hello").await;
    assert!(run(&third, &rebuilt, json!({})).await.outcome.is_completed());
    assert!(std::fs::metadata(&artifact).unwrap().len() > 1000, "artifact was rewritten");
}

#[tokio::test]
async fn more_runs_than_pool_slots_wait_for_a_slot() {
    let cache = tempfile::tempdir().unwrap();
    let config = jobhost::config::RuntimeConfig { max_concurrent_runs: 2, ..common::runtime_config(&cache) };
    let runtime = Runtime::new(config).unwrap();
    let sleep = std::sync::Arc::new(load(&runtime, "sleep").await);
    let runs: Vec<_> = (0..8)
        .map(|_| {
            let (runtime, sleep) = (runtime.clone(), sleep.clone());
            tokio::spawn(async move { run(&runtime, &sleep, json!({"ms": 20})).await })
        })
        .collect();
    for run in runs {
        let report = run.await.unwrap();
        assert!(report.outcome.is_completed(), "{:?}", report.outcome);
    }
}

/// A component built against `jobhost:job@0.1.0` (before `on-duplicate`
/// and the schedule record) loads, takes the defaults of what 0.2.0 added,
/// logs through the old imports and runs.
#[tokio::test]
async fn a_component_of_the_first_world_version_loads_and_runs() {
    let (runtime, _cache) = runtime();
    let legacy = load(&runtime, "legacy").await;
    let unique = legacy.config.unique.as_ref().expect("its uniqueness carried over");
    assert_eq!(unique.strategy, jobhost::types::UniqueStrategy::UntilExecuted);
    assert_eq!(unique.on_duplicate, jobhost::types::OnDuplicate::Skip, "the default of a field 0.1.0 lacks");
    assert_eq!(legacy.config.max_attempts, 3);
    let report = run(&runtime, &legacy, json!({"id": 7})).await;
    assert_eq!(common::completed_output(&report.outcome), json!({"id": 7}));
    assert_eq!(report.effects.logs.len(), 1, "its log line came through the 0.1.0 import");
}

/// A component built against `jobhost:job@0.2.0` (before the `batches`
/// interface) loads with every field it declares, logs and reports progress
/// through the 0.2.0 imports, and runs.
#[tokio::test]
async fn a_component_of_the_second_world_version_loads_and_runs() {
    let (runtime, _cache) = runtime();
    let legacy = load(&runtime, "legacy_v2").await;
    let unique = legacy.config.unique.as_ref().expect("its uniqueness carried over");
    assert_eq!(unique.on_duplicate, jobhost::types::OnDuplicate::Replace, "a field 0.2.0 added, carried over");
    assert_eq!(legacy.config.max_attempts, 2);
    let report = run(&runtime, &legacy, json!({"id": 8})).await;
    assert_eq!(common::completed_output(&report.outcome), json!({"id": 8}));
    assert_eq!(report.effects.logs.len(), 1, "its log line came through the 0.2.0 import");
    assert_eq!(report.effects.progress, Some((1, 1)));
}

/// A component built against `jobhost:job@0.3.0` (before `outbound`)
/// loads declaring no outbound rules, logs through the 0.3.0 imports and
/// opens a batch and adds to it through the 0.3.0 `batches` imports.
#[tokio::test]
async fn a_component_of_the_third_world_version_loads_and_runs() {
    let (runtime, _cache) = runtime();
    let legacy = load(&runtime, "legacy_v3").await;
    assert_eq!(legacy.config.max_attempts, 3);
    assert!(legacy.config.outbound.is_empty(), "the default of a field 0.3.0 lacks");
    let report = run(&runtime, &legacy, json!({"id": 9})).await;
    assert_eq!(common::completed_output(&report.outcome), json!({"id": 9}));
    assert_eq!(report.effects.logs.len(), 1, "its log line came through the 0.3.0 import");
    assert_eq!(report.effects.batches.len(), 1, "a batch opened through the 0.3.0 import");
    assert_eq!(report.effects.children.len(), 1);
    assert_eq!(report.effects.children[0].batch, Some(jobhost::types::ChildBatch::Opened(0)));
}

/// A component built against `jobhost:job@0.4.0` (before `workflows`)
/// loads with its outbound rules, logs through the 0.4.0 imports and opens
/// a batch and adds to it through the 0.4.0 `batches` imports.
#[tokio::test]
async fn a_component_of_the_fourth_world_version_loads_and_runs() {
    let (runtime, _cache) = runtime();
    let legacy = load(&runtime, "legacy_v4").await;
    assert_eq!(legacy.config.max_attempts, 3);
    let origins: Vec<String> = legacy.config.outbound.iter().map(|rule| rule.origin.clone()).collect();
    assert_eq!(origins, ["https://api.example.com"], "its 0.4.0 outbound rule came through");
    let report = run(&runtime, &legacy, json!({"id": 10})).await;
    assert_eq!(common::completed_output(&report.outcome), json!({"id": 10}));
    assert_eq!(report.effects.logs.len(), 1, "its log line came through the 0.4.0 import");
    assert_eq!(report.effects.batches.len(), 1, "a batch opened through the 0.4.0 import");
    assert_eq!(report.effects.children[0].batch, Some(jobhost::types::ChildBatch::Opened(0)));
}

#[tokio::test]
async fn a_component_of_the_fifth_world_version_loads_and_runs() {
    let (runtime, _cache) = runtime();
    let legacy = load(&runtime, "legacy_v5").await;
    assert_eq!(legacy.config.max_attempts, 4);
    assert_eq!(legacy.config.rate_limit, None, "0.5.0 declares no rate limit: it takes the default, none");
    let origins: Vec<String> = legacy.config.outbound.iter().map(|rule| rule.origin.clone()).collect();
    assert_eq!(origins, ["https://api.example.com"], "its outbound rule came through");
    let report = run(&runtime, &legacy, json!({"id": 11})).await;
    assert_eq!(common::completed_output(&report.outcome), json!({"id": 11}));
    let logged: Vec<&str> = report.effects.logs.iter().map(|line| line.message.as_str()).collect();
    // Run without a queue, the host cannot tell: its answer came through the 0.5.0 import.
    assert_eq!(
        logged,
        [
            "0.5.0 run of job 7, step: unknown: this host cannot tell which workflow step a job is (it runs without a queue)"
        ]
    );
    assert_eq!(report.effects.batches.len(), 1, "a batch opened through the 0.5.0 import");
}

#[tokio::test]
async fn a_component_of_the_sixth_world_version_loads_and_runs() {
    let (runtime, _cache) = runtime();
    let legacy = load(&runtime, "legacy_v6").await;
    assert_eq!(legacy.config.max_attempts, 6);
    assert_eq!(legacy.config.rate_limit.as_ref().map(|r| (r.limit, r.period_ms)), Some((7, 1000)));
    assert!(legacy.config.on_events.is_empty(), "0.6.0 subscribes to no event: the default, none");
    let report = run(&runtime, &legacy, json!({"id": 12})).await;
    assert_eq!(common::completed_output(&report.outcome), json!({"id": 12}));
    let logged: Vec<&str> = report.effects.logs.iter().map(|line| line.message.as_str()).collect();
    assert_eq!(
        logged,
        [
            "0.6.0 run of job 7, step: unknown: this host cannot tell which workflow step a job is (it runs without a queue)"
        ]
    );
    let throttled = run(&runtime, &legacy, json!({"throttle_ms": 2500})).await;
    assert_eq!(
        throttled.outcome,
        jobhost::types::RunOutcome::Throttled { retry_after_ms: 2500 },
        "its 0.6.0 throttled error came through"
    );
}

#[tokio::test]
async fn a_component_of_the_seventh_world_version_loads_and_runs() {
    let (runtime, _cache) = runtime();
    let legacy = load(&runtime, "legacy_v7").await;
    assert_eq!(legacy.config.max_attempts, 7);
    assert_eq!(legacy.config.on_events, ["legacy.ping"], "its 0.7.0 event keys came through");
    let report = run(&runtime, &legacy, json!({"id": 13})).await;
    assert_eq!(common::completed_output(&report.outcome), json!({"id": 13}));
    let logged: Vec<&str> = report.effects.logs.iter().map(|line| line.message.as_str()).collect();
    assert_eq!(logged, ["0.7.0 run of job 7"]);
    let sent: Vec<(&str, &serde_json::Value)> =
        report.effects.events.iter().map(|event| (event.key.as_str(), &event.payload)).collect();
    assert_eq!(sent, [("legacy.pong", &json!({"id": 13}))], "sent through the 0.7.0 events import");
    let steps = &report.effects.workflows.steps;
    assert_eq!(steps.len(), 1, "a step added through the 0.7.0 workflows import");
    assert_eq!(steps[0].step.wait, Some(jobhost::step::Wait::sleep_ms(1500)), "with its 0.7.0 wait");
    assert!(report.effects.schedules.is_empty());
}

/// A component instantiating `module` `count` times.
fn instantiating(module: &str, count: usize) -> Vec<u8> {
    let instances: String = (0..count).map(|_| "(core instance (instantiate $m))").collect();
    wat::parse_str(format!("(component (core module $m {module}) {instances})")).unwrap()
}

#[tokio::test]
async fn a_component_past_the_pools_limits_is_refused_naming_the_limit() {
    let (runtime, _cache) = runtime();
    let cases = [
        (instantiating("", 51), "at most 50 core instances per component"),
        (instantiating("(memory 1)", 5), "at most 4 linear memories per component"),
        (instantiating("(memory 20000)", 1), "a memory of at most 1024 MiB"),
    ];
    for (bytes, limit) in cases {
        let error = load_error(&runtime, bytes).await;
        assert!(matches!(error.kind, LoadErrorKind::TooLarge(_)), "{error}");
        let text = error.to_string();
        assert!(text.contains("does not fit: needs more than this host's instance pool allows"), "{text}");
        assert!(text.contains(limit), "{text}");
    }
    // Within every limit, the same shapes compile (and fail later, for
    // want of the world's exports).
    let error = load_error(&runtime, instantiating("(memory 1)", 4)).await;
    assert!(matches!(error.kind, LoadErrorKind::World(_)), "{error}");
}
