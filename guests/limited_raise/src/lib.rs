//! Two runs at a time per payload `key`; an enqueue that finds both slots
//! taken is refused with an error.
//! Sleeps the payload's `ms` and reports when it ran.

jobhost_guest::keyed_sleeper!(LimitedRaise, "limited_raise", limit: 2, duration_secs: 10, on_conflict: Raise);
