//! The wait before a retry: exponential in the attempt, capped, jittered so
//! a burst of failures does not come back as a burst.

use crate::types::Backoff;

/// The delay after failed attempt `attempt` (1-based), in milliseconds:
/// `base * 2^(attempt-1)` capped at `cap`, then drawn uniformly from its
/// upper half.
pub fn retry_delay_ms(backoff: &Backoff, attempt: u32) -> u64 {
    let exponent = attempt.saturating_sub(1).min(63);
    let full = backoff.base_ms.saturating_mul(1u64 << exponent).min(backoff.cap_ms);
    let half = full / 2;
    half + fastrand::u64(0..=full - half)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_within_jitter_and_cap() {
        let backoff = Backoff { base_ms: 100, cap_ms: 1_000 };
        for _ in 0..200 {
            assert!((50..=100).contains(&retry_delay_ms(&backoff, 1)));
            assert!((200..=400).contains(&retry_delay_ms(&backoff, 3)));
            assert!((500..=1_000).contains(&retry_delay_ms(&backoff, 10)));
            assert!((500..=1_000).contains(&retry_delay_ms(&backoff, 400)));
        }
    }

    #[test]
    fn zero_base_means_no_wait() {
        assert_eq!(retry_delay_ms(&Backoff { base_ms: 0, cap_ms: 0 }, 5), 0);
    }
}
