//! Options of the Kafka publisher: documented defaults, validation, and the one place they
//! are read from the environment.

use std::fmt;
use std::time::Duration;

use aws_credential_types::provider::SharedCredentialsProvider;

use crate::error::{Error, Result};
use crate::options::parse_duration;

/// Environment variable names of the publisher.
pub mod env {
    /// [`KafkaConfig::bootstrap_servers`](super::KafkaConfig::bootstrap_servers), comma separated.
    pub const BOOTSTRAP_SERVERS: &str = "KAFKA_BOOTSTRAP_SERVERS";
    /// [`KafkaConfig::auth`](super::KafkaConfig::auth): `none` or `msk-iam`.
    pub const AUTH: &str = "KAFKA_AUTH";
    /// [`KafkaConfig::tls`](super::KafkaConfig::tls): `true` or `false`.
    pub const TLS: &str = "KAFKA_TLS";
    /// [`KafkaConfig::client_id`](super::KafkaConfig::client_id).
    pub const CLIENT_ID: &str = "KAFKA_CLIENT_ID";
    /// [`KafkaConfig::publish_timeout`](super::KafkaConfig::publish_timeout).
    pub const PUBLISH_TIMEOUT: &str = "KAFKA_PUBLISH_TIMEOUT";
    /// [`KafkaConfig::region`](super::KafkaConfig::region), the standard AWS variable.
    pub const REGION: &str = "AWS_REGION";
    /// Fallback of [`REGION`], as the AWS SDKs read it.
    pub const DEFAULT_REGION: &str = "AWS_DEFAULT_REGION";
    /// [`KafkaConfig::message_id_header`](super::KafkaConfig::message_id_header); the same
    /// variable as [`RelayOptions::message_id_header`](crate::RelayOptions::message_id_header).
    pub const MESSAGE_ID_HEADER: &str = crate::options::env::MESSAGE_ID_HEADER;
    /// [`KafkaConfig::compression`](super::KafkaConfig::compression): `none`, `gzip`,
    /// `snappy`, `lz4` or `zstd`.
    pub const COMPRESSION: &str = "KAFKA_COMPRESSION";
}

/// How the publisher compresses each produce request's record batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

impl KafkaCompression {
    /// Parses the value of [`env::COMPRESSION`]; the error names the allowed values.
    pub fn parse(value: &str) -> std::result::Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "none" | "" => Ok(KafkaCompression::None),
            "gzip" => Ok(KafkaCompression::Gzip),
            "snappy" => Ok(KafkaCompression::Snappy),
            "lz4" => Ok(KafkaCompression::Lz4),
            "zstd" => Ok(KafkaCompression::Zstd),
            _ => Err(format!(
                "{value:?} is not one of none, gzip, snappy, lz4, zstd"
            )),
        }
    }
}

/// How the publisher authenticates to the brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KafkaAuth {
    /// No authentication (a local broker, or a plaintext/TLS listener without SASL).
    #[default]
    None,
    /// Amazon MSK IAM: SASL/OAUTHBEARER with a SigV4-presigned token, credentials from the
    /// standard AWS chain. MSK accepts it only over TLS (port 9098, or 9198 public).
    MskIam,
}

impl KafkaAuth {
    /// Parses the value of [`env::AUTH`].
    fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "none" | "" => Some(KafkaAuth::None),
            "msk-iam" | "msk_iam" | "iam" => Some(KafkaAuth::MskIam),
            _ => None,
        }
    }
}

/// Options of [`KafkaPublisher`](super::KafkaPublisher).
#[derive(Clone)]
pub struct KafkaConfig {
    /// `host:port` of one or more brokers to learn the cluster from (required).
    pub bootstrap_servers: Vec<String>,
    /// How to authenticate ([`KafkaAuth::None`]).
    pub auth: KafkaAuth,
    /// Whether to speak TLS to the brokers (on for MSK IAM, off otherwise); trusted roots
    /// are the system's.
    pub tls: bool,
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
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("auth", &self.auth)
            .field("tls", &self.tls)
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
            .finish()
    }
}

impl KafkaConfig {
    /// Options with the documented defaults for `bootstrap_servers`, without authentication.
    pub fn new(bootstrap_servers: impl IntoIterator<Item = impl Into<String>>) -> Self {
        KafkaConfig {
            bootstrap_servers: bootstrap_servers.into_iter().map(Into::into).collect(),
            auth: KafkaAuth::None,
            tls: false,
            region: None,
            client_id: "dynamo-outbox".into(),
            message_id_header: "x-outbox-message-id".into(),
            publish_timeout: Duration::from_secs(20),
            retry_budget: Duration::from_secs(5),
            produce_attempts: 3,
            max_request_bytes: 1_000_000,
            max_in_flight: 8,
            metadata_max_age: Duration::from_secs(300),
            credentials: None,
            compression: KafkaCompression::None,
        }
    }

    /// Switches to MSK IAM in `region`, over TLS.
    pub fn with_msk_iam(mut self, region: impl Into<String>) -> Self {
        self.auth = KafkaAuth::MskIam;
        self.region = Some(region.into());
        self.tls = true;
        self
    }

    /// Uses `credentials` for MSK IAM instead of the standard chain.
    pub fn with_credentials(mut self, credentials: SharedCredentialsProvider) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Sets the message-id header name.
    pub fn with_message_id_header(mut self, name: impl Into<String>) -> Self {
        self.message_id_header = name.into();
        self
    }

    /// Reads the options from the process environment (see [`env`](mod@env)) and validates them.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the options through `lookup` (an environment stand-in) and validates them.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
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
        let mut config = KafkaConfig::new(servers);
        if let Some(v) = lookup(env::AUTH) {
            config.auth = KafkaAuth::parse(&v).ok_or_else(|| {
                Error::option(env::AUTH, format!("{v:?} is not one of none, msk-iam"))
            })?;
        }
        config.tls = match lookup(env::TLS) {
            Some(v) => parse_bool(&v)
                .ok_or_else(|| Error::option(env::TLS, format!("{v:?} is not true or false")))?,
            None => config.auth == KafkaAuth::MskIam,
        };
        if config.auth == KafkaAuth::MskIam {
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
            config.region = Some(region.trim().to_owned());
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
            config.compression = KafkaCompression::parse(&v)
                .map_err(|rule| Error::option(env::COMPRESSION, rule))?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks every rule; the error names the field and the rule.
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
        Ok(())
    }
}

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
        assert!(!c.tls);
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
        assert_eq!((c.auth, c.tls), (KafkaAuth::MskIam, true));
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));

        let c = KafkaConfig::from_lookup(lookup(&[
            (env::BOOTSTRAP_SERVERS, "h:9098"),
            (env::AUTH, "MSK-IAM"),
            (env::DEFAULT_REGION, "us-east-2"),
            (env::TLS, "false"),
        ]))
        .unwrap();
        assert_eq!((c.tls, c.region.as_deref()), (false, Some("us-east-2")));

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
            "KAFKA_AUTH: \"scram\" is not one of none, msk-iam"
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
}
