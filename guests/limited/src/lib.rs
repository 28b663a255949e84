//! Like `sleep`, limited to two concurrent runs per payload `key`.
//! Sleeps the payload's `ms` and reports when it ran.

jobhost_guest::keyed_sleeper!(Limited, "limited", limit: 2, duration_secs: 10, on_conflict: Block);
