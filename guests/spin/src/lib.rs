//! Never returns: pins the timeout and interruption of a busy guest.

use jobhost_guest::{JobConfig, JobContext, JobError};

struct Spin;

impl jobhost_guest::Guest for Spin {
    fn describe() -> JobConfig {
        JobConfig { timeout_ms: Some(500), max_attempts: Some(1), ..JobConfig::named("spin") }
    }

    fn run(_ctx: JobContext, _payload: String) -> Result<Option<String>, JobError> {
        let mut counter: u64 = 0;
        loop {
            counter = std::hint::black_box(counter.wrapping_add(1));
        }
    }
}

jobhost_guest::export!(Spin);
