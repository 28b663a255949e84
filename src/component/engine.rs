//! The one wasmtime [`Engine`] of a host: pooled instances sized to the
//! host's concurrency, and the epoch ticker that drives timeouts.

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::RuntimeConfig;

/// Instance slots kept beside the run slots, so loading a component (which
/// instantiates it to call `describe`) never waits for a run to finish.
pub const LOAD_SLOTS: u32 = 4;

/// Core instances one component may contain. Rust components have a handful;
/// components from other toolchains have more (componentize-py's about 10,
/// componentize-js's about 15).
const CORE_INSTANCES_PER_COMPONENT: u32 = 50;

/// Linear memories one component may contain.
const MEMORIES_PER_COMPONENT: u32 = 4;

/// Bytes of each memory slot reset with a scan of dirty pages instead of
/// being handed back to the kernel, so the next run takes no page faults
/// there. Covers a typical Rust guest's stack, data and early heap.
const KEEP_RESIDENT_BYTES: usize = 4 << 20;

/// Asks the kernel for no transparent huge pages in this process. A host at
/// `--concurrency 1000` keeps a pooled linear memory and allocator pages per
/// run in flight, each using kilobytes; where the machine's setting is
/// `always`, every one of them took a 2 MiB page, zeroed on its first touch
/// (peak RSS 213-272 MB against 165-198 MB without, in the I/O benchmark of
/// 2026-12-07). A kernel that refuses changes nothing but the memory used.
fn small_pages_only() {
    #[cfg(target_os = "linux")]
    {
        let (disable, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
        // SAFETY: prctl(2) with PR_SET_THP_DISABLE reads no pointers; the
        // unused arguments are zero, as the kernel requires.
        let refused = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, disable, unused, unused, unused) };
        if refused != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "the kernel kept transparent huge pages on");
        }
    }
}

/// Builds the engine for these settings.
///
/// # Errors
/// The settings do not fit this machine (no virtual memory for the pool,
/// or an unsupported option).
pub fn build(config: &RuntimeConfig) -> wasmtime::Result<Engine> {
    small_pages_only();
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
    if let Some(bytes) = config.memory_reservation_bytes {
        wasm.memory_reservation(bytes);
    }
    Engine::new(&wasm)
}

/// What a compile error says when the component cannot fit this host's
/// instance pool, naming jobhost's limit it exceeds (wasmtime's own text
/// names the pooling allocator's): `None` for any other compile error.
/// Every pool slot is sized up front, so the check comes at compile time.
pub fn pool_misfit(error: &wasmtime::Error, config: &RuntimeConfig) -> Option<String> {
    let text = format!("{error:#}");
    // The size check's message also names "core module instances" (as a
    // share of the bytes), so it is told apart first.
    let limit = if text.contains("instance allocation for this") {
        "the pool's instance size".to_string()
    } else if text.contains("transitively contains") && text.contains("core module instances") {
        format!("at most {CORE_INSTANCES_PER_COMPONENT} core instances per component")
    } else if text.contains("linear memories") || text.contains("defined memories count") {
        format!("at most {MEMORIES_PER_COMPONENT} linear memories per component")
    } else if text.contains("tables") && (text.contains("pooling allocator") || text.contains("per-instance limit")) {
        "the pool's tables per component".to_string()
    } else if text.contains("minimum element size") {
        "the pool's table size".to_string()
    } else if text.contains("minimum byte size") {
        format!("a memory of at most {} MiB, the host's largest memory cap", config.max_memory_limit_bytes >> 20)
    } else if text.contains("shared which is not supported") {
        "no shared memories".to_string()
    } else {
        return None;
    };
    Some(format!("needs more than this host's instance pool allows ({limit}): {text}"))
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
