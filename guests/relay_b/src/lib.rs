//! The `relay` handler under the name `relay_b`: see guests/relay.

include!("../../relay/src/handler.rs");
