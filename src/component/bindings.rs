//! Rust bindings of the `jobhost:job` WIT world, generated at compile time
//! from `wit/`, and the conversions between them and [`crate::types`].

wasmtime::component::bindgen!({
    path: "wit",
    world: "job",
    // Host imports may trap (a guest flooding the log is a host-side limit).
    // `enqueue` is async: it may ask the database whether a `raise` limit
    // has room for the child.
    imports: { "jobhost:job/host.enqueue": async | trappable, default: trappable },
    // Exports are called on the async executor so a guest blocked on a WASI
    // clock or spinning (epoch yields) never holds a thread.
    exports: { default: async },
});

pub use self::jobhost::job::host::{EnqueueOptions, Level};
pub use self::jobhost::job::types as wit;

use crate::types::{self, LogLevel};

impl From<&types::JobContext> for wit::JobContext {
    fn from(ctx: &types::JobContext) -> Self {
        wit::JobContext {
            job_id: ctx.job_id,
            attempt: ctx.attempt,
            queue: ctx.queue.clone(),
            enqueued_at_ms: ctx.enqueued_at_ms,
            batch_id: ctx.batch_id,
            concurrency_key: ctx.concurrency_key.clone(),
        }
    }
}

impl From<Level> for LogLevel {
    fn from(level: Level) -> Self {
        match level {
            Level::Trace => LogLevel::Trace,
            Level::Debug => LogLevel::Debug,
            Level::Info => LogLevel::Info,
            Level::Warn => LogLevel::Warn,
            Level::Error => LogLevel::Error,
        }
    }
}
