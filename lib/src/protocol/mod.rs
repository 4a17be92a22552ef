//! The protocol's internals: the item layout, the clock, the coordination partition, the
//! lease plan and the store's requests. Public for the tests and tools that check or
//! drive the protocol step by step (the model checker, `outboxctl`, the fault harness);
//! no compatibility promise beyond `docs/protocol.md` itself, but for the two types the
//! stable surface names, under their stable paths: [`DynamoDbOutboxStore`](crate::DynamoDbOutboxStore)
//! (its constructor, `with_clock` and `options`) and [`metrics::WriteKind`](crate::metrics::WriteKind).
//!
//! The bottom layer of the crate: it imports only the ground types (the errors, the
//! attribute names, the time format, headers, the message and the options), never the
//! relay, the writer, the publisher or anything else built on it.

/// Attribute names of the outbox items (the reference specification's, plus this
/// project's extensions) and DynamoDB's item size limit.
pub mod attr {
    pub use crate::attr::*;
}
pub mod clock;
pub mod coordination;
pub mod plan;
pub mod schema;
pub mod store;
#[cfg(feature = "relay")]
pub mod watermark;
