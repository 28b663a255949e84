//! The `relay` handler under the name `relay_c`: see guests/relay.

include!("../../relay/src/handler.rs");
