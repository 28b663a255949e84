//! Background tasks that cannot die unnoticed. A host is several loops
//! (watcher, registration, sweeps, heartbeat, fence, completer, runs); a
//! panic in any one of them would otherwise end only that task and leave the
//! host running with a part of its job silently stopped. A task spawned here
//! that panics is logged with its name, and the host is told to stop, so the
//! process exits non-zero instead.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A task that panicked: which one, and its panic message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {task} task panicked: {message}")]
pub struct TaskPanic {
    /// The name the task was spawned with.
    pub task: &'static str,
    /// The panic's message.
    pub message: String,
}

/// Spawns tasks and, when one panics, cancels the token it was made with.
#[derive(Clone)]
pub struct Supervisor {
    on_panic: CancellationToken,
    first_panic: Arc<Mutex<Option<TaskPanic>>>,
}

impl Supervisor {
    /// A supervisor that cancels `on_panic` when a task it spawned panics.
    pub fn new(on_panic: CancellationToken) -> Self {
        Supervisor { on_panic, first_panic: Arc::default() }
    }

    /// Spawns `future` as the task `task`. The handle behaves as
    /// [`tokio::spawn`]'s, a panic included: the supervisor only watches.
    pub fn spawn<F>(&self, task: &'static str, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let supervisor = self.clone();
        tokio::spawn(async move {
            match (CatchUnwind { future: Box::pin(future) }).await {
                Ok(output) => output,
                Err(payload) => {
                    supervisor.record(task, panic_message(payload.as_ref()));
                    std::panic::resume_unwind(payload)
                }
            }
        })
    }

    /// The first task that panicked, if one did.
    pub fn failure(&self) -> Option<TaskPanic> {
        self.lock().clone()
    }

    fn record(&self, task: &'static str, message: String) {
        tracing::error!(task, %message, "a host task panicked; the host is stopping");
        self.lock().get_or_insert(TaskPanic { task, message });
        self.on_panic.cancel();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<TaskPanic>> {
        // Only `record` writes, and it cannot panic while holding the lock.
        self.first_panic.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The text of a panic's payload (`panic!` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Polls a future, turning a panic inside it into an `Err`.
struct CatchUnwind<F> {
    future: Pin<Box<F>>,
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // A future that panicked is never polled again, so no broken state
        // it left behind can be observed.
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_named_and_stops_the_host() {
        let stop = CancellationToken::new();
        let supervisor = Supervisor::new(stop.clone());
        let calm = supervisor.spawn("calm", async { 7 });
        assert_eq!(calm.await.ok(), Some(7));
        assert!(!stop.is_cancelled());

        let count = 3;
        let panicking = supervisor.spawn("heartbeat", async move {
            tokio::task::yield_now().await;
            panic!("lost the plot after {count} beats");
        });
        let joined = panicking.await;
        assert!(joined.is_err_and(|e| e.is_panic()), "the handle still reports the panic");
        assert!(stop.is_cancelled(), "the host is told to stop");
        assert_eq!(
            supervisor.failure(),
            Some(TaskPanic { task: "heartbeat", message: "lost the plot after 3 beats".into() })
        );

        supervisor.spawn("maintenance", async { panic!("second") }).await.ok();
        assert_eq!(supervisor.failure().map(|p| p.task), Some("heartbeat"), "the first panic is the one reported");
    }

    #[tokio::test]
    async fn an_aborted_task_is_not_a_panic() {
        let stop = CancellationToken::new();
        let supervisor = Supervisor::new(stop.clone());
        let waiting = supervisor.spawn("completer", std::future::pending::<()>());
        waiting.abort();
        assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
        assert!(!stop.is_cancelled());
        assert_eq!(supervisor.failure(), None);
    }
}
