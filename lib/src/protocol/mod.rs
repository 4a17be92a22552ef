//! The protocol's internals: the item layout, the clock, the coordination partition, the
//! lease plan and the store's requests. Public for the tests and tools that check or
//! drive the protocol step by step (the model checker, `outboxctl`, the fault harness);
//! no compatibility promise beyond `docs/protocol.md` itself.

pub mod attr;
pub mod clock;
pub mod coordination;
pub mod plan;
pub mod schema;
pub mod store;
