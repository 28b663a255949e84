//! The `jobhost:job` world versions a component may implement: the current
//! one and every earlier one a host still loads. A component of an earlier
//! version is called through its own bindings, and what it returns is
//! converted up to the current types, taking the defaults of every field
//! added since; its host imports are the current ones under the old names.

use wasmtime::Store;
use wasmtime::component::InstancePre;

use crate::component::bindings::{
    self, BatchOptions, BatchRef, EnqueueOptions, JobPre, Level, NewStep, WitDependency, WitEventWait, WitIfFailed,
    WitStepWait, WorkflowRef, v0_1, v0_2, v0_3, v0_4, v0_5, v0_6, v0_7, wit,
};
use crate::component::sandbox::SandboxState;

/// A linked component of one world version, ready to instantiate.
pub enum WorldPre {
    /// `jobhost:job@0.8.0`.
    Current(JobPre<SandboxState>),
    /// `jobhost:job@0.7.0`.
    V0_7(v0_7::JobPre<SandboxState>),
    /// `jobhost:job@0.6.0`.
    V0_6(v0_6::JobPre<SandboxState>),
    /// `jobhost:job@0.5.0`.
    V0_5(v0_5::JobPre<SandboxState>),
    /// `jobhost:job@0.4.0`.
    V0_4(v0_4::JobPre<SandboxState>),
    /// `jobhost:job@0.3.0`.
    V0_3(v0_3::JobPre<SandboxState>),
    /// `jobhost:job@0.2.0`.
    V0_2(v0_2::JobPre<SandboxState>),
    /// `jobhost:job@0.1.0`.
    V0_1(v0_1::JobPre<SandboxState>),
}

impl WorldPre {
    /// Matches a linked component to the newest world whose exports it has.
    ///
    /// # Errors
    /// It fits none: the current world's reason, which is the one to fix.
    pub fn new(pre: InstancePre<SandboxState>) -> wasmtime::Result<Self> {
        let reason = match JobPre::new(pre.clone()) {
            Ok(current) => return Ok(WorldPre::Current(current)),
            Err(reason) => reason,
        };
        if let Ok(v0_7) = v0_7::JobPre::new(pre.clone()) {
            return Ok(WorldPre::V0_7(v0_7));
        }
        if let Ok(v0_6) = v0_6::JobPre::new(pre.clone()) {
            return Ok(WorldPre::V0_6(v0_6));
        }
        if let Ok(v0_5) = v0_5::JobPre::new(pre.clone()) {
            return Ok(WorldPre::V0_5(v0_5));
        }
        if let Ok(v0_4) = v0_4::JobPre::new(pre.clone()) {
            return Ok(WorldPre::V0_4(v0_4));
        }
        if let Ok(v0_3) = v0_3::JobPre::new(pre.clone()) {
            return Ok(WorldPre::V0_3(v0_3));
        }
        if let Ok(v0_2) = v0_2::JobPre::new(pre.clone()) {
            return Ok(WorldPre::V0_2(v0_2));
        }
        v0_1::JobPre::new(pre).map(WorldPre::V0_1).map_err(|_| reason)
    }

    /// Instantiates the component and calls `describe`.
    pub async fn describe(&self, store: &mut Store<SandboxState>) -> wasmtime::Result<wit::JobConfig> {
        match self {
            WorldPre::Current(pre) => pre.instantiate_async(&mut *store).await?.call_describe(&mut *store).await,
            WorldPre::V0_7(pre) => {
                Ok(pre.instantiate_async(&mut *store).await?.call_describe(&mut *store).await?.into())
            }
            WorldPre::V0_6(pre) => {
                Ok(pre.instantiate_async(&mut *store).await?.call_describe(&mut *store).await?.into())
            }
            WorldPre::V0_5(pre) => {
                Ok(pre.instantiate_async(&mut *store).await?.call_describe(&mut *store).await?.into())
            }
            WorldPre::V0_4(pre) => {
                Ok(pre.instantiate_async(&mut *store).await?.call_describe(&mut *store).await?.into())
            }
            WorldPre::V0_3(pre) => {
                Ok(pre.instantiate_async(&mut *store).await?.call_describe(&mut *store).await?.into())
            }
            WorldPre::V0_2(pre) => {
                Ok(pre.instantiate_async(&mut *store).await?.call_describe(&mut *store).await?.into())
            }
            WorldPre::V0_1(pre) => {
                Ok(pre.instantiate_async(&mut *store).await?.call_describe(&mut *store).await?.into())
            }
        }
    }

    /// Instantiates the component and calls `run`.
    pub async fn run(
        &self,
        store: &mut Store<SandboxState>,
        context: &wit::JobContext,
        payload: &str,
    ) -> wasmtime::Result<Result<Option<String>, wit::JobError>> {
        match self {
            WorldPre::Current(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                store.data_mut().note_instantiated();
                job.call_run(&mut *store, context, payload).await
            }
            WorldPre::V0_7(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                store.data_mut().note_instantiated();
                let returned = job.call_run(&mut *store, &context.clone().into(), payload).await?;
                Ok(returned.map_err(Into::into))
            }
            WorldPre::V0_6(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                store.data_mut().note_instantiated();
                let returned = job.call_run(&mut *store, &context.clone().into(), payload).await?;
                Ok(returned.map_err(Into::into))
            }
            WorldPre::V0_5(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                store.data_mut().note_instantiated();
                let returned = job.call_run(&mut *store, &context.clone().into(), payload).await?;
                Ok(returned.map_err(Into::into))
            }
            WorldPre::V0_4(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                store.data_mut().note_instantiated();
                let returned = job.call_run(&mut *store, &context.clone().into(), payload).await?;
                Ok(returned.map_err(Into::into))
            }
            WorldPre::V0_3(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                store.data_mut().note_instantiated();
                let returned = job.call_run(&mut *store, &context.clone().into(), payload).await?;
                Ok(returned.map_err(Into::into))
            }
            WorldPre::V0_2(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                store.data_mut().note_instantiated();
                let returned = job.call_run(&mut *store, &context.clone().into(), payload).await?;
                Ok(returned.map_err(Into::into))
            }
            WorldPre::V0_1(pre) => {
                let job = pre.instantiate_async(&mut *store).await?;
                store.data_mut().note_instantiated();
                let returned = job.call_run(&mut *store, &context.clone().into(), payload).await?;
                Ok(returned.map_err(Into::into))
            }
        }
    }
}

/// What every earlier world shares with the current one, converted: the
/// job context given to `run`, the error it returns, and the host imports
/// (the current ones under the old names). `$types` and `$host` are that
/// world's generated `types` and `host` modules; `$extra` are the error's
/// arms beyond the first three.
macro_rules! earlier_world {
    ($types:ident, $host:ident $(, $extra:pat => $to:expr)*) => {
        impl From<wit::JobContext> for $types::JobContext {
            fn from(ctx: wit::JobContext) -> Self {
                $types::JobContext {
                    job_id: ctx.job_id,
                    attempt: ctx.attempt,
                    queue: ctx.queue,
                    enqueued_at_ms: ctx.enqueued_at_ms,
                    batch_id: ctx.batch_id,
                    concurrency_key: ctx.concurrency_key,
                }
            }
        }

        impl From<$types::JobError> for wit::JobError {
            fn from(error: $types::JobError) -> Self {
                match error {
                    $types::JobError::Retry(reason) => wit::JobError::Retry(reason),
                    $types::JobError::Fail(reason) => wit::JobError::Fail(reason),
                    $types::JobError::Snooze(seconds) => wit::JobError::Snooze(seconds),
                    $($extra => $to,)*
                }
            }
        }

        impl $types::Host for SandboxState {}

        impl $host::Host for SandboxState {
            fn log(&mut self, level: $host::Level, message: String) -> wasmtime::Result<()> {
                let level = match level {
                    $host::Level::Trace => Level::Trace,
                    $host::Level::Debug => Level::Debug,
                    $host::Level::Info => Level::Info,
                    $host::Level::Warn => Level::Warn,
                    $host::Level::Error => Level::Error,
                };
                bindings::jobhost::job::host::Host::log(self, level, message)
            }

            fn heartbeat(&mut self) -> wasmtime::Result<()> {
                bindings::jobhost::job::host::Host::heartbeat(self)
            }

            fn progress(&mut self, done: u64, total: u64) -> wasmtime::Result<()> {
                bindings::jobhost::job::host::Host::progress(self, done, total)
            }

            async fn enqueue(
                &mut self,
                job: String,
                payload: String,
                options: $host::EnqueueOptions,
            ) -> wasmtime::Result<Result<(), String>> {
                let (queue, priority, delay_ms) = (options.queue, options.priority, options.delay_ms);
                let options = EnqueueOptions { queue, priority, delay_ms };
                bindings::jobhost::job::host::Host::enqueue(self, job, payload, options).await
            }
        }
    };
}

/// A configuration of a world from 0.2.0 on (`$types`), converted field by
/// field; `$outbound` reads the outbound rules from `$old` (none before
/// 0.4.0), `$rate` its rate limit (none before 0.6.0) and `$events` its
/// event keys (none before 0.7.0).
macro_rules! config_since_v2 {
    ($types:ident, $old:ident => $outbound:expr) => {
        config_since_v2!($types, $old => $outbound, None);
    };
    ($types:ident, $old:ident => $outbound:expr, $rate:expr) => {
        config_since_v2!($types, $old => $outbound, $rate, None);
    };
    ($types:ident, $old:ident => $outbound:expr, $rate:expr, $events:expr) => {
        impl From<$types::JobConfig> for wit::JobConfig {
            fn from($old: $types::JobConfig) -> Self {
                wit::JobConfig {
                    name: $old.name,
                    queue: $old.queue,
                    priority: $old.priority,
                    max_attempts: $old.max_attempts,
                    backoff: $old.backoff.map(|b| wit::Backoff { base_ms: b.base_ms, cap_ms: b.cap_ms }),
                    timeout_ms: $old.timeout_ms,
                    memory_limit_bytes: $old.memory_limit_bytes,
                    concurrency: $old.concurrency.map(|c| wit::Concurrency {
                        limit: c.limit,
                        key: c.key,
                        duration_secs: c.duration_secs,
                        on_conflict: match c.on_conflict {
                            $types::OnConflict::Block => wit::OnConflict::Block,
                            $types::OnConflict::Discard => wit::OnConflict::Discard,
                            $types::OnConflict::Raise => wit::OnConflict::Raise,
                        },
                    }),
                    unique: $old.unique.map(|u| wit::Uniqueness {
                        key: u.key,
                        strategy: match u.strategy {
                            $types::UniqueStrategy::UntilExecuted => wit::UniqueStrategy::UntilExecuted,
                            $types::UniqueStrategy::WhileExecuting => wit::UniqueStrategy::WhileExecuting,
                        },
                        on_duplicate: u.on_duplicate.map(|d| match d {
                            $types::OnDuplicate::Skip => wit::OnDuplicate::Skip,
                            $types::OnDuplicate::Replace => wit::OnDuplicate::Replace,
                            $types::OnDuplicate::Raise => wit::OnDuplicate::Raise,
                        }),
                    }),
                    schedule: $old.schedule.map(|s| wit::Schedule {
                        cron: s.cron,
                        time_zone: s.time_zone,
                        payload: s.payload,
                        backfill: s.backfill,
                    }),
                    outbound: $outbound,
                    rate_limit: $rate,
                    on_events: $events,
                }
            }
        }
    };
}

/// The `batches` imports of a world from 0.3.0 on (`$batches`, with its
/// `$host`), served by the current ones.
macro_rules! batches_since_v3 {
    ($batches:ident, $host:ident) => {
        impl $batches::Host for SandboxState {
            fn open(&mut self, options: $batches::BatchOptions) -> wasmtime::Result<Result<u32, String>> {
                let options = BatchOptions {
                    label: options.label,
                    on_finish: options.on_finish,
                    on_success: options.on_success,
                    on_failure: options.on_failure,
                    callback_payload: options.callback_payload,
                };
                bindings::jobhost::job::batches::Host::open(self, options)
            }

            async fn enqueue(
                &mut self,
                batch: $batches::BatchRef,
                job: String,
                payload: String,
                options: $host::EnqueueOptions,
            ) -> wasmtime::Result<Result<(), String>> {
                let batch = match batch {
                    $batches::BatchRef::Current => BatchRef::Current,
                    $batches::BatchRef::Opened(n) => BatchRef::Opened(n),
                };
                let options =
                    EnqueueOptions { queue: options.queue, priority: options.priority, delay_ms: options.delay_ms };
                bindings::jobhost::job::batches::Host::enqueue(self, batch, job, payload, options).await
            }
        }
    };
}

use v0_1::jobhost::job::host as old_host;
use v0_1::jobhost::job::types as old;

impl From<old::JobConfig> for wit::JobConfig {
    fn from(old: old::JobConfig) -> Self {
        wit::JobConfig {
            name: old.name,
            queue: old.queue,
            priority: old.priority,
            max_attempts: old.max_attempts,
            backoff: old.backoff.map(|b| wit::Backoff { base_ms: b.base_ms, cap_ms: b.cap_ms }),
            timeout_ms: old.timeout_ms,
            memory_limit_bytes: old.memory_limit_bytes,
            concurrency: old.concurrency.map(|c| wit::Concurrency {
                limit: c.limit,
                key: c.key,
                duration_secs: c.duration_secs,
                on_conflict: match c.on_conflict {
                    old::OnConflict::Block => wit::OnConflict::Block,
                    old::OnConflict::Discard => wit::OnConflict::Discard,
                    old::OnConflict::Raise => wit::OnConflict::Raise,
                },
            }),
            unique: old.unique.map(|u| wit::Uniqueness {
                key: u.key,
                strategy: match u.strategy {
                    old::UniqueStrategy::UntilExecuted => wit::UniqueStrategy::UntilExecuted,
                    old::UniqueStrategy::WhileExecuting => wit::UniqueStrategy::WhileExecuting,
                },
                on_duplicate: None,
            }),
            schedule: old.schedule.map(|cron| wit::Schedule { cron, time_zone: None, payload: None, backfill: None }),
            outbound: None,
            rate_limit: None,
            on_events: None,
        }
    }
}

earlier_world!(old, old_host);

use v0_2::jobhost::job::host as v2_host;
use v0_2::jobhost::job::types as v2;

config_since_v2!(v2, old => None);
earlier_world!(v2, v2_host);

use v0_3::jobhost::job::batches as v3_batches;
use v0_3::jobhost::job::host as v3_host;
use v0_3::jobhost::job::types as v3;

// 0.4.0 added only `outbound`.
config_since_v2!(v3, old => None);
earlier_world!(v3, v3_host);
batches_since_v3!(v3_batches, v3_host);

use v0_4::jobhost::job::batches as v4_batches;
use v0_4::jobhost::job::host as v4_host;
use v0_4::jobhost::job::types as v4;

// 0.5.0 added only the `workflows` interface: the types are the same.
config_since_v2!(v4, old => old.outbound.map(|rules| {
    rules
        .into_iter()
        .map(|r| wit::OutboundRule { origin: r.origin, methods: r.methods, secrets: r.secrets })
        .collect()
}));
earlier_world!(v4, v4_host);
batches_since_v3!(v4_batches, v4_host);

use v0_5::jobhost::job::batches as v5_batches;
use v0_5::jobhost::job::host as v5_host;
use v0_5::jobhost::job::types as v5;
use v0_5::jobhost::job::workflows as v5_workflows;

// 0.6.0 added `rate-limit` and the `throttled` error.
config_since_v2!(v5, old => old.outbound.map(|rules| {
    rules
        .into_iter()
        .map(|r| wit::OutboundRule { origin: r.origin, methods: r.methods, secrets: r.secrets })
        .collect()
}));
earlier_world!(v5, v5_host);
batches_since_v3!(v5_batches, v5_host);

/// The `workflows` imports of a world from 0.5.0 on (`$workflows`), served
/// by the current ones; `$wait` reads a step's wait from `$step` (none
/// before 0.7.0: its steps wait for nothing but their dependencies).
macro_rules! workflows_since_v5 {
    ($workflows:ident) => {
        workflows_since_v5!($workflows, _step => None);
    };
    ($workflows:ident, $step:ident => $wait:expr) => {
        impl $workflows::Host for SandboxState {
            async fn current_step(&mut self) -> wasmtime::Result<Result<Option<$workflows::StepOf>, String>> {
                let step = bindings::jobhost::job::workflows::Host::current_step(self).await?;
                Ok(step.map(|step| step.map(|s| $workflows::StepOf { workflow_id: s.workflow_id, name: s.name })))
            }

            fn open(&mut self, label: Option<String>) -> wasmtime::Result<Result<u32, String>> {
                bindings::jobhost::job::workflows::Host::open(self, label)
            }

            async fn add_step(
                &mut self,
                workflow: $workflows::WorkflowRef,
                step: $workflows::NewStep,
            ) -> wasmtime::Result<Result<(), String>> {
                let if_failed = |policy: $workflows::IfFailed| match policy {
                    $workflows::IfFailed::Cancel => WitIfFailed::Cancel,
                    $workflows::IfFailed::Run => WitIfFailed::Run,
                    $workflows::IfFailed::Fail => WitIfFailed::Fail,
                };
                let workflow = match workflow {
                    $workflows::WorkflowRef::Current => WorkflowRef::Current,
                    $workflows::WorkflowRef::Opened(n) => WorkflowRef::Opened(n),
                };
                let $step = &step;
                let wait = $wait;
                let options = step.options;
                let step = NewStep {
                    name: step.name,
                    job: step.job,
                    payload: step.payload,
                    options: EnqueueOptions {
                        queue: options.queue,
                        priority: options.priority,
                        delay_ms: options.delay_ms,
                    },
                    after: step
                        .after
                        .into_iter()
                        .map(|d| WitDependency { step: d.step, if_failed: d.if_failed.map(if_failed) })
                        .collect(),
                    if_failed: step.if_failed.map(if_failed),
                    wait,
                };
                bindings::jobhost::job::workflows::Host::add_step(self, workflow, step).await
            }
        }
    };
}

workflows_since_v5!(v5_workflows);

use v0_6::jobhost::job::batches as v6_batches;
use v0_6::jobhost::job::host as v6_host;
use v0_6::jobhost::job::types as v6;
use v0_6::jobhost::job::workflows as v6_workflows;

// 0.7.0 added `on-events`, the `events` interface and a step's `wait`.
config_since_v2!(v6, old => old.outbound.map(|rules| {
    rules
        .into_iter()
        .map(|r| wit::OutboundRule { origin: r.origin, methods: r.methods, secrets: r.secrets })
        .collect()
}), old.rate_limit.map(|r| wit::RateLimit { limit: r.limit, period_ms: r.period_ms, key: r.key }));
earlier_world!(v6, v6_host, v6::JobError::Throttled(ms) => wit::JobError::Throttled(ms));
batches_since_v3!(v6_batches, v6_host);
workflows_since_v5!(v6_workflows);

use v0_7::jobhost::job::batches as v7_batches;
use v0_7::jobhost::job::events as v7_events;
use v0_7::jobhost::job::host as v7_host;
use v0_7::jobhost::job::types as v7;
use v0_7::jobhost::job::workflows as v7_workflows;

// 0.8.0 added only the `schedules` interface: the types are the same.
config_since_v2!(v7, old => old.outbound.map(|rules| {
    rules
        .into_iter()
        .map(|r| wit::OutboundRule { origin: r.origin, methods: r.methods, secrets: r.secrets })
        .collect()
}), old.rate_limit.map(|r| wit::RateLimit { limit: r.limit, period_ms: r.period_ms, key: r.key }), old.on_events);
earlier_world!(v7, v7_host, v7::JobError::Throttled(ms) => wit::JobError::Throttled(ms));
batches_since_v3!(v7_batches, v7_host);
workflows_since_v5!(v7_workflows, step => step.wait.clone().map(wait_of_v7));

/// A 0.7.0 step's wait, as the current one.
fn wait_of_v7(wait: v7_workflows::StepWait) -> WitStepWait {
    let if_failed = |policy: v7_workflows::IfFailed| match policy {
        v7_workflows::IfFailed::Cancel => WitIfFailed::Cancel,
        v7_workflows::IfFailed::Run => WitIfFailed::Run,
        v7_workflows::IfFailed::Fail => WitIfFailed::Fail,
    };
    match wait {
        v7_workflows::StepWait::SleepMs(ms) => WitStepWait::SleepMs(ms),
        v7_workflows::StepWait::UntilMs(ms) => WitStepWait::UntilMs(ms),
        v7_workflows::StepWait::Event(event) => WitStepWait::Event(WitEventWait {
            key: event.key,
            match_fields: event.match_fields,
            timeout_ms: event.timeout_ms,
            on_timeout: event.on_timeout.map(if_failed),
            lookback_ms: event.lookback_ms,
        }),
    }
}

impl v7_events::Host for SandboxState {
    fn send(&mut self, key: String, payload: String) -> wasmtime::Result<Result<(), String>> {
        bindings::jobhost::job::events::Host::send(self, key, payload)
    }
}
