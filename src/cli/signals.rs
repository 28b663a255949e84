//! Stopping a long-running command (`run`, `serve`) by signal: gracefully
//! at the first SIGINT or SIGTERM, at once at the second.

use tokio_util::sync::CancellationToken;

use super::Exit;

/// Cancels `shutdown` at the first SIGINT or SIGTERM, and exits at once at
/// the second.
pub(super) fn stop_on_signals(shutdown: CancellationToken) {
    let trigger = shutdown;
    tokio::spawn(async move {
        let mut signals = match Signals::new() {
            Ok(signals) => signals,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGINT and SIGTERM; stop this host with SIGKILL");
                return;
            }
        };
        signals.next().await;
        tracing::info!("shutdown requested; a second SIGINT or SIGTERM stops at once");
        trigger.cancel();
        signals.next().await;
        // Running jobs are not handed back: their leases expire and other
        // hosts run them again, as after a crash.
        tracing::error!("second signal: exiting at once without waiting for running jobs");
        eprintln!("error: stopped by a second signal before the graceful shutdown ended");
        std::process::exit(i32::from(Exit::Forced as u8));
    });
}

/// SIGINT and SIGTERM, listened for from start to exit: once a handler is
/// installed the signals no longer end the process by themselves.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals { interrupt: signal(SignalKind::interrupt())?, terminate: signal(SignalKind::terminate())? })
    }

    /// The next SIGINT or SIGTERM.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
