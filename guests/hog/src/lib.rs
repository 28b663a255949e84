//! Allocates (and touches) memory without bound: pins the memory cap.

use jobhost_guest::{JobConfig, JobContext, JobError};

struct Hog;

impl jobhost_guest::Guest for Hog {
    fn describe() -> JobConfig {
        JobConfig { memory_limit_bytes: Some(32 << 20), max_attempts: Some(1), ..JobConfig::named("hog") }
    }

    fn run(_ctx: JobContext, _payload: String) -> Result<Option<String>, JobError> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(vec![1u8; 1 << 20]);
            std::hint::black_box(&hoard);
        }
    }
}

jobhost_guest::export!(Hog);
