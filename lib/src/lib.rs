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
//! outside any compatibility promise (but for [`DynamoDbOutboxStore`] and
//! [`metrics::WriteKind`], stable under those paths). Types that will grow are `#[non_exhaustive]`: the options are built
//! with their constructor and `with_*` setters, the reports and errors are read and
//! matched with a wildcard arm.
//!
//! - Writing: [`DynamoDbOutboxWriter`] ([`writer`]), [`OutboxMessage`] ([`message`]),
//!   [`Header`] ([`headers`]), [`OutboxOptions`] ([`options`]), the W3C trace context a
//!   message carries to its consumer ([`trace_context`]).
//! - The enqueue service: [`enqueue`] runs one JSON request of [`enqueue_request`]
//!   (parsed, validated, written with its idempotency marker, announced), as the enqueue
//!   function and `outboxctl enqueue` do; a service of your own can run it too.
//! - Relaying: [`Relay`], [`RunReport`], [`StopReason`] ([`relay`]), [`RelayOptions`],
//!   [`DynamoDbOutboxStore`] (the table as a relay uses it), the Kafka publisher and its
//!   configuration ([`publish`]), the measurements ([`metrics`]).
//! - Waking relays: [`notification`]: the in-process [`LocalNotifier`], commit
//!   notifications over EventBridge, the wake-up decision of a host started by one, and
//!   successors.
//! - Hosting a relay (feature `host`): `host`, what a program around a relay does besides
//!   relaying (settings from the environment, EMF documents, metrics and spans over OTLP);
//!   `outboxctl relay` runs on it.
//! - A relay in a Lambda function (feature `lambda`): `lambda`, the relay function's
//!   handler for a function of your own (`lib/examples/relay_in_your_own_lambda.rs`).
//! - Operating: [`status`] reads the state of an outbox as `outboxctl status` shows it;
//!   [`dead_letters`] lists, redrives and purges what the dead-letter partition holds.
//! - The table: [`table`] (its definition and `create_if_not_exists`); [`client`], a
//!   DynamoDB client with the per-attempt and per-operation timeouts a relay needs;
//!   [`accounting`], an SDK interceptor counting every DynamoDB attempt by operation and
//!   outcome (what the cost model is measured with).
//! - Errors: [`Error`], [`Result`] ([`error`]).
//! - Logs: [`logging`], a subscriber whose filter keeps the AWS SDK's signing and
//!   credential internals out of the output at any level.
//! - [`protocol`]: the item layout and keys, the clock, the coordination partition, the
//!   lease plan, and each request of the lease protocol, for tools and tests that drive it
//!   step by step.
//!
//! # Features
//! - `relay` (default): the relay and its Kafka client ([`publish`], [`relay`], the
//!   wake-up decision). Without it (`default-features = false`) the crate is a writer and
//!   compiles no Kafka client.
//! - `otel`: the writer stamps the current OpenTelemetry span on its messages; the relay's
//!   OpenTelemetry instruments and publish spans.
//! - `eventbridge`: commit notifications over Amazon EventBridge.
//! - `host`: a relay host (implies `relay` and `otel`).
//! - `lambda`: the relay's Lambda handler and the functions' glue (implies `host`).
//!
//! # Layers
//! One way, bottom up: the ground types (errors, headers, the attribute names, the time
//! format, the trace context, the message, the options); [`protocol`] on them; the
//! publisher, the notifications, the metrics and the table over the protocol; the writer
//! and the relay over those; the enqueue service, status and dead letters on top. No
//! module imports one above it.
//!
//! `scripts/test.sh` builds these docs with `-D warnings` (no broken or private links,
//! every public item documented).
#![deny(missing_docs)]

/// The README's examples, compiled as doctests so they stay true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod accounting;
pub mod client;
pub mod dead_letters;
pub mod enqueue;
pub mod enqueue_request;
pub mod error;
pub mod headers;
#[cfg(feature = "host")]
pub mod host;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod logging;
pub mod message;
pub mod metrics;
pub mod notification;
pub mod options;
#[cfg(feature = "relay")]
pub mod publish;
#[cfg(feature = "relay")]
pub mod relay;
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
#[cfg(feature = "relay")]
pub use relay::{Relay, RelayBuilder, RunReport, StopReason};
pub use trace_context::TraceContext;
pub use writer::DynamoDbOutboxWriter;
