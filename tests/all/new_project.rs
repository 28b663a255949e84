//! `jobhost new`: the project it writes builds, as its README says, into a
//! component that loads and runs, in each language.

use std::path::Path;
use std::process::Command;

fn jobhost(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_jobhost")).args(args).current_dir(dir).output().expect("run jobhost")
}

/// Writes a project in `lang`, builds it with its own script, runs it once.
fn a_new_project_builds_and_runs(lang: &str, language: &str) {
    let work = tempfile::tempdir().unwrap();
    // Any job type's name, though a Rust crate's may not start with a
    // digit nor hold a dot.
    let name = if lang == "rust" { "1st.greet-rust".to_string() } else { format!("greet-{lang}") };
    let wrote = jobhost(&["new", &name, "--lang", lang], work.path());
    assert!(wrote.status.success(), "{}", String::from_utf8_lossy(&wrote.stderr));
    let said = String::from_utf8_lossy(&wrote.stdout);
    assert!(said.contains(&format!("({language}): cd ")), "names the language: {said}");
    let project = work.path().join(&name);
    // A shared target directory, so the Rust dependencies build once. Built
    // as a user builds it: without the lints CI compiles this workspace with.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("new-project-target");
    let built = Command::new("bash")
        .arg("build.sh")
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .output();
    let built = built.expect("run build.sh");
    assert!(
        built.status.success(),
        "{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    let component = format!("{name}.wasm");
    let cache = work.path().join("cache");
    let cache = cache.to_str().unwrap();
    let inspected = jobhost(&["inspect", &component, "--cache-dir", cache], &project);
    assert!(inspected.status.success(), "{}", String::from_utf8_lossy(&inspected.stderr));
    assert!(String::from_utf8_lossy(&inspected.stdout).contains(&format!("\"name\":\"{name}\"")));
    let payload = std::fs::read_to_string(project.join("payload.json")).unwrap();
    let ran = jobhost(&["exec", &component, "--payload", &payload, "--cache-dir", cache], &project);
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    let output: serde_json::Value = serde_json::from_slice(&ran.stdout).expect("the output is JSON");
    assert_eq!(output["greeting"], "hello, Ada");
    assert!(String::from_utf8_lossy(&ran.stderr).contains("greeting Ada on attempt 1"));
    // A second `new` into the same place writes nothing.
    let again = jobhost(&["new", &name, "--lang", lang], work.path());
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists and is not empty"));
}

#[test]
fn a_new_rust_project_builds_and_runs() {
    a_new_project_builds_and_runs("rust", "Rust");
}

#[test]
fn a_new_python_project_builds_and_runs() {
    a_new_project_builds_and_runs("python", "Python");
}

#[test]
fn a_new_javascript_project_builds_and_runs() {
    a_new_project_builds_and_runs("js", "JavaScript");
}

#[test]
fn a_name_that_cannot_be_a_job_type_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let refused = jobhost(&["new", "Not.A.Name"], work.path());
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot name a project"));
    assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 0, "nothing written");
}
