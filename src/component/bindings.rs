//! Rust bindings of the `jobhost:job` WIT worlds, generated at compile time
//! from `wit/` (the current version) and `wit/archive/` (earlier versions a
//! host still loads), and the conversions between them and [`crate::types`].

/// The current world, `jobhost:job@0.8.0`.
mod current {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "job",
        // Host imports may trap (a guest flooding the log is a host-side limit).
        // The enqueues are async: they may ask the database whether a `raise`
        // limit has room for the child; so are the workflow calls that ask
        // which step the job is.
        imports: {
            "jobhost:job/host.enqueue": async | trappable,
            "jobhost:job/batches.enqueue": async | trappable,
            "jobhost:job/workflows.current-step": async | trappable,
            "jobhost:job/workflows.add-step": async | trappable,
            // A schedule's type is checked against the fleet's, as a child's.
            "jobhost:job/schedules.set": async | trappable,
            default: trappable,
        },
        // Exports are called on the async executor so a guest blocked on a WASI
        // clock or spinning (epoch yields) never holds a thread.
        exports: { default: async },
    });
}

/// The bindings of an archived world from 0.5.0 on (`$path`), whose host
/// imports are those of 0.5.0: the enqueues and the workflow calls that
/// ask the database are async, as in the current world.
macro_rules! archived_world_since_v5 {
    ($path:tt) => {
        wasmtime::component::bindgen!({
            path: $path,
            world: "job",
            imports: {
                "jobhost:job/host.enqueue": async | trappable,
                "jobhost:job/batches.enqueue": async | trappable,
                "jobhost:job/workflows.current-step": async | trappable,
                "jobhost:job/workflows.add-step": async | trappable,
                default: trappable,
            },
            exports: { default: async },
        });
    };
}

/// `jobhost:job@0.7.0`, for components built before 0.8.0 (see `legacy_v7`).
pub mod v0_7 {
    archived_world_since_v5!("wit/archive/0.7.0");
}

/// `jobhost:job@0.6.0`, for components built before 0.7.0 (see `legacy_v6`).
pub mod v0_6 {
    archived_world_since_v5!("wit/archive/0.6.0");
}

/// `jobhost:job@0.5.0`, for components built before 0.6.0 (see `legacy_v5`).
pub mod v0_5 {
    archived_world_since_v5!("wit/archive/0.5.0");
}

/// `jobhost:job@0.4.0`, for components built before 0.5.0 (see `legacy_v4`).
pub mod v0_4 {
    wasmtime::component::bindgen!({
        path: "wit/archive/0.4.0",
        world: "job",
        imports: {
            "jobhost:job/host.enqueue": async | trappable,
            "jobhost:job/batches.enqueue": async | trappable,
            default: trappable,
        },
        exports: { default: async },
    });
}

/// `jobhost:job@0.3.0`, for components built before 0.4.0 (see `legacy_v3`).
pub mod v0_3 {
    wasmtime::component::bindgen!({
        path: "wit/archive/0.3.0",
        world: "job",
        imports: {
            "jobhost:job/host.enqueue": async | trappable,
            "jobhost:job/batches.enqueue": async | trappable,
            default: trappable,
        },
        exports: { default: async },
    });
}

/// `jobhost:job@0.2.0`, for components built before 0.3.0 (see `legacy_v2`).
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "wit/archive/0.2.0",
        world: "job",
        imports: { "jobhost:job/host.enqueue": async | trappable, default: trappable },
        exports: { default: async },
    });
}

/// `jobhost:job@0.1.0`, for components built before 0.2.0 (see `legacy`).
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "wit/archive/0.1.0",
        world: "job",
        imports: { "jobhost:job/host.enqueue": async | trappable, default: trappable },
        exports: { default: async },
    });
}

pub use current::jobhost::job::batches::{BatchOptions, BatchRef};
pub use current::jobhost::job::host::{EnqueueOptions, Level};
pub use current::jobhost::job::schedules::{Overlap as WitOverlap, ScheduleSpec};
pub use current::jobhost::job::types as wit;
pub use current::jobhost::job::workflows::{
    Dependency as WitDependency, EventWait as WitEventWait, IfFailed as WitIfFailed, NewStep, StepOf,
    StepWait as WitStepWait, WorkflowRef,
};
pub use current::{Job, JobPre, jobhost};

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
