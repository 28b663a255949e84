//! Two runs at a time per payload `key`; a job that finds both slots taken
//! is discarded.
//! Sleeps the payload's `ms` and reports when it ran.

jobhost_guest::keyed_sleeper!(LimitedDiscard, "limited_discard", limit: 2, duration_secs: 10, on_conflict: Discard);
