//! Subscribed to the events `order.paid` and `relay.ping` (WIT 0.7.0
//! `on-events`): each event enqueues one job of this type with the event's
//! payload. `relay_b` and `relay_c` are this source built under their own
//! names, so one event fans out to three types. Payload:
//! - `ms`: sleeps this long on the WASI clock first;
//! - `send`: `[{"key", "payload"}]` events sent through the `events`
//!   import, each with `{"from": THIS-TYPE, "order": ...}` added, written
//!   when the run completes;
//! - `fail_attempts`: returns a retry on attempts up to this number, after
//!   sending, so those sends are never written.
//!
//! Its output is `{"type", "order", "attempt"}`.

include!("handler.rs");
