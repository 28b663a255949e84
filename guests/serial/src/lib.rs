//! One run at a time per payload `key`, with a one-second lease: the
//! shape of a serial queue, and short enough to test heartbeats past it.
//! Sleeps the payload's `ms` and reports when it ran.

jobhost_guest::keyed_sleeper!(Serial, "serial", limit: 1, duration_secs: 1, on_conflict: Block);
