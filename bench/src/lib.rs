//! Benchmarks of the DynamoDB outbox on the local stack (DynamoDB Local and a Kafka
//! broker, started by `scripts/stack.sh`); `scripts/bench.sh` runs them and
//! `BENCHMARKS.md` has the figures. Machines are shared and noisy: the benchmarks report
//! ratios against a baseline measured in the same run, and request counts, which hold
//! across machines; absolute times are context.
//!
//! # Layout
//! - [`classify`]: an SDK interceptor counting attempts by purpose (renewal, probe, fetch,
//!   gap probe, delete, ...), the finer view the cost model needs.
//! - [`support`]: clients, fresh tables and topics, a backlog seeded with
//!   `BatchWriteItem`, a metrics hook (published count, rounds), process statistics.
//! - [`drain`]: drain throughput of one relay and of a fleet, against the raw loop.
//! - [`accounting`]: requests per published message, per enqueue, and of an idle relay
//!   against the specification's formula.
//! - [`latency`]: enqueue to visible in Kafka, with the in-process notifier and polling only.
//! - [`scale`]: acquisition rounds with 8 to 1024 buckets; 1 to 16 relays on 64 buckets.
//! - [`footprint`]: binary sizes, peak RSS and CPU per 10,000 messages of a relay process.
//! - [`enqueue`]: enqueue throughput from concurrent writers.
//! - [`compression`]: produce-request bytes and publisher CPU per `KAFKA_COMPRESSION` codec.
//! - [`delivery`]: exactly once against at least once: throughput, requests per message,
//!   a fresh relay's first messages.

pub mod accounting;
pub mod classify;
pub mod compression;
pub mod delivery;
pub mod drain;
pub mod enqueue;
pub mod footprint;
pub mod latency;
pub mod scale;
pub mod support;
