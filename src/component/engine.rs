//! The one wasmtime [`Engine`] of a host: pooled instances sized to the
//! host's concurrency, and the epoch ticker that drives timeouts.

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::RuntimeConfig;

/// Instance slots kept beside the run slots, so loading a component (which
/// instantiates it to call `describe`) never waits for a run to finish.
pub const LOAD_SLOTS: u32 = 4;

/// Core instances one component may contain. Rust components have a handful;
/// components from other toolchains (interpreters, adapters) have more.
const CORE_INSTANCES_PER_COMPONENT: u32 = 50;

/// Linear memories one component may contain.
const MEMORIES_PER_COMPONENT: u32 = 4;

/// Bytes of each memory slot reset with a scan of dirty pages instead of
/// being handed back to the kernel, so the next run takes no page faults
/// there. Covers a typical Rust guest's stack, data and early heap.
const KEEP_RESIDENT_BYTES: usize = 4 << 20;

/// Builds the engine for these settings.
///
/// # Errors
/// The settings do not fit this machine (no virtual memory for the pool,
/// or an unsupported option).
pub fn build(config: &RuntimeConfig) -> wasmtime::Result<Engine> {
    let slots = config.max_concurrent_runs + LOAD_SLOTS;
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(slots)
        .total_core_instances(slots * CORE_INSTANCES_PER_COMPONENT)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .total_memories(slots * MEMORIES_PER_COMPONENT)
        .total_tables(slots * CORE_INSTANCES_PER_COMPONENT)
        .total_stacks(slots)
        .max_memory_size(config.max_memory_limit_bytes as usize)
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(64 << 10)
        .pagemap_scan(Enabled::Auto);

    let mut wasm = Config::new();
    wasm.epoch_interruption(true).allocation_strategy(InstanceAllocationStrategy::Pooling(pool)).memory_init_cow(true);
    Engine::new(&wasm)
}

/// Advances the engine's epoch every `tick` on a thread of its own, for as
/// long as the engine lives. Every running guest checks its deadline (and
/// yields its thread) at each tick.
///
/// # Errors
/// The thread could not be spawned.
pub fn start_epoch_ticker(engine: &Engine, tick: std::time::Duration) -> std::io::Result<()> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("jobhost-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(tick);
            }
        })
        .map(drop)
}
