//! A transactional outbox for Amazon DynamoDB that publishes to Kafka.
//!
//! Services put Kafka records into a DynamoDB table inside the same `TransactWriteItems`
//! as their business write ([`DynamoDbOutboxWriter`]); relays lease buckets of that
//! table, publish the records in order and delete them after the broker acknowledged
//! them. Delivery is at-least-once with per-key order. The table layout and the lease
//! protocol are those of `docs/protocol.md`, so relays of other implementations of the
//! same protocol can share one table.
//!
//! # The public surface
//! The rule: what a service embeds is documented here, one module per concept; the
//! protocol's internals are in [`protocol`], public on purpose for tests and tools and
//! outside any compatibility promise; the support code of this workspace's own binaries
//! (the Lambda functions and `outboxctl`) is hidden from these docs and not for other
//! crates.
//!
//! - Writing: [`DynamoDbOutboxWriter`] ([`writer`]), [`OutboxMessage`] ([`message`]),
//!   [`Header`] ([`headers`]), [`OutboxOptions`] ([`options`]), the W3C trace context a
//!   message carries to its consumer ([`trace_context`]).
//! - Relaying: [`Relay`], [`RunReport`], [`StopReason`] ([`relay`]), [`RelayOptions`],
//!   [`DynamoDbOutboxStore`] (the table as a relay uses it), the Kafka publisher and its
//!   configuration ([`publish`]), the measurements ([`metrics`]).
//! - Waking relays: [`notification`]: the in-process [`LocalNotifier`], commit
//!   notifications over EventBridge, the wake-up decision of a host started by one, and
//!   successors.
//! - The table: [`table`] (its definition and `create_if_not_exists`).
//! - Errors: [`Error`], [`Result`] ([`error`]).
//! - Logs: [`logging`], a subscriber whose filter keeps the AWS SDK's signing and
//!   credential internals out of the output at any level.
//! - [`protocol`]: the item layout and keys, the clock, the coordination partition, the
//!   lease plan, and each request of the lease protocol, for tools and tests that drive it
//!   step by step.
//!
//! `scripts/test.sh` builds these docs with `-D warnings` (no broken or private links,
//! every public item documented).
#![deny(missing_docs)]

/// The README's examples, compiled as doctests so they stay true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[doc(hidden)]
pub mod accounting;
#[doc(hidden)]
pub mod client;
#[doc(hidden)]
pub mod dead_letters;
#[doc(hidden)]
pub mod enqueue;
#[doc(hidden)]
pub mod enqueue_request;
pub mod error;
pub mod headers;
#[cfg(feature = "lambda")]
#[doc(hidden)]
pub mod lambda;
pub mod logging;
pub mod message;
pub mod metrics;
pub mod notification;
pub mod options;
#[cfg(feature = "otlp")]
#[doc(hidden)]
pub mod otlp;
pub mod publish;
pub mod relay;
#[doc(hidden)]
pub mod status;
pub mod table;
pub mod trace_context;
pub mod writer;

pub mod protocol;

mod attr;
mod ticks;

pub use error::{Error, Result};
pub use headers::Header;
pub use message::OutboxMessage;
pub use notification::LocalNotifier;
pub use options::{OutboxOptions, RelayOptions};
pub use protocol::store::DynamoDbOutboxStore;
pub use relay::{Relay, RunReport, StopReason};
pub use trace_context::TraceContext;
pub use writer::DynamoDbOutboxWriter;
