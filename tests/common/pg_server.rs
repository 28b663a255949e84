//! A private PostgreSQL server a test starts, stops and restarts itself: a
//! fresh cluster in a temporary directory, listening on 127.0.0.1 on a free
//! port, with trust authentication. Its binaries are the newest under
//! `/usr/lib/postgresql/*/bin`. PostgreSQL refuses to run as root, so as
//! root it runs as the `postgres` user, which then owns the directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where the distribution installs each PostgreSQL version's binaries.
const INSTALLED: &str = "/usr/lib/postgresql";

/// A running private server; dropping it stops it.
pub struct PgServer {
    bin: PathBuf,
    port: u16,
    /// Runs the server's commands as this user (`None`: as ourselves).
    run_as: Option<String>,
    dir: tempfile::TempDir,
}

impl PgServer {
    /// Creates a cluster and starts it. Panics, saying what is missing, when
    /// the machine cannot run one.
    pub fn start() -> PgServer {
        let bin = binaries();
        // SAFETY: geteuid(2) has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::tempdir().expect("temp dir");
        let run_as = root.then(|| {
            let user = "postgres";
            let (uid, gid) = user_ids(user).unwrap_or_else(|| {
                panic!("running as root, the test needs a `{user}` user to run PostgreSQL as; there is none")
            });
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("give the cluster directory to postgres");
            user.to_string()
        });
        let port = free_port();
        let server = PgServer { bin, port, run_as, dir };
        server.run("initdb", &["-D", &server.data(), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"]);
        // fsync matters only when the machine itself crashes, which these
        // tests never make happen, and it costs a great deal on a busy fleet.
        let settings = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\nfsync = off\n",
            server.dir.path().display()
        );
        let conf = Path::new(&server.data()).join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("read postgresql.conf");
        text.push_str(&settings);
        std::fs::write(&conf, text).expect("write postgresql.conf");
        server.pg_ctl(&["start"]);
        server
    }

    /// The server's URL without a database name, as [`super::db::TestDb::postgres_on`] takes it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// Stops the server with a fast shutdown: every session is terminated
    /// and open transactions roll back.
    pub fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "stop"]);
    }

    /// Starts the stopped server again, on the same port.
    pub fn start_again(&self) {
        self.pg_ctl(&["start"]);
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn pg_ctl(&self, args: &[&str]) -> Output {
        let (data, log) = (self.data(), self.dir.path().join("server.log").display().to_string());
        let mut all = vec!["-D", &data, "-l", &log, "-w", "-t", "60"];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all)
    }

    /// Runs one of the server's programs as the server's user; panics with
    /// its output and the server's log when it fails.
    fn run(&self, program: &str, args: &[&str]) -> Output {
        let mut command = self.command(program);
        let output = command.args(args).output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
        if !output.status.success() {
            let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
            panic!(
                "{program} {args:?} failed ({}):\n{}{}\nserver log:\n{log}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            );
        }
        output
    }

    /// One of the server's programs, to run as the server's user.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(path);
                command
            }
            None => Command::new(path),
        };
        // The server's user may not be allowed into the test's directory.
        command.current_dir(self.dir.path()).env("LC_ALL", "C");
        command
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Also after a failed test: an immediate stop, whatever state it is in.
        let _ = self.command("pg_ctl").args(["-D", &self.data(), "-w", "-m", "immediate", "stop"]).output();
    }
}

/// The newest installed version's binary directory with `initdb` and `pg_ctl`.
fn binaries() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(INSTALLED)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!("this test starts its own PostgreSQL server and needs initdb and pg_ctl under {INSTALLED}/VERSION/bin; none found")
    })
}

/// A user's uid and gid.
fn user_ids(user: &str) -> Option<(u32, u32)> {
    let name = std::ffi::CString::new(user).ok()?;
    // SAFETY: getpwnam(3) with a valid C string; the record is copied out
    // before any other call could overwrite it.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return None;
    }
    // SAFETY: non-null, so it points at a valid passwd record.
    let entry = unsafe { &*entry };
    Some((entry.pw_uid, entry.pw_gid))
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}
