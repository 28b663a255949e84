//! A run's byte budget: every byte a guest makes the host hold (children's
//! payloads, log lines, captured stdout and stderr, the output) is taken from
//! one counter, so no combination of host calls can make the host hold more
//! for one run than the budget, whatever each call's own bound allows.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One run's budget; clones share the counter (the captured streams hold one).
#[derive(Debug, Clone)]
pub struct RunBudget {
    limit: usize,
    used: Arc<AtomicUsize>,
}

impl RunBudget {
    /// A budget of `limit` bytes, none used.
    pub fn new(limit: usize) -> Self {
        RunBudget { limit, used: Arc::new(AtomicUsize::new(0)) }
    }

    /// The whole budget.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes not yet taken.
    pub fn left(&self) -> usize {
        self.limit.saturating_sub(self.used.load(Ordering::Relaxed))
    }

    /// Takes `bytes` if they all fit; takes nothing otherwise.
    pub fn try_take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    /// Takes as many of `bytes` as fit and returns how many that was.
    pub fn take_up_to(&self, bytes: usize) -> usize {
        let mut taken = 0;
        let _ = self.used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            taken = bytes.min(self.limit.saturating_sub(used));
            Some(used + taken)
        });
        taken
    }

    /// Why `bytes` more were refused, for the guest or the job's error.
    pub fn refusal(&self, what: &str, bytes: usize) -> String {
        format!(
            "{what} is {bytes} bytes, more than the {} bytes left of the run's budget of {} bytes",
            self.left(),
            self.limit
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_whole_amounts_or_nothing() {
        let budget = RunBudget::new(10);
        assert!(budget.try_take(6));
        assert!(!budget.try_take(5));
        assert_eq!(budget.left(), 4);
        assert!(budget.try_take(4));
        assert_eq!(budget.left(), 0);
    }

    #[test]
    fn clones_share_the_budget_and_partial_takes_stop_at_the_limit() {
        let budget = RunBudget::new(10);
        let stream = budget.clone();
        assert_eq!(stream.take_up_to(7), 7);
        assert_eq!(budget.take_up_to(7), 3);
        assert_eq!(stream.take_up_to(1), 0);
        assert!(!budget.try_take(1));
    }
}
