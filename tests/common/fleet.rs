//! A fleet of real `jobhost run` processes on one database, for the tests
//! that fail parts of it: starting and signalling hosts, and the invariants
//! checked while and after the fleet works.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::db::{Backend, TestDb};
use super::{eventually, guest};

/// The fleets of different tests would share two cores; one at a time.
pub static ONE_FLEET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a host may take to exit after SIGTERM: its grace period (5 s)
/// and the write of its last results, with room to spare.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// A components directory holding the named example guests.
pub fn components(guests: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for name in guests {
        std::fs::copy(guest(name), dir.path().join(format!("{name}.wasm"))).expect("copy the guest");
    }
    dir
}

/// `jobhost run` against `url` with short intervals, quiet unless a test
/// changes its environment or output.
pub fn host_command(url: &str, components: &Path, cache: &Path) -> Command {
    host_command_beating(url, components, cache, "250ms", "1s")
}

/// [`host_command`] with its own heartbeat and default lease.
pub fn host_command_beating(url: &str, components: &Path, cache: &Path, heartbeat: &str, lease: &str) -> Command {
    let mut command = host_command_running(url, components, cache, 8);
    command.args(["--heartbeat", heartbeat, "--lease", lease]);
    command
}

/// [`host_command`] running at most `concurrency` jobs at once and leasing
/// none ahead: a host that cannot take every job, so a fleet's others must.
pub fn host_command_small(url: &str, components: &Path, cache: &Path, concurrency: usize) -> Command {
    let mut command = host_command_running(url, components, cache, concurrency);
    command.args(["--heartbeat", "250ms", "--lease", "1s", "--prefetch", "0"]);
    command
}

fn host_command_running(url: &str, components: &Path, cache: &Path, concurrency: usize) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_jobhost"));
    command
        .args(["run", "--no-migrate", "--concurrency", &concurrency.to_string()])
        .args(["--poll", "200ms", "--maintenance-interval", "100ms", "--grace", "5s"])
        .arg("--components")
        .arg(components)
        .arg("--cache-dir")
        .arg(cache)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    keep_log_if_asked(&mut command);
    command
}

/// With `JOBHOST_TEST_HOST_LOGS` set to a directory, a host's debug log
/// goes to a file of its own there, so a fault test that fails once in
/// many runs can be read afterwards; otherwise the hosts stay quiet.
fn keep_log_if_asked(command: &mut Command) {
    static HOSTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let Some(dir) = std::env::var_os("JOBHOST_TEST_HOST_LOGS") else { return };
    let n = HOSTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = Path::new(&dir).join(format!("host-{}-{n}.log", std::process::id()));
    let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    command.env("RUST_LOG", "info,jobhost=debug").stderr(file);
}

/// Starts a host on the test's database.
pub fn start_host(db: &TestDb, components: &Path, cache: &Path) -> Host {
    Host::start(&mut host_command(&db.url, components, cache))
}

/// A `jobhost run` process, killed if the test ends (or fails) without
/// having stopped it, so no host outlives its test.
pub struct Host {
    child: Child,
}

impl Host {
    /// Spawns `command`.
    pub fn start(command: &mut Command) -> Host {
        Host { child: command.spawn().expect("start jobhost run") }
    }

    /// The process's standard output, piped by its command.
    pub fn take_stdout(&mut self) -> std::process::ChildStdout {
        self.child.stdout.take().expect("a piped stdout")
    }

    /// The process's standard error, piped by its command.
    pub fn take_stderr(&mut self) -> std::process::ChildStderr {
        self.child.stderr.take().expect("a piped stderr")
    }

    /// The process id, which the host's id in the fleet contains.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An SQL `LIKE` pattern matching this host's id (`{hostname}-{pid}-{suffix}`).
    pub fn id_pattern(&self) -> String {
        format!("%-{}-%", self.pid())
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` to the process, which must not have been reaped.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on a child process this test started and has not reaped.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "signal {signal} to {}", self.child.id());
    }

    /// Waits for the process to exit, for at most [`EXIT_WITHIN`].
    pub async fn wait(&mut self) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + EXIT_WITHIN;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for jobhost run") {
                return status;
            }
            assert!(tokio::time::Instant::now() < deadline, "host {} did not exit within {EXIT_WITHIN:?}", self.pid());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the host with SIGTERM and checks that it exits gracefully.
    pub async fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        let status = self.wait().await;
        assert!(status.success(), "host {} exits gracefully on SIGTERM: {status}", self.pid());
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until each of `hosts` is in the fleet serving `job_types` job types.
pub async fn wait_serving(db: &TestDb, hosts: &[&Host], job_types: usize) {
    let types = db.dialect("cardinality(job_types)", "json_array_length(job_types)");
    for host in hosts {
        let serving = format!(
            "SELECT count(*) FROM jobhost.hosts WHERE id LIKE '{}' AND {types} = {job_types}",
            host.id_pattern()
        );
        eventually(Duration::from_secs(60), || async { db.scalar(&serving).await == 1 }).await;
    }
}

/// Jobs whose archived errors say this host's lease expired under them.
pub async fn redone_after(db: &TestDb, host: &Host) -> i64 {
    let errors = db.dialect("errors::text", "errors");
    db.scalar(format!(
        "SELECT count(*) FROM jobhost.archive WHERE {errors} LIKE '%lease expired%host {}'",
        host.id_pattern()
    ))
    .await
}

/// How a key's runs may overlap: by the guests' own clocks, the most runs
/// of one key that were ever in progress at once.
pub fn most_at_once(mut runs: Vec<(u64, u64)>) -> usize {
    // Half-open [start, end): an end at the same millisecond as a start comes first.
    let mut events: Vec<(u64, i32)> = runs.drain(..).flat_map(|(start, end)| [(start, 1), (end, -1)]).collect();
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, change) in events {
        now += change;
        most = most.max(now);
    }
    most as usize
}

/// Every key's completed runs, from the outputs the guests reported.
pub async fn runs_by_key(db: &TestDb, job: &str) -> BTreeMap<String, Vec<(u64, u64)>> {
    let (started, ended) = match db.backend {
        Backend::Postgres => ("(output->>'started_ms')::bigint", "(output->>'ended_ms')::bigint"),
        Backend::Sqlite => ("output->>'started_ms'", "output->>'ended_ms'"),
    };
    let rows: Vec<(String, i64, i64)> = db
        .rows(format!(
            "SELECT concurrency_key, {started}, {ended} FROM jobhost.archive WHERE job = '{job}' AND state = 'completed'"
        ))
        .await;
    let mut by_key: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for (key, start, end) in rows {
        by_key.entry(key).or_default().push((start as u64, end as u64));
    }
    by_key
}

/// Checked in one snapshot while the fleet runs: every semaphore counts
/// exactly the live jobs holding its slots, and no key has more live jobs
/// than its job type's limit. Returns how many keys break each.
pub async fn slots_match_jobs(db: &TestDb) -> (i64, i64) {
    let limit = db.dialect(
        "jobhost.slot_limit(coalesce(l.job, s.job))",
        "coalesce((SELECT json_extract(t.config, '$.concurrency.limit') FROM job_types t
                   WHERE t.name = coalesce(l.job, s.job)), 9223372036854775807)",
    );
    db.rows(format!(
        "WITH live AS (
             SELECT job, concurrency_key AS key, count(*) AS n FROM jobhost.jobs
             WHERE concurrency_key IS NOT NULL AND state IN ('available', 'running') GROUP BY 1, 2
         )
         SELECT count(*) FILTER (WHERE coalesce(s.holders, 0) <> coalesce(l.n, 0)),
                count(*) FILTER (WHERE coalesce(l.n, 0) > {limit})
         FROM jobhost.semaphores s FULL JOIN live l ON l.job = s.job AND l.key = s.key"
    ))
    .await
    .remove(0)
}

/// Asserts [`slots_match_jobs`] in one snapshot.
pub async fn assert_slots_match_jobs(db: &TestDb) {
    let (mismatched, over) = slots_match_jobs(db).await;
    assert_eq!(mismatched, 0, "every semaphore counts exactly the live jobs holding its slots");
    assert_eq!(over, 0, "no key has more live jobs than its limit");
}

/// Waits until no job is queued, running or blocked, checking the slots
/// against the live jobs at every look.
pub async fn drained(db: &TestDb, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        assert_slots_match_jobs(db).await;
        if db.scalar("SELECT count(*) FROM jobhost.jobs").await == 0
            && db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await == 0
        {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("not drained within {within:?}; left:\n{}", what_is_left(db).await.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The unfinished jobs grouped by what a stuck fleet would differ in
/// (state, type, host, whether the lease ran out, whether the host
/// confirmed it), the blocked jobs and the fleet's hosts: what a failed
/// drain prints.
async fn what_is_left(db: &TestDb) -> Vec<String> {
    let expired =
        db.dialect("lease_expires_at < now()", "lease_expires_at < (julianday('now') - 2440587.5) * 86400000");
    let mut left = db
        .texts(format!(
            "SELECT state || ' ' || job || ' host=' || coalesce(host_id, '-') || ' expired=' || coalesce(CAST({expired} AS text), '-')
                 || ' confirmed=' || coalesce(CAST(confirmed_token = lease_token AS text), '-')
                 || ' attempts=' || min(attempt) || '..' || max(attempt) || ' jobs=' || count(*)
             FROM jobhost.jobs GROUP BY state, job, host_id, {expired}, confirmed_token = lease_token"
        ))
        .await;
    left.extend(
        db.texts("SELECT 'blocked ' || job || ' jobs=' || count(*) FROM jobhost.blocked_jobs GROUP BY job").await,
    );
    left.extend(db.texts("SELECT 'host ' || id FROM jobhost.hosts").await);
    left
}

/// Asserts that the `enqueued` jobs of type `job` (payloads numbered by
/// `i`) are each in the archive exactly once, as completed.
pub async fn completed_once(db: &TestDb, job: &str, enqueued: usize) {
    let i = db.dialect("(payload->>'i')::int", "payload->>'i'");
    assert_eq!(
        db.scalar(format!(
            "SELECT count(DISTINCT {i}) FROM jobhost.archive WHERE job = '{job}' AND state = 'completed'"
        ))
        .await,
        enqueued as i64,
        "every {job} job completed"
    );
    assert_eq!(
        db.scalar(format!("SELECT count(*) FROM jobhost.archive WHERE job = '{job}'")).await,
        enqueued as i64,
        "every {job} job archived exactly once"
    );
}

/// Asserts that no key of `job` ever ran more than its limit of 2 at once.
pub async fn within_limits(db: &TestDb, job: &str) {
    for (key, runs) in runs_by_key(db, job).await {
        assert!(most_at_once(runs) <= 2, "{job} key {key} ran more than its limit of 2 at once");
    }
}

/// Asserts that nothing is left behind: no job, no blocked job, no slot, and
/// nothing for the semaphore repair to fix.
pub async fn nothing_left(db: &TestDb) {
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0, "no job left queued or running");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 0, "no job left blocked");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 0, "no slot held without a live job");
    let fixes = db.store.semaphore_repair().await.expect("semaphore repair runs");
    assert!(fixes.is_empty(), "nothing for the repair to fix: {fixes:?}");
}

/// Every run the hosts logged (each host started with
/// `RUST_LOG=warn,jobhost=debug` and its stderr in one of `logs`), checked
/// against the guarantees a fault tests: no two runs of one job ever
/// overlapped, so a host that lost a lease stopped its guest before the
/// job's next run began (guarantee 6); and no key of `job` ran more than
/// `limit` at once, counting runs whose results were never stored
/// (guarantee 1). Returns how many runs were checked.
pub async fn assert_logged_runs_keep_leases_and_limits(
    db: &TestDb,
    logs: &[std::path::PathBuf],
    job: &str,
    limit: usize,
) -> usize {
    let mut runs: Vec<super::run_log::LoggedRun> = Vec::new();
    for log in logs {
        let mut text = std::fs::read_to_string(log).expect("read a host's log");
        text.truncate(text.rfind('\n').map_or(0, |end| end + 1));
        runs.extend(super::run_log::runs(&text));
    }
    let mut by_job: BTreeMap<i64, Vec<(i64, i64, i64)>> = BTreeMap::new();
    for run in &runs {
        let ended = run.ended_us.unwrap_or_else(|| panic!("run of job {} never ended", run.job_id));
        by_job.entry(run.job_id).or_default().push((run.started_us, ended, run.lease_token));
    }
    for (job_id, mut spans) in by_job {
        spans.sort();
        for pair in spans.windows(2) {
            let ((_, ended, token), (started, _, next_token)) = (pair[0], pair[1]);
            assert!(
                ended < started,
                "job {job_id}: its run with lease token {token} was still running {} µs after the run with \
                 token {next_token} started (guarantee 6)",
                ended - started
            );
        }
    }
    let keys: std::collections::HashMap<i64, String> = db
        .rows::<(i64, String)>(format!(
            "SELECT id, coalesce(concurrency_key, '') FROM jobhost.archive WHERE job = '{job}'"
        ))
        .await
        .into_iter()
        .collect();
    let mut by_key: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for run in runs.iter().filter(|run| run.job == job) {
        let key = keys.get(&run.job_id).unwrap_or_else(|| panic!("job {} is not in the archive", run.job_id));
        by_key.entry(key).or_default().push((run.started_us as u64, run.ended_us.unwrap_or_default() as u64));
    }
    for (key, spans) in by_key {
        let most = most_at_once(spans);
        assert!(most <= limit, "{job} key {key} ran {most} at once by the hosts' logs, over its limit of {limit}");
    }
    runs.len()
}
