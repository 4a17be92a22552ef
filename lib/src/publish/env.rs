//! The names of the publisher's environment variables:
//! [`KafkaConfig::from_env`](super::KafkaConfig::from_env) reads them, and the errors of
//! the SASL credentials, the TLS files and the connect diagnosis name them.

/// [`KafkaConfig::bootstrap_servers`](super::KafkaConfig::bootstrap_servers), comma separated.
pub const BOOTSTRAP_SERVERS: &str = "KAFKA_BOOTSTRAP_SERVERS";
/// [`KafkaConfig::auth`](super::KafkaConfig::auth): `none`, `msk-iam`, `scram-sha-256`,
/// `scram-sha-512`, `plain` or `mtls`.
pub const AUTH: &str = "KAFKA_AUTH";
/// The SASL username of [`KafkaConfig::sasl`](super::KafkaConfig::sasl) (SCRAM, PLAIN).
pub const SASL_USERNAME: &str = "KAFKA_SASL_USERNAME";
/// The SASL password of [`KafkaConfig::sasl`](super::KafkaConfig::sasl) (SCRAM, PLAIN).
pub const SASL_PASSWORD: &str = "KAFKA_SASL_PASSWORD";
/// A Secrets Manager secret (ARN or name) with the SASL `username` and `password`, as
/// JSON (MSK's SCRAM convention), instead of [`SASL_USERNAME`] and [`SASL_PASSWORD`].
pub const SASL_SECRET_ARN: &str = "KAFKA_SASL_SECRET_ARN";
/// [`KafkaConfig::allow_plain_without_tls`](super::KafkaConfig::allow_plain_without_tls):
/// `true` lets `KAFKA_AUTH=plain` send the password over a plaintext connection.
pub const ALLOW_PLAIN_WITHOUT_TLS: &str = "KAFKA_ALLOW_PLAIN_WITHOUT_TLS";
/// [`KafkaConfig::tls`](super::KafkaConfig::tls), parsed as
/// [`KafkaTls`](super::KafkaTls): `true` or `false` (unset: on with any authentication or
/// any TLS file or secret).
pub const TLS: &str = "KAFKA_TLS";
/// [`TrustedRoots::File`](super::TrustedRoots::File): a PEM bundle of the trusted roots,
/// instead of the system's.
pub const TLS_CA_FILE: &str = "KAFKA_TLS_CA_FILE";
/// The certificate of [`ClientCertificate::Files`](super::ClientCertificate::Files): the
/// client certificate (PEM, leaf first) for mutual TLS.
pub const TLS_CERT_FILE: &str = "KAFKA_TLS_CERT_FILE";
/// The private key of [`ClientCertificate::Files`](super::ClientCertificate::Files): the
/// client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
pub const TLS_KEY_FILE: &str = "KAFKA_TLS_KEY_FILE";
/// [`TrustedRoots::Secret`](super::TrustedRoots::Secret): a Secrets Manager secret (ARN
/// or name) whose string is the PEM bundle of the trusted roots, instead of
/// [`TLS_CA_FILE`].
pub const TLS_CA_SECRET_ARN: &str = "KAFKA_TLS_CA_SECRET_ARN";
/// [`ClientCertificate::Secret`](super::ClientCertificate::Secret): a Secrets Manager
/// secret (ARN or name) with the client certificate for mutual TLS, as JSON
/// `{"certificate": "<PEM chain>", "privateKey": "<PEM key>"}`, instead of
/// [`TLS_CERT_FILE`] and [`TLS_KEY_FILE`].
pub const TLS_CLIENT_SECRET_ARN: &str = "KAFKA_TLS_CLIENT_SECRET_ARN";
/// [`KafkaConfig::client_id`](super::KafkaConfig::client_id).
pub const CLIENT_ID: &str = "KAFKA_CLIENT_ID";
/// [`KafkaConfig::publish_timeout`](super::KafkaConfig::publish_timeout).
pub const PUBLISH_TIMEOUT: &str = "KAFKA_PUBLISH_TIMEOUT";
/// [`KafkaConfig::region`](super::KafkaConfig::region), the standard AWS variable.
pub const REGION: &str = "AWS_REGION";
/// Fallback of [`REGION`], as the AWS SDKs read it.
pub const DEFAULT_REGION: &str = "AWS_DEFAULT_REGION";
/// [`KafkaConfig::message_id_header`](super::KafkaConfig::message_id_header).
pub const MESSAGE_ID_HEADER: &str = "OUTBOX_MESSAGE_ID_HEADER";
/// [`KafkaConfig::compression`](super::KafkaConfig::compression): `none`, `gzip`,
/// `snappy`, `lz4` or `zstd`.
pub const COMPRESSION: &str = "KAFKA_COMPRESSION";
/// [`KafkaConfig::delivery`](super::KafkaConfig::delivery): `at-least-once` or
/// `exactly-once`.
pub const DELIVERY: &str = "OUTBOX_DELIVERY";
/// [`KafkaConfig::watermark_topic`](super::KafkaConfig::watermark_topic).
pub const WATERMARK_TOPIC: &str = "OUTBOX_WATERMARK_TOPIC";
