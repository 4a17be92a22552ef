//! A transactional outbox for Amazon DynamoDB that publishes to Kafka.
//!
//! Services put Kafka records into a DynamoDB table inside the same `TransactWriteItems`
//! as their business write ([`writer::DynamoDbOutboxWriter`]); relays lease buckets of
//! that table, publish the records in order and delete them after the broker
//! acknowledged them. Delivery is at-least-once with per-key order. The table layout and
//! the lease protocol follow the reference specification, so relays of other
//! implementations of it can share one table.
//!
//! # Layout
//! - [`options`]: [`OutboxOptions`] and [`RelayOptions`], their defaults, validation and
//!   the one place they are read from the environment.
//! - [`message`]: [`OutboxMessage`], its bucket, and Kafka's murmur2.
//! - [`headers`]: the header blob, format version 1.
//! - [`attr`]: attribute names of the items.
//! - [`schema`]: key formats, message items both ways, item sizes.
//! - [`clock`]: UTC ticks and the clock that leases are compared with.
//! - [`table`]: the table definition and `create_if_not_exists`.
//! - [`writer`]: sequence reservations, transaction items, `enqueue`, commit notification.
//! - [`enqueue_api`]: the enqueue request and response as JSON, shared by the enqueue
//!   function and `outboxctl enqueue`.
//! - [`enqueue`]: the enqueue service both of them run: parse, check, one transaction
//!   (with the idempotency marker), commit notification.
//! - [`coordination`]: the snapshot of the coordination partition (leases, heartbeats),
//!   who is active, coverage of notified buckets, handovers, stale records; pure.
//! - [`plan`]: the lease plan, a pure function of one read of the coordination partition.
//! - [`publish`]: the [`publish::Publisher`] seam and the Kafka publisher (rskafka,
//!   Java-compatible partitioner, Amazon MSK IAM tokens).
//! - [`store`]: every request a relay makes: leases, fetch with gap probes, deletes, backlog.
//! - [`relay`]: the relay, one room per phase: the run loop, the shutdown, the pure run
//!   state, the lease round, the batch pipeline (byte-bounded, every step inside the
//!   lease), the idle stop, the graceful stop.
//! - [`notification`]: commit notifications: the [`notification::CommitNotifier`] seam,
//!   the in-process [`LocalNotifier`], the EventBridge event and its sender (feature
//!   `eventbridge`), and Lambda payloads (schedule tick, notification, stream doorbell;
//!   feature `lambda`).
//! - [`metrics`]: the relay's measurements, behind a trait for exporters, and
//!   [`metrics::emf`], the CloudWatch Embedded Metric Format exporter, and (feature
//!   `otel`) `metrics::otel`, the reference implementation's OpenTelemetry instruments.
//! - [`status`]: the state of an outbox as the table says it is (`outboxctl status`).
//! - [`accounting`]: an SDK interceptor counting DynamoDB attempts by operation and outcome.
//! - [`client`]: a DynamoDB client with attempt and operation timeouts.
//! - [`error`]: the crate's error type, and the `errorType` of each error
//!   ([`Error::error_type`]).
//! - `lambda` (feature `lambda`): the functions' Lambda glue: the error a handler returns
//!   and the time an invocation has left.
//! - [`logging`]: the binaries' log subscriber, whose filter keeps the AWS SDK's signing
//!   and credential internals out of the output at any level.
//!
//! # Public surface
//! What a service embeds is re-exported at the root ([`DynamoDbOutboxWriter`],
//! [`OutboxMessage`], [`Relay`], [`DynamoDbOutboxStore`], [`OutboxOptions`],
//! [`RelayOptions`], [`Error`]) and in [`publish`] ([`publish::KafkaPublisher`],
//! [`publish::KafkaConfig`]), [`notification`] and [`metrics`]. The files inside
//! [`publish`] and [`store`] are private; the types their functions take and return are
//! re-exported by those modules. Three layers below that stay public on purpose, as
//! rskafka keeps its partition client public: [`store`] (each request of the lease
//! protocol, for tools and tests that drive it step by step), [`coordination`] and
//! [`plan`] (the pure snapshot and lease plan that the model checker and operator tools
//! read), and [`schema`]/[`attr`] (the item layout, which relays of other implementations
//! share). `scripts/test.sh` builds these docs with `-D warnings` (no broken or private
//! links, every public item documented).
#![deny(missing_docs)]

/// The README's examples, compiled as doctests so they stay true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod accounting;
pub mod attr;
pub mod client;
pub mod clock;
pub mod coordination;
pub mod enqueue;
pub mod enqueue_api;
pub mod error;
pub mod headers;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod logging;
pub mod message;
pub mod metrics;
pub mod notification;
pub mod options;
pub mod plan;
pub mod publish;
pub mod relay;
pub mod schema;
pub mod status;
pub mod store;
pub mod table;
pub mod writer;

pub use error::{Error, Result};
pub use headers::Header;
pub use message::OutboxMessage;
pub use notification::LocalNotifier;
pub use options::{OutboxOptions, RelayOptions};
pub use relay::{Relay, RunReport, StopReason};
pub use store::DynamoDbOutboxStore;
pub use writer::DynamoDbOutboxWriter;
