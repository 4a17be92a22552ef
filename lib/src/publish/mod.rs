//! Publishing a bucket's batch to Kafka: the [`Publisher`] seam and its Kafka implementation.
//!
//! # Layout
//! The files are private; what a user needs is re-exported here.
//! - `config`: [`KafkaConfig`], [`KafkaAuth`] and [`KafkaCompression`] (each parsed from its
//!   variable with [`FromStr`](std::str::FromStr)), their defaults, and `from_env`.
//! - [`env`](mod@env): the names of the publisher's environment variables, which `config`
//!   reads and the SASL, TLS and connect errors name.
//! - `route`: which partition each record goes to ([`partition_for`] a key, as Java's
//!   partitioner picks it),
//!   how a batch splits into produce requests, and which prefix of the batch a partial
//!   failure still acknowledges. Pure.
//! - `record`: an outbox message as an rskafka record, headers byte for byte.
//! - `kafka`: [`KafkaPublisher`], rskafka clients, metadata cache, retries.
//! - `span`: the publish span of each produce request (feature `otel`): OpenTelemetry's
//!   messaging conventions, a link to each message's trace context.
//! - `classify`: what a failed request means (retry, reject the records, give up).
//! - `diagnose`: why a connect failed, in words the user can act on (TLS, SASL).
//! - `msk_iam`: [`MskIamTokenProvider`], the Amazon MSK IAM token (a SigV4-presigned URL)
//!   and its cache.
//! - `sasl`: [`SaslCredentials`] for SCRAM and PLAIN, from the environment or Secrets Manager.
//! - `tls`: [`KafkaTls`], whether TLS is on, the trusted roots ([`TrustedRoots`]: the
//!   system's, `KAFKA_TLS_CA_FILE` or `KAFKA_TLS_CA_SECRET_ARN`) and the client certificate
//!   of mutual TLS ([`ClientCertificate`]: files or `KAFKA_TLS_CLIENT_SECRET_ARN`),
//!   [`TlsSecret`].
//! - `secret`: reading a secret string from AWS Secrets Manager (SASL and TLS secrets).
//!
//! # Contract
//! A batch is one bucket's messages in sequence order. The publisher writes them with
//! `acks=all`, keeps their order inside every partition, and reports how many *leading*
//! messages are durably written ([`PublishOutcome::acknowledged`]); message `n + 1` is never
//! reported while message `n` is not. Messages after that prefix may have been written too
//! (a later retry then duplicates them: delivery is at least once).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::message::StoredMessage;
use crate::protocol::watermark::OutboxIdentity;

mod classify;
pub(crate) mod config;
mod diagnose;
pub mod env;
pub(crate) mod exactly_once;
pub(crate) mod kafka;
mod lazy;
pub(crate) mod msk_iam;
pub(crate) mod record;
pub(crate) mod route;
pub(crate) mod sasl;
mod secret;
mod span;
mod tls;

pub use config::{Delivery, KafkaAuth, KafkaCompression, KafkaConfig, DEFAULT_MESSAGE_ID_HEADER};
pub use exactly_once::TransactionCounts;
pub use kafka::KafkaPublisher;
pub use lazy::{LazyKafkaPublisher, CONNECT_TIMEOUT, RECONNECT_PAUSE};
pub use msk_iam::MskIamTokenProvider;
pub use route::partition_for;
/// The largest SCRAM iteration count the client accepts from a broker (Apache Kafka's own
/// maximum, 16384): a server-first message naming more is refused before any hashing.
pub use rskafka::SCRAM_MAX_ITERATIONS;
pub use sasl::{Password, SaslCredentials, SecretsManagerSecret, UsernamePassword};
pub use tls::{ClientCertificate, KafkaTls, TlsSecret, TrustedRoots};

/// What happened to a batch: the first `acknowledged` messages are durably in Kafka
/// (acks=all); the rest were not (or not known to be) written.
#[derive(Debug)]
#[non_exhaustive]
pub struct PublishOutcome {
    /// How many leading messages of the batch the brokers acknowledged.
    pub acknowledged: usize,
    /// Why the message at index `acknowledged` was not acknowledged; `None` when the whole
    /// batch was. An [`Error::KafkaRejected`] concerns that message only (set it aside and go
    /// on); any other error concerns the connection or the cluster (retry later).
    pub error: Option<Error>,
}

impl PublishOutcome {
    /// The first `acknowledged` messages acknowledged; `error` says why the next one was
    /// not (`None` when the batch had no more).
    pub fn new(acknowledged: usize, error: Option<Error>) -> Self {
        PublishOutcome {
            acknowledged,
            error,
        }
    }

    /// Every one of `len` messages acknowledged.
    pub fn complete(len: usize) -> Self {
        PublishOutcome {
            acknowledged: len,
            error: None,
        }
    }

    /// Nothing acknowledged, because of `error`.
    pub fn failed(error: Error) -> Self {
        PublishOutcome {
            acknowledged: 0,
            error: Some(error),
        }
    }
}

/// Publishes batches of outbox messages; the relay loop is written against this.
pub trait Publisher: Send + Sync + 'static {
    /// Publishes one bucket's batch, in order.
    fn publish<'a>(
        &'a self,
        batch: &'a [StoredMessage],
    ) -> impl Future<Output = PublishOutcome> + Send + 'a;

    /// Publishes one bucket's batch, in order, sending nothing after `until` (the lease's
    /// validity): what was acknowledged by then is the outcome's prefix. The default
    /// ignores `until` (the relay also cuts the whole call at it, counting nothing as
    /// acknowledged); the Kafka publisher bounds each produce request by it.
    fn publish_until<'a>(
        &'a self,
        batch: &'a [StoredMessage],
        until: tokio::time::Instant,
    ) -> impl Future<Output = PublishOutcome> + Send + 'a {
        let _ = until;
        self.publish(batch)
    }

    /// How this publisher delivers; [`Delivery::AtLeastOnce`] unless it publishes in
    /// transactions. A relay over an exactly-once publisher binds it to its outbox
    /// ([`Self::bind_outbox`]) before its first batch and caps its batches to what a
    /// watermark holds; each batch it hands over is a strongly consistent read of
    /// everything its bucket holds after the last message the relay removed.
    fn delivery(&self) -> Delivery {
        Delivery::AtLeastOnce
    }

    /// Exactly once: the outbox (table and key prefix) the batches come from, which names
    /// each bucket's transactional id and watermark, and the lease duration (the
    /// transactions' timeout). The relay calls it before its first batch; the default
    /// ignores it.
    fn bind_outbox(&self, identity: &OutboxIdentity, lease_duration: Duration) {
        let _ = (identity, lease_duration);
    }
}

impl<P: Publisher> Publisher for Arc<P> {
    fn publish<'a>(
        &'a self,
        batch: &'a [StoredMessage],
    ) -> impl Future<Output = PublishOutcome> + Send + 'a {
        (**self).publish(batch)
    }

    fn publish_until<'a>(
        &'a self,
        batch: &'a [StoredMessage],
        until: tokio::time::Instant,
    ) -> impl Future<Output = PublishOutcome> + Send + 'a {
        (**self).publish_until(batch, until)
    }

    fn delivery(&self) -> Delivery {
        (**self).delivery()
    }

    fn bind_outbox(&self, identity: &OutboxIdentity, lease_duration: Duration) {
        (**self).bind_outbox(identity, lease_duration)
    }
}
