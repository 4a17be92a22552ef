//! Options of the Kafka publisher: documented defaults, validation, and the one place they
//! are read from the environment.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use aws_credential_types::provider::SharedCredentialsProvider;

use super::env;
use super::sasl::SaslCredentials;
use super::tls::{ClientCertificate, KafkaTls, TlsSecret, TrustedRoots};
use crate::error::{Error, Result};
use crate::options::parse_duration;
use crate::protocol::watermark::DEFAULT_WATERMARK_TOPIC;

/// The header that carries the message id on every record unless
/// [`env::MESSAGE_ID_HEADER`] names another ([`KafkaConfig::message_id_header`]).
pub const DEFAULT_MESSAGE_ID_HEADER: &str = "x-outbox-message-id";

/// How the publisher compresses each produce request's record batch.
///
/// `KAFKA_COMPRESSION` parses into it ([`FromStr`]): `none`, `gzip`, `snappy`, `lz4` or
/// `zstd`, in any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KafkaCompression {
    /// Uncompressed (the default; `BENCHMARKS.md`, "Compression", says why).
    #[default]
    None,
    /// gzip (`flate2`, pure Rust).
    Gzip,
    /// Snappy (`snap`, pure Rust).
    Snappy,
    /// LZ4 (the C library, through `lz4-sys`).
    Lz4,
    /// Zstandard (the C library, through `zstd-sys`).
    Zstd,
}

/// Parses the value of [`env::COMPRESSION`]; an unknown codec is [`Error::InvalidOption`]
/// naming the variable and the allowed values.
impl FromStr for KafkaCompression {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "none" | "" => Ok(KafkaCompression::None),
            "gzip" => Ok(KafkaCompression::Gzip),
            "snappy" => Ok(KafkaCompression::Snappy),
            "lz4" => Ok(KafkaCompression::Lz4),
            "zstd" => Ok(KafkaCompression::Zstd),
            _ => Err(Error::option(
                env::COMPRESSION,
                format!("{value:?} is not one of none, gzip, snappy, lz4, zstd"),
            )),
        }
    }
}

/// How a relay delivers: at least once (the default), or exactly once for `read_committed`
/// consumers, with one Kafka transaction per batch fenced by the bucket's lease
/// (`docs/protocol.md`, section 8).
///
/// `OUTBOX_DELIVERY` parses into it ([`FromStr`]): `at-least-once` or `exactly-once`, in any
/// case; [`Display`](fmt::Display) writes that form back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Delivery {
    /// Every message is published at least once; a failure between the broker's
    /// acknowledgement and the delete publishes it again.
    #[default]
    AtLeastOnce,
    /// Every message appears once in the committed log of its topic.
    ExactlyOnce,
}

impl FromStr for Delivery {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "at-least-once" | "" => Ok(Delivery::AtLeastOnce),
            "exactly-once" => Ok(Delivery::ExactlyOnce),
            _ => Err(Error::option(
                env::DELIVERY,
                format!("{value:?} is neither at-least-once nor exactly-once"),
            )),
        }
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Delivery::AtLeastOnce => "at-least-once",
            Delivery::ExactlyOnce => "exactly-once",
        })
    }
}

/// How the publisher authenticates to the brokers.
///
/// `KAFKA_AUTH` parses into it ([`FromStr`]), and [`Display`](fmt::Display) writes the
/// value that selects it.
///
/// # Examples
/// ```
/// use dynamo_outbox::publish::KafkaAuth;
///
/// let auth: KafkaAuth = "SCRAM-SHA-512".parse()?;
/// assert_eq!(auth, KafkaAuth::ScramSha512);
/// assert_eq!(auth.to_string(), "scram-sha-512");
/// assert!(auth.uses_password());
/// let err = "scram".parse::<KafkaAuth>().unwrap_err();
/// assert!(err.to_string().starts_with("KAFKA_AUTH: \"scram\" is not one of none, msk-iam"));
/// # Ok::<(), dynamo_outbox::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KafkaAuth {
    /// No authentication (a local broker, or a plaintext/TLS listener without SASL).
    #[default]
    None,
    /// Amazon MSK IAM: SASL/OAUTHBEARER with a SigV4-presigned token, credentials from the
    /// standard AWS chain. MSK accepts it only over TLS (port 9098, or 9198 public).
    MskIam,
    /// SASL/SCRAM-SHA-256 (RFC 7677) with [`KafkaConfig::sasl`]; TLS on by default.
    ScramSha256,
    /// SASL/SCRAM-SHA-512 with [`KafkaConfig::sasl`] (MSK's SCRAM, port 9096); TLS on by
    /// default.
    ScramSha512,
    /// SASL/PLAIN (RFC 4616) with [`KafkaConfig::sasl`]: the password itself goes to the
    /// broker, so it is refused without TLS unless
    /// [`KafkaConfig::allow_plain_without_tls`].
    Plain,
    /// Mutual TLS: the client certificate of [`KafkaConfig::tls`] authenticates
    /// ([`KafkaTls::with_client_certificate`]), no SASL; TLS always on (MSK's mTLS
    /// listener, port 9094).
    Mtls,
}

/// Parses the value of [`env::AUTH`] (any case; `_` for `-`, `iam` for `msk-iam`); anything
/// else is [`Error::InvalidOption`] naming the variable and the allowed values.
impl FromStr for KafkaAuth {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "none" | "" => Ok(KafkaAuth::None),
            "msk-iam" | "msk_iam" | "iam" => Ok(KafkaAuth::MskIam),
            "scram-sha-256" | "scram_sha_256" => Ok(KafkaAuth::ScramSha256),
            "scram-sha-512" | "scram_sha_512" => Ok(KafkaAuth::ScramSha512),
            "plain" => Ok(KafkaAuth::Plain),
            "mtls" => Ok(KafkaAuth::Mtls),
            _ => Err(Error::option(
                env::AUTH,
                format!(
                    "{value:?} is not one of none, msk-iam, scram-sha-256, scram-sha-512, \
                     plain, mtls"
                ),
            )),
        }
    }
}

impl fmt::Display for KafkaAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl KafkaAuth {
    /// Whether this mechanism takes a username and password ([`KafkaConfig::sasl`]).
    pub fn uses_password(self) -> bool {
        matches!(
            self,
            KafkaAuth::ScramSha256 | KafkaAuth::ScramSha512 | KafkaAuth::Plain
        )
    }

    /// The value of [`env::AUTH`] that selects it.
    pub fn name(self) -> &'static str {
        match self {
            KafkaAuth::None => "none",
            KafkaAuth::MskIam => "msk-iam",
            KafkaAuth::ScramSha256 => "scram-sha-256",
            KafkaAuth::ScramSha512 => "scram-sha-512",
            KafkaAuth::Plain => "plain",
            KafkaAuth::Mtls => "mtls",
        }
    }
}

/// Options of [`KafkaPublisher`](super::KafkaPublisher).
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use dynamo_outbox::publish::{KafkaCompression, KafkaConfig, KafkaTls, TrustedRoots};
///
/// let config = KafkaConfig::new(["b-1.example:9098", "b-2.example:9098"])
///     .with_msk_iam("eu-west-1")
///     .with_tls(KafkaTls::system().with_roots(TrustedRoots::File("/etc/kafka/ca.pem".into())))
///     .with_compression(KafkaCompression::Zstd)
///     .with_publish_timeout(Duration::from_secs(10));
/// config.validate()?;
/// # Ok::<(), dynamo_outbox::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct KafkaConfig {
    /// `host:port` of one or more brokers to learn the cluster from (required).
    pub bootstrap_servers: Vec<String>,
    /// How to authenticate ([`KafkaAuth::None`]).
    pub auth: KafkaAuth,
    /// Whether to speak TLS to the brokers, the roots to trust and the client certificate
    /// of mutual TLS ([`KafkaTls::Off`]; from the environment: on for MSK IAM, SCRAM, PLAIN
    /// and mTLS, and with any TLS file or secret, unless `KAFKA_TLS=false`; always on for
    /// mTLS).
    pub tls: KafkaTls,
    /// The username and password of SCRAM and PLAIN ([`KafkaAuth::uses_password`]).
    pub sasl: Option<SaslCredentials>,
    /// Lets [`KafkaAuth::Plain`] run without TLS (false): PLAIN sends the password itself.
    pub allow_plain_without_tls: bool,
    /// AWS region of the MSK cluster; required for [`KafkaAuth::MskIam`] because the token
    /// is signed for `kafka.{region}.amazonaws.com`.
    pub region: Option<String>,
    /// Client id the brokers log and meter requests under (`dynamo-outbox`).
    pub client_id: String,
    /// Header stamped on every record with the message id (`x-outbox-message-id`), so
    /// consumers can drop the duplicates that at-least-once delivery produces.
    pub message_id_header: String,
    /// Longest one [`publish`](super::Publisher::publish) call may take (20 s); what is not
    /// acknowledged by then is reported as not written.
    pub publish_timeout: Duration,
    /// Total backoff rskafka may sleep while retrying one request (5 s); its default
    /// retries forever.
    pub retry_budget: Duration,
    /// Attempts per produce request, counting the first (3); between attempts the partition
    /// client is rebuilt and the topic's metadata refreshed.
    pub produce_attempts: u32,
    /// Largest estimated size of one produce request's records (1,000,000 bytes), below the
    /// brokers' default `message.max.bytes` (1 MiB); larger groups are split.
    pub max_request_bytes: usize,
    /// Produce requests (partitions) of one batch in flight at once (8).
    pub max_in_flight: usize,
    /// How long a topic's partition count is trusted before it is read again (5 min), so
    /// added partitions are noticed as the Java client's `metadata.max.age.ms` does.
    pub metadata_max_age: Duration,
    /// Credentials for MSK IAM; `None` loads the standard AWS chain at connect time.
    pub credentials: Option<SharedCredentialsProvider>,
    /// Compression of the produce requests ([`KafkaCompression::None`]).
    pub compression: KafkaCompression,
    /// At least once ([`Delivery::AtLeastOnce`]) or exactly once.
    pub delivery: Delivery,
    /// The topic exactly-once watermarks are committed against
    /// (`dynamo-outbox-watermarks`): it must exist, with one partition; nothing is ever
    /// produced to it.
    pub watermark_topic: String,
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("auth", &self.auth)
            // paths, and the secrets' names: never what was read from them (the private key)
            .field("tls", &self.tls)
            // the username and where the password comes from, never the password
            .field("sasl", &self.sasl)
            .field("allow_plain_without_tls", &self.allow_plain_without_tls)
            .field("region", &self.region)
            .field("client_id", &self.client_id)
            .field("message_id_header", &self.message_id_header)
            .field("publish_timeout", &self.publish_timeout)
            .field("retry_budget", &self.retry_budget)
            .field("produce_attempts", &self.produce_attempts)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("max_in_flight", &self.max_in_flight)
            .field("metadata_max_age", &self.metadata_max_age)
            // never the credentials themselves
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<provided>"),
            )
            .field("compression", &self.compression)
            .field("delivery", &self.delivery)
            .field("watermark_topic", &self.watermark_topic)
            .finish()
    }
}

impl KafkaConfig {
    /// Options with the documented defaults for `bootstrap_servers`, without authentication.
    pub fn new(bootstrap_servers: impl IntoIterator<Item = impl Into<String>>) -> Self {
        KafkaConfig {
            bootstrap_servers: bootstrap_servers.into_iter().map(Into::into).collect(),
            auth: KafkaAuth::None,
            tls: KafkaTls::Off,
            sasl: None,
            allow_plain_without_tls: false,
            region: None,
            client_id: "dynamo-outbox".into(),
            message_id_header: DEFAULT_MESSAGE_ID_HEADER.into(),
            publish_timeout: Duration::from_secs(20),
            retry_budget: Duration::from_secs(5),
            produce_attempts: 3,
            max_request_bytes: 1_000_000,
            max_in_flight: 8,
            metadata_max_age: Duration::from_secs(300),
            credentials: None,
            compression: KafkaCompression::None,
            delivery: Delivery::AtLeastOnce,
            watermark_topic: DEFAULT_WATERMARK_TOPIC.into(),
        }
    }

    /// Switches to MSK IAM in `region`, over TLS (the system's roots unless
    /// [`tls`](Self::tls) is on already).
    pub fn with_msk_iam(mut self, region: impl Into<String>) -> Self {
        self.auth = KafkaAuth::MskIam;
        self.region = Some(region.into());
        self.tls_on();
        self
    }

    /// Switches to SASL `auth` (SCRAM or PLAIN) with `credentials`, over TLS (the system's
    /// roots unless [`tls`](Self::tls) is on already).
    pub fn with_sasl(mut self, auth: KafkaAuth, credentials: SaslCredentials) -> Self {
        self.auth = auth;
        self.sasl = Some(credentials);
        self.tls_on();
        self
    }

    /// Switches to mutual TLS: `certificate` authenticates, over TLS with the roots of
    /// [`tls`](Self::tls) if it is on, else the system's.
    pub fn with_mtls(mut self, certificate: ClientCertificate) -> Self {
        self.auth = KafkaAuth::Mtls;
        self.tls = std::mem::take(&mut self.tls).with_client_certificate(certificate);
        self
    }

    /// Sets [`tls`](Self::tls): off, or on with its roots and client certificate.
    pub fn with_tls(mut self, tls: KafkaTls) -> Self {
        self.tls = tls;
        self
    }

    /// Lets [`KafkaAuth::Plain`] send its password without TLS.
    pub fn with_allow_plain_without_tls(mut self, allow: bool) -> Self {
        self.allow_plain_without_tls = allow;
        self
    }

    fn tls_on(&mut self) {
        if !self.tls.is_on() {
            self.tls = KafkaTls::system();
        }
    }

    /// Uses `credentials` for MSK IAM instead of the standard chain.
    pub fn with_credentials(mut self, credentials: SharedCredentialsProvider) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Sets the message-id header name ([`Self::message_id_header`]).
    pub fn with_message_id_header(mut self, name: impl Into<String>) -> Self {
        self.message_id_header = name.into();
        self
    }

    /// Sets the client id the brokers log requests under ([`Self::client_id`]).
    pub fn with_client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = client_id.into();
        self
    }

    /// Sets the longest one publish may take ([`Self::publish_timeout`]).
    pub fn with_publish_timeout(mut self, publish_timeout: Duration) -> Self {
        self.publish_timeout = publish_timeout;
        self
    }

    /// Sets the backoff budget of one request's retries ([`Self::retry_budget`]).
    pub fn with_retry_budget(mut self, retry_budget: Duration) -> Self {
        self.retry_budget = retry_budget;
        self
    }

    /// Sets the attempts per produce request ([`Self::produce_attempts`]).
    pub fn with_produce_attempts(mut self, produce_attempts: u32) -> Self {
        self.produce_attempts = produce_attempts;
        self
    }

    /// Sets the largest estimated size of one produce request ([`Self::max_request_bytes`]).
    pub fn with_max_request_bytes(mut self, max_request_bytes: usize) -> Self {
        self.max_request_bytes = max_request_bytes;
        self
    }

    /// Sets the produce requests of one batch in flight at once ([`Self::max_in_flight`]).
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight;
        self
    }

    /// Sets how long a topic's partition count is trusted ([`Self::metadata_max_age`]).
    pub fn with_metadata_max_age(mut self, metadata_max_age: Duration) -> Self {
        self.metadata_max_age = metadata_max_age;
        self
    }

    /// Sets the compression of the produce requests ([`Self::compression`]).
    pub fn with_compression(mut self, compression: KafkaCompression) -> Self {
        self.compression = compression;
        self
    }

    /// Reads the options from the process environment (see [`env`](mod@env)) and validates them.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the variable (or the field) and the rule it broke:
    /// [`env::BOOTSTRAP_SERVERS`] unset or not `host:port`, an unknown [`env::AUTH`] or
    /// [`env::COMPRESSION`], credentials or TLS files that are missing, partial or named
    /// twice, a rule of [`validate`](Self::validate).
    ///
    /// # Examples
    /// ```no_run
    /// let config = dynamo_outbox::publish::KafkaConfig::from_env()?;
    /// # Ok::<(), dynamo_outbox::Error>(())
    /// ```
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the options through `lookup` (an environment stand-in) and validates them.
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    ///
    /// # Examples
    /// ```
    /// use dynamo_outbox::publish::{env, KafkaAuth, KafkaConfig};
    ///
    /// let config = KafkaConfig::from_lookup(|name| match name {
    ///     env::BOOTSTRAP_SERVERS => Some("b-1.example:9096".into()),
    ///     env::AUTH => Some("scram-sha-512".into()),
    ///     env::SASL_SECRET_ARN => Some("AmazonMSK_outbox".into()),
    ///     _ => None,
    /// })?;
    /// assert_eq!(config.auth, KafkaAuth::ScramSha512);
    /// assert!(config.tls.is_on(), "SASL turns TLS on");
    /// # Ok::<(), dynamo_outbox::Error>(())
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut config = KafkaConfig::new(servers_from_lookup(&lookup)?);
        if let Some(v) = lookup(env::AUTH) {
            config.auth = v.parse()?;
        }
        config.tls = tls_from_lookup(&lookup, config.auth)?;
        config.sasl = sasl_from_lookup(&lookup, config.auth)?;
        if let Some(v) = lookup(env::ALLOW_PLAIN_WITHOUT_TLS).filter(|v| !v.trim().is_empty()) {
            config.allow_plain_without_tls = parse_bool(&v).ok_or_else(|| {
                Error::option(
                    env::ALLOW_PLAIN_WITHOUT_TLS,
                    format!("{v:?} is not true or false"),
                )
            })?;
        }
        if config.auth == KafkaAuth::Plain && !config.tls.is_on() && !config.allow_plain_without_tls
        {
            return Err(Error::option(
                env::TLS,
                format!(
                    "KAFKA_AUTH=plain sends the password in clear: KAFKA_TLS=false is refused \
                     unless {}=true",
                    env::ALLOW_PLAIN_WITHOUT_TLS
                ),
            ));
        }
        if config.auth == KafkaAuth::MskIam {
            config.region = Some(region_from_lookup(&lookup)?);
        }
        if let Some(v) = lookup(env::CLIENT_ID) {
            config.client_id = v;
        }
        if let Some(v) = lookup(env::MESSAGE_ID_HEADER) {
            config.message_id_header = v;
        }
        if let Some(v) = lookup(env::PUBLISH_TIMEOUT) {
            config.publish_timeout = parse_duration(env::PUBLISH_TIMEOUT, &v)?;
        }
        if let Some(v) = lookup(env::COMPRESSION) {
            config.compression = v.parse()?;
        }
        if let Some(v) = lookup(env::DELIVERY) {
            config.delivery = v.parse()?;
        }
        if let Some(v) = lookup(env::WATERMARK_TOPIC).filter(|v| !v.trim().is_empty()) {
            config.watermark_topic = v.trim().to_string();
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks every rule.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the field and the rule it broke.
    pub fn validate(&self) -> Result<()> {
        if self.bootstrap_servers.is_empty() {
            return Err(Error::option(
                "bootstrap_servers",
                "must name at least one host:port",
            ));
        }
        for s in &self.bootstrap_servers {
            check_host_port(s).map_err(|rule| Error::option("bootstrap_servers", rule))?;
        }
        if self.auth == KafkaAuth::MskIam {
            let region = self
                .region
                .as_deref()
                .ok_or_else(|| Error::option("region", "is required for MSK IAM authentication"))?;
            check_region(region).map_err(|rule| Error::option("region", rule))?;
        }
        match (&self.sasl, self.auth.uses_password()) {
            (None, true) => {
                return Err(Error::option(
                    "sasl",
                    format!(
                        "is required for {} (a username and password)",
                        self.auth.name()
                    ),
                ))
            }
            (Some(_), false) => {
                return Err(Error::option(
                    "sasl",
                    format!(
                        "is set but auth is {}: only scram-sha-256, scram-sha-512 and plain use it",
                        self.auth.name()
                    ),
                ))
            }
            (Some(super::sasl::SaslCredentials::Static(up)), true) if up.username.is_empty() => {
                return Err(Error::option("sasl", "the username must not be empty"))
            }
            _ => {}
        }
        if self.auth == KafkaAuth::Mtls {
            if !self.tls.is_on() {
                return Err(Error::option("tls", "must be on for mtls (mutual TLS)"));
            }
            if self.tls.client_certificate().is_none() {
                return Err(Error::option(
                    "tls",
                    "needs a client certificate for mtls (KafkaTls::with_client_certificate)",
                ));
            }
        }
        if self.auth == KafkaAuth::Plain && !self.tls.is_on() && !self.allow_plain_without_tls {
            return Err(Error::option(
                "tls",
                "PLAIN sends the password in clear: it needs TLS unless allow_plain_without_tls",
            ));
        }
        if self.client_id.is_empty() {
            return Err(Error::option("client_id", "must not be empty"));
        }
        if self.message_id_header.is_empty() {
            return Err(Error::option("message_id_header", "must not be empty"));
        }
        if self.publish_timeout.is_zero() {
            return Err(Error::option(
                "publish_timeout",
                "must be greater than zero",
            ));
        }
        if self.produce_attempts < 1 {
            return Err(Error::option("produce_attempts", "must be at least 1"));
        }
        if self.max_request_bytes < 1024 {
            return Err(Error::option("max_request_bytes", "must be at least 1024"));
        }
        if self.max_in_flight < 1 {
            return Err(Error::option("max_in_flight", "must be at least 1"));
        }
        crate::message::validate_topic(&self.watermark_topic)
            .map_err(|rule| Error::option(env::WATERMARK_TOPIC, rule))?;
        Ok(())
    }
}

/// The brokers [`env::BOOTSTRAP_SERVERS`] names: at least one, each `host:port`.
fn servers_from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<Vec<String>> {
    let servers = lookup(env::BOOTSTRAP_SERVERS).ok_or_else(|| {
        Error::option(
            env::BOOTSTRAP_SERVERS,
            "is required (comma-separated host:port of the brokers)",
        )
    })?;
    let servers: Vec<String> = servers
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if servers.is_empty() {
        return Err(Error::option(
            env::BOOTSTRAP_SERVERS,
            "must name at least one host:port",
        ));
    }
    for s in &servers {
        check_host_port(s).map_err(|rule| Error::option(env::BOOTSTRAP_SERVERS, rule))?;
    }
    Ok(servers)
}

/// The TLS settings the variables name, for `auth`: the CA (a file or a secret), the client
/// certificate (files or a secret), and whether TLS is on (`KAFKA_TLS` parsed as
/// [`KafkaTls`]; by default on with any authentication or any TLS file or secret; always
/// with mTLS); an error when both ways name one thing, when files or secrets are set with
/// TLS off, for a certificate without its key (or the reverse), and for mTLS without a
/// client certificate.
fn tls_from_lookup(lookup: &impl Fn(&str) -> Option<String>, auth: KafkaAuth) -> Result<KafkaTls> {
    // an empty value counts as unset (a template passes "" for an unused parameter)
    let get = |name: &str| {
        lookup(name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| v.trim().to_owned())
    };
    let ca_file = get(env::TLS_CA_FILE).map(PathBuf::from);
    let cert_file = get(env::TLS_CERT_FILE).map(PathBuf::from);
    let key_file = get(env::TLS_KEY_FILE).map(PathBuf::from);
    let ca_secret = get(env::TLS_CA_SECRET_ARN).map(TlsSecret::new);
    let client_secret = get(env::TLS_CLIENT_SECRET_ARN).map(TlsSecret::new);
    if ca_file.is_some() && ca_secret.is_some() {
        return Err(Error::option(
            env::TLS_CA_SECRET_ARN,
            format!(
                "is set together with {}: name the CA one way",
                env::TLS_CA_FILE
            ),
        ));
    }
    if client_secret.is_some() && (cert_file.is_some() || key_file.is_some()) {
        return Err(Error::option(
            env::TLS_CLIENT_SECRET_ARN,
            format!(
                "is set together with {}/{}: name the client certificate one way",
                env::TLS_CERT_FILE,
                env::TLS_KEY_FILE
            ),
        ));
    }
    let tls_source = [
        (env::TLS_CA_FILE, ca_file.is_some()),
        (env::TLS_CERT_FILE, cert_file.is_some()),
        (env::TLS_KEY_FILE, key_file.is_some()),
        (env::TLS_CA_SECRET_ARN, ca_secret.is_some()),
        (env::TLS_CLIENT_SECRET_ARN, client_secret.is_some()),
    ]
    .into_iter()
    .find_map(|(name, set)| set.then_some(name));
    let on = match lookup(env::TLS) {
        Some(v) => v.parse::<KafkaTls>()?.is_on(),
        None => auth != KafkaAuth::None || tls_source.is_some(),
    };
    if auth == KafkaAuth::Mtls && !on {
        return Err(Error::option(
            env::TLS,
            "KAFKA_AUTH=mtls is TLS with a client certificate: KAFKA_TLS=false is refused",
        ));
    }
    if let (false, Some(name)) = (on, tls_source) {
        return Err(Error::option(
            name,
            "is set but KAFKA_TLS=false: TLS files and secrets need TLS",
        ));
    }
    if !on {
        return Ok(KafkaTls::Off);
    }
    let client_certificate = match (cert_file, key_file, client_secret) {
        (Some(certificate), Some(private_key), _) => Some(ClientCertificate::Files {
            certificate,
            private_key,
        }),
        (Some(_), None, _) => {
            return Err(Error::option(
                env::TLS_KEY_FILE,
                format!("is required with {}", env::TLS_CERT_FILE),
            ))
        }
        (None, Some(_), _) => {
            return Err(Error::option(
                env::TLS_CERT_FILE,
                format!("is required with {}", env::TLS_KEY_FILE),
            ))
        }
        (None, None, secret) => secret.map(ClientCertificate::Secret),
    };
    if auth == KafkaAuth::Mtls && client_certificate.is_none() {
        return Err(Error::option(
            env::AUTH,
            format!(
                "mtls needs a client certificate: {} (a Secrets Manager secret with \
                 \"certificate\" and \"privateKey\"), or {} and {}",
                env::TLS_CLIENT_SECRET_ARN,
                env::TLS_CERT_FILE,
                env::TLS_KEY_FILE
            ),
        ));
    }
    let roots = match (ca_file, ca_secret) {
        (Some(path), _) => TrustedRoots::File(path),
        (None, Some(secret)) => TrustedRoots::Secret(secret),
        (None, None) => TrustedRoots::System,
    };
    Ok(KafkaTls::On {
        roots,
        client_certificate,
    })
}

/// The region of an MSK IAM cluster: [`env::REGION`], or [`env::DEFAULT_REGION`] as the
/// AWS SDKs read it.
fn region_from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<String> {
    let region = lookup(env::REGION)
        .or_else(|| lookup(env::DEFAULT_REGION))
        .filter(|r| !r.trim().is_empty())
        .ok_or_else(|| {
            Error::option(
                env::REGION,
                "is required when KAFKA_AUTH=msk-iam (the token is signed for the cluster's region)",
            )
        })?;
    check_region(region.trim()).map_err(|rule| Error::option(env::REGION, rule))?;
    Ok(region.trim().to_owned())
}

/// The SASL credentials the variables name for `auth`: the secret, or the username and
/// password; an error when they are missing, partial, both, or set for another `auth`.
fn sasl_from_lookup(
    lookup: &impl Fn(&str) -> Option<String>,
    auth: KafkaAuth,
) -> Result<Option<SaslCredentials>> {
    // an empty value counts as unset (a template passes "" for an unused parameter)
    let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
    let username = get(env::SASL_USERNAME);
    let password = get(env::SASL_PASSWORD);
    let secret = get(env::SASL_SECRET_ARN);
    if !auth.uses_password() {
        let set = [
            (env::SASL_USERNAME, &username),
            (env::SASL_PASSWORD, &password),
            (env::SASL_SECRET_ARN, &secret),
        ];
        return match set.iter().find(|(_, v)| v.is_some()) {
            Some((name, _)) => Err(Error::option(
                *name,
                format!(
                    "is set but KAFKA_AUTH={}: only scram-sha-256, scram-sha-512 and plain use it",
                    auth.name()
                ),
            )),
            None => Ok(None),
        };
    }
    match (secret, username, password) {
        (Some(secret), None, None) => Ok(Some(SaslCredentials::secrets_manager(secret.trim()))),
        (Some(_), _, _) => Err(Error::option(
            env::SASL_SECRET_ARN,
            format!(
                "is set together with {}/{}: name the credentials one way",
                env::SASL_USERNAME,
                env::SASL_PASSWORD
            ),
        )),
        (None, Some(username), Some(password)) => {
            Ok(Some(SaslCredentials::new(username, password)))
        }
        (None, None, Some(_)) => Err(Error::option(
            env::SASL_USERNAME,
            format!("is required with {}", env::SASL_PASSWORD),
        )),
        (None, Some(_), None) => Err(Error::option(
            env::SASL_PASSWORD,
            format!("is required with {}", env::SASL_USERNAME),
        )),
        (None, None, None) => Err(Error::option(
            env::AUTH,
            format!(
                "{} needs credentials: {} (a Secrets Manager secret with \"username\" and \"password\"), or {} and {}",
                auth.name(),
                env::SASL_SECRET_ARN,
                env::SASL_USERNAME,
                env::SASL_PASSWORD
            ),
        )),
    }
}

/// A boolean variable's value; `None` for anything but true or false (or `1`/`0`,
/// `yes`/`no`).
fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Some(true),
        "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

fn check_host_port(server: &str) -> std::result::Result<(), String> {
    let (host, port) = server
        .rsplit_once(':')
        .ok_or_else(|| format!("{server:?} is not host:port"))?;
    if host.is_empty() {
        return Err(format!("{server:?} has no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("{server:?} has no valid port (1 to 65535)")),
    }
}

/// A region is a DNS label: it becomes part of the signed host `kafka.{region}.amazonaws.com`.
fn check_region(region: &str) -> std::result::Result<(), String> {
    if !region.is_empty()
        && region.len() <= 63
        && region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        Ok(())
    } else {
        Err(format!(
            "{region:?} is not a region name (lowercase letters, digits and '-')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn defaults() {
        let c = KafkaConfig::from_lookup(lookup(&[(env::BOOTSTRAP_SERVERS, "a:9092, b:9093,")]))
            .unwrap();
        assert_eq!(c.bootstrap_servers, ["a:9092", "b:9093"]);
        assert_eq!(c.auth, KafkaAuth::None);
        assert!(!c.tls.is_on());
        assert_eq!(c.region, None);
        assert_eq!(c.message_id_header, "x-outbox-message-id");
        assert_eq!(c.publish_timeout, Duration::from_secs(20));
    }

    #[test]
    fn msk_iam_turns_tls_on_and_needs_a_region() {
        let c = KafkaConfig::from_lookup(lookup(&[
            (
                env::BOOTSTRAP_SERVERS,
                "b-1.x.kafka.eu-west-1.amazonaws.com:9098",
            ),
            (env::AUTH, "msk-iam"),
            (env::REGION, "eu-west-1"),
        ]))
        .unwrap();
        assert_eq!((c.auth, c.tls.is_on()), (KafkaAuth::MskIam, true));
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));

        let c = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:9098"),
            (env::AUTH, "MSK-IAM"),
            (env::DEFAULT_REGION, "us-east-2"),
            (env::TLS, "false"),
        ]))
        .unwrap();
        assert_eq!(
            (c.tls.is_on(), c.region.as_deref()),
            (false, Some("us-east-2"))
        );

        let e = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:9098"),
            (env::AUTH, "msk-iam"),
        ]))
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("AWS_REGION: is required when KAFKA_AUTH=msk-iam"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_variable_and_rule() {
        let e = KafkaConfig::from_lookup(lookup(&[])).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("KAFKA_BOOTSTRAP_SERVERS: is required"),
            "{e}"
        );
        let e =
            KafkaConfig::from_lookup(lookup(&[(env::BOOTSTRAP_SERVERS, "localhost")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "KAFKA_BOOTSTRAP_SERVERS: \"localhost\" is not host:port"
        );
        let e = KafkaConfig::from_lookup(lookup(&[(env::BOOTSTRAP_SERVERS, " , ")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "KAFKA_BOOTSTRAP_SERVERS: must name at least one host:port"
        );
        let e = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:1"),
            (env::AUTH, "scram"),
        ]))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "KAFKA_AUTH: \"scram\" is not one of none, msk-iam, scram-sha-256, scram-sha-512, plain, \
             mtls"
        );
        let e = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:1"),
            (env::TLS, "maybe"),
        ]))
        .unwrap_err();
        assert_eq!(e.to_string(), "KAFKA_TLS: \"maybe\" is not true or false");
        let e = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:1"),
            (env::AUTH, "msk-iam"),
            (env::REGION, "evil.example.com/"),
        ]))
        .unwrap_err();
        assert!(e.to_string().starts_with("AWS_REGION: "), "{e}");
    }

    #[test]
    fn scram_and_plain_take_credentials_from_the_environment_or_a_secret() {
        let c = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "b-1:9096"),
            (env::AUTH, "SCRAM-SHA-512"),
            (
                env::SASL_SECRET_ARN,
                "arn:aws:secretsmanager:eu-west-1:1:secret:AmazonMSK_a",
            ),
        ]))
        .unwrap();
        assert_eq!((c.auth, c.tls.is_on()), (KafkaAuth::ScramSha512, true));
        assert!(
            matches!(&c.sasl, Some(SaslCredentials::SecretsManager(_))),
            "{c:?}"
        );
        for (value, auth) in [
            ("scram-sha-256", KafkaAuth::ScramSha256),
            ("scram-sha-512", KafkaAuth::ScramSha512),
            ("plain", KafkaAuth::Plain),
        ] {
            let c = KafkaConfig::from_lookup(lookup(&[
                (env::BOOTSTRAP_SERVERS, "h:9093"),
                (env::AUTH, value),
                (env::SASL_USERNAME, "alice"),
                (env::SASL_PASSWORD, "pw"),
                // a template's unused parameter
                (env::SASL_SECRET_ARN, ""),
            ]))
            .unwrap();
            assert_eq!((c.auth, c.tls.is_on()), (auth, true), "{value}");
            match &c.sasl {
                Some(SaslCredentials::Static(up)) => {
                    assert_eq!(
                        (up.username.as_str(), up.password.expose()),
                        ("alice", "pw")
                    )
                }
                other => panic!("{other:?}"),
            }
        }
        // SCRAM never sends the password: TLS may be turned off
        let c = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:9092"),
            (env::AUTH, "scram-sha-256"),
            (env::SASL_USERNAME, "alice"),
            (env::SASL_PASSWORD, "pw"),
            (env::TLS, "false"),
        ]))
        .unwrap();
        assert!(!c.tls.is_on());
    }

    #[test]
    fn plain_without_tls_is_refused_unless_allowed() {
        let base = [
            (env::BOOTSTRAP_SERVERS, "h:9092"),
            (env::AUTH, "plain"),
            (env::SASL_USERNAME, "alice"),
            (env::SASL_PASSWORD, "pw"),
            (env::TLS, "false"),
        ];
        let e = KafkaConfig::from_lookup(lookup(&base)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "KAFKA_TLS: KAFKA_AUTH=plain sends the password in clear: KAFKA_TLS=false is \
             refused unless KAFKA_ALLOW_PLAIN_WITHOUT_TLS=true"
        );
        let mut allowed = base.to_vec();
        allowed.push((env::ALLOW_PLAIN_WITHOUT_TLS, "true"));
        let c = KafkaConfig::from_lookup(lookup(&allowed)).unwrap();
        assert!(!c.tls.is_on() && c.allow_plain_without_tls);
        // the same rule for a configuration built in code
        let mut c = KafkaConfig::new(["h:1"])
            .with_sasl(KafkaAuth::Plain, SaslCredentials::new("a", "p"))
            .with_tls(KafkaTls::Off);
        assert!(c.validate().unwrap_err().to_string().starts_with("tls: "));
        c.allow_plain_without_tls = true;
        c.validate().unwrap();
    }

    #[test]
    fn sasl_variables_must_be_complete_and_match_the_mechanism() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[(env::AUTH, "scram-sha-512")],
                "KAFKA_AUTH: scram-sha-512 needs credentials: KAFKA_SASL_SECRET_ARN (a Secrets \
                 Manager secret with \"username\" and \"password\"), or KAFKA_SASL_USERNAME and \
                 KAFKA_SASL_PASSWORD",
            ),
            (
                &[(env::AUTH, "plain"), (env::SASL_USERNAME, "a")],
                "KAFKA_SASL_PASSWORD: is required with KAFKA_SASL_USERNAME",
            ),
            (
                &[(env::AUTH, "plain"), (env::SASL_PASSWORD, "p")],
                "KAFKA_SASL_USERNAME: is required with KAFKA_SASL_PASSWORD",
            ),
            (
                &[
                    (env::AUTH, "scram-sha-256"),
                    (env::SASL_SECRET_ARN, "arn:x"),
                    (env::SASL_PASSWORD, "p"),
                ],
                "KAFKA_SASL_SECRET_ARN: is set together with \
                 KAFKA_SASL_USERNAME/KAFKA_SASL_PASSWORD: name the credentials one way",
            ),
            (
                &[(env::SASL_SECRET_ARN, "arn:x")],
                "KAFKA_SASL_SECRET_ARN: is set but KAFKA_AUTH=none: only scram-sha-256, \
                 scram-sha-512 and plain use it",
            ),
            (
                &[
                    (env::AUTH, "msk-iam"),
                    (env::REGION, "eu-west-1"),
                    (env::SASL_USERNAME, "a"),
                ],
                "KAFKA_SASL_USERNAME: is set but KAFKA_AUTH=msk-iam: only scram-sha-256, \
                 scram-sha-512 and plain use it",
            ),
            (
                &[
                    (env::AUTH, "plain"),
                    (env::SASL_USERNAME, "a"),
                    (env::SASL_PASSWORD, "p"),
                    (env::ALLOW_PLAIN_WITHOUT_TLS, "sure"),
                ],
                "KAFKA_ALLOW_PLAIN_WITHOUT_TLS: \"sure\" is not true or false",
            ),
        ];
        for (pairs, expected) in cases {
            let mut all = vec![(env::BOOTSTRAP_SERVERS, "h:1")];
            all.extend_from_slice(pairs);
            let e = KafkaConfig::from_lookup(lookup(&all)).unwrap_err();
            assert_eq!(e.to_string(), *expected);
        }
        let mut c = KafkaConfig::new(["h:1"]);
        c.auth = KafkaAuth::ScramSha256;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "sasl: is required for scram-sha-256 (a username and password)"
        );
    }

    #[test]
    fn debug_never_shows_the_sasl_password() {
        let c = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:9096"),
            (env::AUTH, "scram-sha-512"),
            (env::SASL_USERNAME, "alice"),
            (env::SASL_PASSWORD, "hunter2-e5f1c0d3-secret"),
        ]))
        .unwrap();
        let s = format!("{c:?} {:#?}", c);
        assert!(!s.contains("hunter2"), "{s}");
        assert!(s.contains("alice") && s.contains("<redacted>"), "{s}");
    }

    #[test]
    fn tls_files_turn_tls_on_and_go_together() {
        let c = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:9094"),
            (env::TLS_CA_FILE, "/etc/kafka/ca.pem"),
            (env::TLS_CERT_FILE, "/etc/kafka/client.pem"),
            (env::TLS_KEY_FILE, "/etc/kafka/client.key"),
        ]))
        .unwrap();
        assert_eq!(
            c.tls,
            KafkaTls::On {
                roots: TrustedRoots::File("/etc/kafka/ca.pem".into()),
                client_certificate: Some(ClientCertificate::Files {
                    certificate: "/etc/kafka/client.pem".into(),
                    private_key: "/etc/kafka/client.key".into(),
                }),
            }
        );
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[(env::TLS_CERT_FILE, "/c.pem")],
                "KAFKA_TLS_KEY_FILE: is required with KAFKA_TLS_CERT_FILE",
            ),
            (
                &[(env::TLS_KEY_FILE, "/k.pem")],
                "KAFKA_TLS_CERT_FILE: is required with KAFKA_TLS_KEY_FILE",
            ),
            (
                &[(env::TLS_CA_FILE, "/ca.pem"), (env::TLS, "false")],
                "KAFKA_TLS_CA_FILE: is set but KAFKA_TLS=false: TLS files and secrets need TLS",
            ),
        ];
        for (pairs, expected) in cases {
            let mut all = vec![(env::BOOTSTRAP_SERVERS, "h:1")];
            all.extend_from_slice(pairs);
            let e = KafkaConfig::from_lookup(lookup(&all)).unwrap_err();
            assert_eq!(e.to_string(), *expected);
        }
    }

    #[test]
    fn compression_is_one_of_five_codecs() {
        let with = |v: &str| {
            KafkaConfig::from_lookup(lookup(&[
                (env::BOOTSTRAP_SERVERS, "h:1"),
                (env::COMPRESSION, v),
            ]))
        };
        let c = KafkaConfig::from_lookup(lookup(&[(env::BOOTSTRAP_SERVERS, "h:1")])).unwrap();
        assert_eq!(c.compression, KafkaCompression::None);
        for (v, want) in [
            ("none", KafkaCompression::None),
            ("gzip", KafkaCompression::Gzip),
            ("Snappy", KafkaCompression::Snappy),
            ("lz4", KafkaCompression::Lz4),
            (" zstd ", KafkaCompression::Zstd),
        ] {
            assert_eq!(with(v).unwrap().compression, want, "{v}");
        }
        assert_eq!(
            with("brotli").unwrap_err().to_string(),
            "KAFKA_COMPRESSION: \"brotli\" is not one of none, gzip, snappy, lz4, zstd"
        );
    }

    #[test]
    fn debug_never_shows_credentials() {
        use aws_credential_types::Credentials;
        let creds = Credentials::new("AKIDEXAMPLE", "very-secret", Some("tok".into()), None, "t");
        let c = KafkaConfig::new(["h:1"])
            .with_msk_iam("us-east-1")
            .with_credentials(SharedCredentialsProvider::new(creds));
        let s = format!("{c:?}");
        assert!(
            !s.contains("very-secret") && !s.contains("AKIDEXAMPLE"),
            "{s}"
        );
        assert!(s.contains("<provided>"), "{s}");
    }

    #[test]
    fn mtls_takes_its_client_certificate_from_a_secret_or_files_and_forces_tls() {
        let client = "arn:aws:secretsmanager:eu-west-1:1:secret:kafka-client";
        let ca = "arn:aws:secretsmanager:eu-west-1:1:secret:kafka-ca";
        let c = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "b-1:9094"),
            (env::AUTH, "MTLS"),
            (env::TLS_CLIENT_SECRET_ARN, client),
            (env::TLS_CA_SECRET_ARN, ca),
        ]))
        .unwrap();
        assert_eq!((c.auth, c.sasl.is_none()), (KafkaAuth::Mtls, true));
        assert_eq!(
            c.tls,
            KafkaTls::On {
                roots: TrustedRoots::Secret(TlsSecret::new(ca)),
                client_certificate: Some(ClientCertificate::Secret(TlsSecret::new(client))),
            }
        );
        let c = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "b-1:9094"),
            (env::AUTH, "mtls"),
            (env::TLS_CERT_FILE, "/c.pem"),
            (env::TLS_KEY_FILE, "/k.pem"),
            // a template's unused parameters
            (env::TLS_CLIENT_SECRET_ARN, ""),
            (env::TLS_CA_SECRET_ARN, " "),
        ]))
        .unwrap();
        assert_eq!(
            c.tls,
            KafkaTls::system().with_client_certificate(ClientCertificate::Files {
                certificate: "/c.pem".into(),
                private_key: "/k.pem".into(),
            })
        );
        // secrets turn TLS on without any authentication, as files do
        let c = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:9093"),
            (env::TLS_CA_SECRET_ARN, ca),
        ]))
        .unwrap();
        assert!(c.tls.is_on() && c.auth == KafkaAuth::None);
    }

    #[test]
    fn tls_secrets_and_mtls_errors_name_the_variables_and_the_rule() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[(env::AUTH, "mtls")],
                "KAFKA_AUTH: mtls needs a client certificate: KAFKA_TLS_CLIENT_SECRET_ARN (a \
                 Secrets Manager secret with \"certificate\" and \"privateKey\"), or \
                 KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE",
            ),
            (
                &[(env::AUTH, "mtls"), (env::TLS_CA_SECRET_ARN, "arn:ca")],
                "KAFKA_AUTH: mtls needs a client certificate: KAFKA_TLS_CLIENT_SECRET_ARN (a \
                 Secrets Manager secret with \"certificate\" and \"privateKey\"), or \
                 KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE",
            ),
            (
                &[
                    (env::AUTH, "mtls"),
                    (env::TLS_CLIENT_SECRET_ARN, "arn:c"),
                    (env::TLS, "false"),
                ],
                "KAFKA_TLS: KAFKA_AUTH=mtls is TLS with a client certificate: KAFKA_TLS=false \
                 is refused",
            ),
            (
                &[
                    (env::TLS_CA_SECRET_ARN, "arn:ca"),
                    (env::TLS_CA_FILE, "/ca.pem"),
                ],
                "KAFKA_TLS_CA_SECRET_ARN: is set together with KAFKA_TLS_CA_FILE: name the CA \
                 one way",
            ),
            (
                &[
                    (env::AUTH, "mtls"),
                    (env::TLS_CLIENT_SECRET_ARN, "arn:c"),
                    (env::TLS_CERT_FILE, "/c.pem"),
                    (env::TLS_KEY_FILE, "/k.pem"),
                ],
                "KAFKA_TLS_CLIENT_SECRET_ARN: is set together with \
                 KAFKA_TLS_CERT_FILE/KAFKA_TLS_KEY_FILE: name the client certificate one way",
            ),
            (
                &[
                    (env::TLS_CLIENT_SECRET_ARN, "arn:c"),
                    (env::TLS_KEY_FILE, "/k.pem"),
                ],
                "KAFKA_TLS_CLIENT_SECRET_ARN: is set together with \
                 KAFKA_TLS_CERT_FILE/KAFKA_TLS_KEY_FILE: name the client certificate one way",
            ),
            (
                &[(env::TLS_CLIENT_SECRET_ARN, "arn:c"), (env::TLS, "false")],
                "KAFKA_TLS_CLIENT_SECRET_ARN: is set but KAFKA_TLS=false: TLS files and \
                 secrets need TLS",
            ),
            (
                &[
                    (env::AUTH, "mtls"),
                    (env::TLS_CLIENT_SECRET_ARN, "arn:c"),
                    (env::SASL_SECRET_ARN, "arn:s"),
                ],
                "KAFKA_SASL_SECRET_ARN: is set but KAFKA_AUTH=mtls: only scram-sha-256, \
                 scram-sha-512 and plain use it",
            ),
        ];
        for (pairs, expected) in cases {
            let mut all = vec![(env::BOOTSTRAP_SERVERS, "h:1")];
            all.extend_from_slice(pairs);
            let e = KafkaConfig::from_lookup(lookup(&all)).unwrap_err();
            assert_eq!(e.to_string(), *expected);
        }
        // the same rules for a configuration built in code
        let mut c = KafkaConfig::new(["h:1"]);
        c.auth = KafkaAuth::Mtls;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "tls: must be on for mtls (mutual TLS)"
        );
        c.tls = KafkaTls::system();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("tls: needs a client certificate for mtls"));
        let c =
            KafkaConfig::new(["h:1"]).with_mtls(ClientCertificate::Secret(TlsSecret::new("arn:c")));
        c.validate().unwrap();
        assert_eq!(c.tls.roots(), Some(&TrustedRoots::System));
        // the roots of a configuration that is on already are kept
        let c = KafkaConfig::new(["h:1"])
            .with_tls(KafkaTls::system().with_roots(TrustedRoots::File("/ca.pem".into())))
            .with_mtls(ClientCertificate::Secret(TlsSecret::new("arn:c")));
        assert_eq!(c.tls.roots(), Some(&TrustedRoots::File("/ca.pem".into())));
    }
}
