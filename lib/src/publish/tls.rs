//! TLS to the brokers: the trusted roots (the system's, or a PEM bundle instead: the file
//! of `KAFKA_TLS_CA_FILE` or the secret of `KAFKA_TLS_CA_SECRET_ARN`) and the client
//! certificate of mutual TLS (the files of `KAFKA_TLS_CERT_FILE` and `KAFKA_TLS_KEY_FILE`,
//! or the secret of `KAFKA_TLS_CLIENT_SECRET_ARN`), on rustls' ring provider.
//!
//! A CA bundle replaces the system roots, as librdkafka's `ssl.ca.location` and a Java
//! truststore do: a cluster with a private CA is then trusted through that CA only, and a
//! certificate from a public CA is not. For MSK with a public CA leave it unset; for a
//! private CA (MSK with ACM Private CA, self-hosted clusters) put the whole chain's roots
//! in it.
//!
//! [`KafkaTls`] says whether TLS is on, which roots it trusts ([`TrustedRoots`]) and which
//! client certificate it shows ([`ClientCertificate`]); `KAFKA_TLS` parses into it
//! ([`FromStr`]), and the configuration's other variables fill in the roots and the
//! certificate.
//!
//! A secret ([`TlsSecret`]) is read from AWS Secrets Manager at the first connect and kept,
//! parsed, for the life of the process (one Lambda execution environment); the clones of
//! one configuration share it. rustls takes it from memory: no file is written. When a
//! TLS handshake fails (a certificate refused or not trusted) the secrets are forgotten,
//! so the connect after a rotation reads the new ones. Neither the private key nor
//! anything else read from a secret appears in `Debug` output, in errors or in logs.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::env;
use crate::error::{Error, Result};

/// Whether the publisher speaks TLS to the brokers, which roots it trusts, and which client
/// certificate it shows ([`KafkaConfig::tls`](super::KafkaConfig::tls)).
///
/// `KAFKA_TLS` parses into it: `true` (also `1`, `yes`, `on`) is TLS with the system's
/// roots and no client certificate, `false` (also `0`, `no`, `off`) is plaintext; the CA
/// and client certificate variables then fill in [`TrustedRoots`] and
/// [`ClientCertificate`].
///
/// # Examples
/// ```
/// use dynamo_outbox::publish::{ClientCertificate, KafkaTls, TrustedRoots};
///
/// let tls: KafkaTls = "true".parse()?;
/// assert_eq!(tls, KafkaTls::system());
/// let mtls = KafkaTls::system()
///     .with_roots(TrustedRoots::File("/etc/kafka/ca.pem".into()))
///     .with_client_certificate(ClientCertificate::Files {
///         certificate: "/etc/kafka/client.pem".into(),
///         private_key: "/etc/kafka/client.key".into(),
///     });
/// assert!(mtls.is_on() && mtls.client_certificate().is_some());
/// let err = "maybe".parse::<KafkaTls>().unwrap_err();
/// assert_eq!(err.to_string(), "KAFKA_TLS: \"maybe\" is not true or false");
/// # Ok::<(), dynamo_outbox::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KafkaTls {
    /// Plaintext: the default without authentication.
    #[default]
    Off,
    /// TLS.
    On {
        /// The roots the brokers' certificate must chain to.
        roots: TrustedRoots,
        /// The client certificate of mutual TLS, if the brokers ask for one.
        client_certificate: Option<ClientCertificate>,
    },
}

/// The roots a TLS connection to the brokers trusts ([`KafkaTls::On`]).
///
/// A CA bundle replaces the system's roots (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrustedRoots {
    /// The system's roots (what Lambda's runtime and most machines ship): the default.
    #[default]
    System,
    /// A PEM bundle in a file (`KAFKA_TLS_CA_FILE`).
    File(PathBuf),
    /// A Secrets Manager secret whose string is a PEM bundle (`KAFKA_TLS_CA_SECRET_ARN`).
    Secret(TlsSecret),
}

/// The client certificate of mutual TLS ([`KafkaTls::On`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientCertificate {
    /// The certificate chain and its key in PEM files (`KAFKA_TLS_CERT_FILE`,
    /// `KAFKA_TLS_KEY_FILE`).
    Files {
        /// The certificate chain (PEM, leaf first).
        certificate: PathBuf,
        /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
        private_key: PathBuf,
    },
    /// A Secrets Manager secret with the chain and the key, as JSON
    /// `{"certificate": "<PEM chain>", "privateKey": "<PEM key>"}`
    /// (`KAFKA_TLS_CLIENT_SECRET_ARN`).
    Secret(TlsSecret),
}

impl KafkaTls {
    /// TLS with the system's roots and no client certificate.
    pub fn system() -> Self {
        KafkaTls::On {
            roots: TrustedRoots::System,
            client_certificate: None,
        }
    }

    /// Whether TLS is on.
    pub fn is_on(&self) -> bool {
        matches!(self, KafkaTls::On { .. })
    }

    /// The trusted roots; `None` when TLS is off.
    pub fn roots(&self) -> Option<&TrustedRoots> {
        match self {
            KafkaTls::On { roots, .. } => Some(roots),
            KafkaTls::Off => None,
        }
    }

    /// The client certificate; `None` when TLS is off or shows none.
    pub fn client_certificate(&self) -> Option<&ClientCertificate> {
        match self {
            KafkaTls::On {
                client_certificate, ..
            } => client_certificate.as_ref(),
            KafkaTls::Off => None,
        }
    }

    /// Trusts `roots` instead; turns TLS on.
    pub fn with_roots(self, roots: TrustedRoots) -> Self {
        let client_certificate = self.client_certificate().cloned();
        KafkaTls::On {
            roots,
            client_certificate,
        }
    }

    /// Shows `certificate` to the brokers (mutual TLS); turns TLS on.
    pub fn with_client_certificate(self, certificate: ClientCertificate) -> Self {
        let roots = self.roots().cloned().unwrap_or_default();
        KafkaTls::On {
            roots,
            client_certificate: Some(certificate),
        }
    }

    /// The secrets it names, to forget after a refused handshake.
    pub(crate) fn secrets(&self) -> impl Iterator<Item = &TlsSecret> {
        let roots = match self.roots() {
            Some(TrustedRoots::Secret(s)) => Some(s),
            _ => None,
        };
        let client = match self.client_certificate() {
            Some(ClientCertificate::Secret(s)) => Some(s),
            _ => None,
        };
        roots.into_iter().chain(client)
    }
}

/// Parses the value of `KAFKA_TLS`: `true`, `1`, `yes` or `on` is [`KafkaTls::system`];
/// `false`, `0`, `no` or `off` is [`KafkaTls::Off`]; anything else is
/// [`Error::InvalidOption`] naming `KAFKA_TLS` and the rule.
impl FromStr for KafkaTls {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(KafkaTls::system()),
            "false" | "0" | "no" | "off" => Ok(KafkaTls::Off),
            _ => Err(Error::option(
                env::TLS,
                format!("{value:?} is not true or false"),
            )),
        }
    }
}

/// The format of the secret of [`env::TLS_CLIENT_SECRET_ARN`], for errors.
const CLIENT_SECRET_FORMAT: &str =
    "a JSON object with \"certificate\" (the PEM chain, leaf first) and \"privateKey\" (its PEM key)";
/// The format of the secret of [`env::TLS_CA_SECRET_ARN`], for errors.
const CA_SECRET_FORMAT: &str = "a PEM bundle of the trusted CA certificates";

/// A Secrets Manager secret with TLS material, and what was read from it (shared by the
/// clones): for [`TrustedRoots::Secret`] a PEM bundle of CA certificates, for
/// [`ClientCertificate::Secret`] a JSON object with `certificate` and `privateKey`.
///
/// Two values are equal when they name the same secret.
#[derive(Clone)]
pub struct TlsSecret {
    secret_id: String,
    read: Arc<tokio::sync::Mutex<Option<Arc<Material>>>>,
}

/// What a secret held, parsed.
enum Material {
    Roots(Vec<CertificateDer<'static>>),
    Identity {
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    },
}

impl PartialEq for TlsSecret {
    fn eq(&self, other: &Self) -> bool {
        self.secret_id == other.secret_id
    }
}

impl Eq for TlsSecret {}

impl fmt::Debug for TlsSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // the secret's name, never what was read from it
        f.debug_struct("TlsSecret")
            .field("secret_id", &self.secret_id)
            .finish_non_exhaustive()
    }
}

impl TlsSecret {
    /// The secret `secret_id` (an ARN or a name) of AWS Secrets Manager, read when first
    /// needed with the standard AWS configuration (region, credentials, and the endpoint,
    /// which `AWS_ENDPOINT_URL_SECRETS_MANAGER` overrides).
    pub fn new(secret_id: impl Into<String>) -> Self {
        TlsSecret {
            secret_id: secret_id.into(),
            read: Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    /// The secret's ARN or name.
    pub fn secret_id(&self) -> &str {
        &self.secret_id
    }

    /// Drops what was read, so the next connect reads the secret again.
    pub async fn forget(&self) {
        *self.read.lock().await = None;
    }

    /// What the secret holds, read and parsed by `parse` on the first call only.
    async fn material(
        &self,
        variable: &str,
        format: &str,
        parse: impl FnOnce(&str, &str) -> Result<Material>,
    ) -> Result<Arc<Material>> {
        let mut read = self.read.lock().await;
        if let Some(m) = read.as_ref() {
            return Ok(m.clone());
        }
        let text = super::secret::secret_string(variable, &self.secret_id, format).await?;
        let material = Arc::new(parse(&self.secret_id, &text)?);
        *read = Some(material.clone());
        Ok(material)
    }

    /// The CA certificates of a [`TrustedRoots::Secret`].
    async fn roots(&self) -> Result<Vec<CertificateDer<'static>>> {
        match &*self
            .material(env::TLS_CA_SECRET_ARN, CA_SECRET_FORMAT, |id, text| {
                parse_ca_secret(id, text).map(Material::Roots)
            })
            .await?
        {
            Material::Roots(roots) => Ok(roots.clone()),
            Material::Identity { .. } => Err(Error::misconfigured(format!(
                "{}: the secret {} is also the client certificate's secret",
                env::TLS_CA_SECRET_ARN,
                self.secret_id
            ))),
        }
    }

    /// The certificate chain and key of a [`ClientCertificate::Secret`].
    async fn identity(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        match &*self
            .material(
                env::TLS_CLIENT_SECRET_ARN,
                CLIENT_SECRET_FORMAT,
                |id, text| {
                    parse_client_secret(id, text)
                        .map(|(chain, key)| Material::Identity { chain, key })
                },
            )
            .await?
        {
            Material::Identity { chain, key } => Ok((chain.clone(), key.clone_key())),
            Material::Roots(_) => Err(Error::misconfigured(format!(
                "{}: the secret {} is also the CA's secret",
                env::TLS_CLIENT_SECRET_ARN,
                self.secret_id
            ))),
        }
    }

    /// A value for tests: as if `text` had been read from the CA secret `secret_id`.
    #[cfg(test)]
    pub(crate) fn ca_read(secret_id: &str, text: &str) -> Result<Self> {
        let s = TlsSecret::new(secret_id);
        let roots = parse_ca_secret(secret_id, text)?;
        *s.read.try_lock().expect("new") = Some(Arc::new(Material::Roots(roots)));
        Ok(s)
    }

    /// A value for tests: as if `text` had been read from the client secret `secret_id`.
    #[cfg(test)]
    pub(crate) fn client_read(secret_id: &str, text: &str) -> Result<Self> {
        let s = TlsSecret::new(secret_id);
        let (chain, key) = parse_client_secret(secret_id, text)?;
        *s.read.try_lock().expect("new") = Some(Arc::new(Material::Identity { chain, key }));
        Ok(s)
    }
}

/// The CA secret's PEM bundle: at least one certificate. Errors name the variable, the
/// secret and the rule.
pub(crate) fn parse_ca_secret(secret_id: &str, text: &str) -> Result<Vec<CertificateDer<'static>>> {
    let bad = |rule: &str| {
        Error::misconfigured(format!(
            "{}: the secret {secret_id} {rule}",
            env::TLS_CA_SECRET_ARN
        ))
    };
    let certs = pem_certs(text).map_err(|e| {
        bad(&format!(
            "is not a PEM bundle ({e}); it must be {CA_SECRET_FORMAT}"
        ))
    })?;
    if certs.is_empty() {
        return Err(bad(
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----); it must be a PEM bundle \
             of the trusted CA certificates",
        ));
    }
    Ok(certs)
}

/// The client secret: a JSON object with a non-empty string `certificate` (PEM, leaf
/// first) and `privateKey` (PEM: PKCS#8, PKCS#1 or SEC1); other fields are ignored.
/// serde_json's and the PEM parser's own messages may quote the input, so errors say only
/// which rule was broken.
pub(crate) fn parse_client_secret(
    secret_id: &str,
    text: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let bad = |rule: &str| {
        Error::misconfigured(format!(
            "{}: the secret {secret_id} {rule}",
            env::TLS_CLIENT_SECRET_ARN
        ))
    };
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|_| bad(&format!("is not JSON (it must be {CLIENT_SECRET_FORMAT})")))?;
    let object = value.as_object().ok_or_else(|| {
        bad(&format!(
            "is not a JSON object (it must be {CLIENT_SECRET_FORMAT})"
        ))
    })?;
    let field = |name: &str| match object.get(name) {
        Some(serde_json::Value::String(s)) if !s.trim().is_empty() => Ok(s.as_str()),
        Some(serde_json::Value::String(_)) => Err(bad(&format!("has an empty \"{name}\""))),
        Some(_) => Err(bad(&format!("has a \"{name}\" that is not a string"))),
        None => Err(bad(&format!(
            "has no \"{name}\" (it must be {CLIENT_SECRET_FORMAT})"
        ))),
    };
    let certificate = field("certificate")?;
    let private_key = field("privateKey")?;
    let chain = pem_certs(certificate)
        .map_err(|e| bad(&format!("has a \"certificate\" that is not PEM ({e})")))?;
    if chain.is_empty() {
        return Err(bad(
            "has a \"certificate\" with no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(private_key.as_bytes()).map_err(|e| {
        bad(&format!(
            "has a \"privateKey\" with no usable PEM private key ({})",
            key_pem_error(&e)
        ))
    })?;
    Ok((chain, key))
}

/// Every certificate of a PEM text (none when it holds no certificate section).
fn pem_certs(text: &str) -> std::result::Result<Vec<CertificateDer<'static>>, &'static str> {
    CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| key_pem_error(&e))
}

/// A PEM parse error in words that never quote the input (a private key's bytes could be
/// in the parser's message).
fn key_pem_error(e: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error as E;
    match e {
        E::NoItemsFound => {
            "no -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY----- section"
        }
        E::MissingSectionEnd { .. } => "a section has no -----END ...----- line",
        E::IllegalSectionStart { .. } => "a malformed -----BEGIN ...----- line",
        E::Base64Decode(_) => "a section is not valid base64",
        _ => "unreadable PEM",
    }
}

/// The rustls client configuration of TLS with `roots` and `client_certificate`; the
/// secrets they name are read on the first call (once per process).
pub(crate) async fn client_config(
    roots: &TrustedRoots,
    client_certificate: Option<&ClientCertificate>,
) -> Result<Arc<rustls::ClientConfig>> {
    let roots = match roots {
        TrustedRoots::File(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(env::TLS_CA_FILE, path)? {
                roots.add(cert).map_err(|e| {
                    bad_by(
                        env::TLS_CA_FILE,
                        path,
                        "holds a certificate that is not a usable CA",
                        e,
                    )
                })?;
            }
            roots
        }
        TrustedRoots::Secret(secret) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in secret.roots().await? {
                roots.add(cert).map_err(|e| {
                    Error::misconfigured_by(
                        format!(
                            "{}: the secret {} holds a certificate that is not a usable CA",
                            env::TLS_CA_SECRET_ARN,
                            secret.secret_id
                        ),
                        e,
                    )
                })?;
            }
            roots
        }
        TrustedRoots::System => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| {
            Error::misconfigured_by(
                "TLS: no protocol version both rustls and its provider support",
                e,
            )
        })?
        .with_root_certificates(roots);
    let config = match client_certificate {
        Some(ClientCertificate::Files {
            certificate,
            private_key,
        }) => {
            let chain = read_certs(env::TLS_CERT_FILE, certificate)?;
            let key = PrivateKeyDer::from_pem_file(private_key).map_err(|e| {
                bad(
                    env::TLS_KEY_FILE,
                    private_key,
                    &format!("has no usable PEM private key ({})", pem_error(&e)),
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                bad_by(
                    env::TLS_KEY_FILE,
                    private_key,
                    &format!("does not go with the certificate of {}", env::TLS_CERT_FILE),
                    e,
                )
            })?
        }
        Some(ClientCertificate::Secret(secret)) => {
            let (chain, key) = secret.identity().await?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                Error::misconfigured_by(
                    format!(
                        "{}: the secret {}: its \"privateKey\" does not go with its \"certificate\"",
                        env::TLS_CLIENT_SECRET_ARN,
                        secret.secret_id
                    ),
                    e,
                )
            })?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The system's trusted roots (what Lambda's runtime and most machines ship).
pub(crate) fn system_roots() -> Result<rustls::RootCertStore> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(Error::misconfigured(format!(
            "KAFKA_TLS: no trusted root certificates found on this system ({} errors while \
             loading); name a PEM bundle in {}",
            found.errors.len(),
            env::TLS_CA_FILE
        )));
    }
    Ok(roots)
}

fn bad(variable: &str, path: &Path, rule: &str) -> Error {
    Error::misconfigured(format!("{variable}: {}: {rule}", path.display()))
}

/// [`bad`], revealed by `source`.
fn bad_by(
    variable: &str,
    path: &Path,
    rule: &str,
    source: impl Into<crate::error::BoxError>,
) -> Error {
    Error::misconfigured_by(format!("{variable}: {}: {rule}", path.display()), source)
}

/// What is wrong with a PEM file, without its content: the parser's errors carry lines of
/// the file (a private key written on one line would be all of it), so only their kind is
/// named.
fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM item of that kind".into(),
        other => key_pem_error(other).into(),
    }
}

/// Every certificate of a PEM file; an error naming the variable when there is none.
fn read_certs(variable: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    if let Err(e) = std::fs::metadata(path) {
        return Err(bad_by(variable, path, "cannot be read", e));
    }
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| {
            bad(
                variable,
                path,
                &format!("is not a PEM file ({})", pem_error(&e)),
            )
        })?;
    if certs.is_empty() {
        return Err(bad(
            variable,
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

/// The subject of the client certificate `tls` shows, for the publisher's principal:
/// `None` without one (TLS off, or no client certificate), else its leaf's subject as
/// [`subject_rfc2253`] writes it (`Some(None)` when it cannot be read). Read as the connect
/// read it: the file again, or what was kept of the secret.
pub(crate) async fn client_subject(tls: &KafkaTls) -> Option<Option<String>> {
    let leaf = match tls.client_certificate()? {
        ClientCertificate::Files { certificate, .. } => read_certs(env::TLS_CERT_FILE, certificate)
            .ok()
            .and_then(|chain| chain.into_iter().next()),
        ClientCertificate::Secret(secret) => secret
            .identity()
            .await
            .ok()
            .and_then(|(chain, _)| chain.into_iter().next()),
    };
    Some(leaf.and_then(|cert| subject_rfc2253(&cert)))
}

/// One DER element at the start of `input`: its tag, its content, and what follows it.
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |len, &b| (len << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The content of the DER SEQUENCE at the start of `input`, and what follows it.
fn der_sequence(input: &[u8]) -> Option<(&[u8], &[u8])> {
    match der(input)? {
        (0x30, content, rest) => Some((content, rest)),
        _ => None,
    }
}

/// The subject of a DER certificate as RFC 2253 writes a distinguished name (Java's
/// `X500Principal.getName()`, from which Kafka's default principal builder makes
/// `User:...`): the relative names last to first, `,`-separated, the attributes of one
/// `+`-separated; the usual attribute types by their keyword, others as the dotted OID
/// with the value's DER in hex.
fn subject_rfc2253(cert: &[u8]) -> Option<String> {
    let (certificate, _) = der_sequence(cert)?;
    let (tbs, _) = der_sequence(certificate)?;
    let mut fields = tbs;
    if fields.first() == Some(&0xa0) {
        fields = der(fields)?.2; // the version
    }
    for _ in 0..4 {
        fields = der(fields)?.2; // serial number, signature, issuer, validity
    }
    let (mut names, _) = der_sequence(fields)?;
    let mut rdns = Vec::new();
    while !names.is_empty() {
        let (tag, mut set, rest) = der(names)?;
        if tag != 0x31 {
            return None;
        }
        names = rest;
        let mut attributes = Vec::new();
        while !set.is_empty() {
            let (attribute, rest) = der_sequence(set)?;
            set = rest;
            let (tag, oid, value) = der(attribute)?;
            if tag != 0x06 {
                return None;
            }
            attributes.push(attribute_rfc2253(oid, value)?);
        }
        rdns.push(attributes.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// One `type=value` of [`subject_rfc2253`].
fn attribute_rfc2253(oid: &[u8], value: &[u8]) -> Option<String> {
    const KEYWORDS: [(&[u8], &str); 9] = [
        (&[0x55, 0x04, 0x03], "CN"),
        (&[0x55, 0x04, 0x06], "C"),
        (&[0x55, 0x04, 0x07], "L"),
        (&[0x55, 0x04, 0x08], "ST"),
        (&[0x55, 0x04, 0x09], "STREET"),
        (&[0x55, 0x04, 0x0a], "O"),
        (&[0x55, 0x04, 0x0b], "OU"),
        (
            &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19],
            "DC",
        ),
        (
            &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01],
            "UID",
        ),
    ];
    let (tag, content, rest) = der(value)?;
    let element = &value[..value.len() - rest.len()];
    let keyword = KEYWORDS.iter().find(|(o, _)| *o == oid).map(|(_, k)| *k);
    let text = match tag {
        // UTF8String, PrintableString, IA5String
        0x0c | 0x13 | 0x16 => std::str::from_utf8(content).ok().map(str::to_owned),
        // TeletexString, read as Latin-1
        0x14 => Some(content.iter().map(|&b| char::from(b)).collect()),
        // BMPString: UTF-16, big-endian
        0x1e => {
            let units: Vec<u16> = content
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    };
    Some(match (keyword, text) {
        (Some(keyword), Some(text)) => format!("{keyword}={}", escape_rfc2253(&text)),
        (keyword, _) => {
            let name = match keyword {
                Some(k) => k.to_owned(),
                None => dotted_oid(oid)?,
            };
            let hex: String = element.iter().map(|b| format!("{b:02x}")).collect();
            format!("{name}=#{hex}")
        }
    })
}

/// An attribute value with RFC 2253's escapes: `,+"\<>;` anywhere, `#` or a space first,
/// a space last.
fn escape_rfc2253(value: &str) -> String {
    let last = value.chars().count().saturating_sub(1);
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && matches!(c, '#' | ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A DER object identifier's content as dotted decimals (`1.2.840.113549.1.9.1`).
fn dotted_oid(oid: &[u8]) -> Option<String> {
    let mut arcs: Vec<u64> = Vec::new();
    let mut n: u64 = 0;
    for &b in oid {
        n = n.checked_mul(128)? | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            arcs.push(n);
            n = 0;
        }
    }
    let first = *arcs.first()?;
    let (a, b) = if first < 80 {
        (first / 40, first % 40)
    } else {
        (2, first - 80)
    };
    let mut text = format!("{a}.{b}");
    for arc in &arcs[1..] {
        text.push_str(&format!(".{arc}"));
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(name: &str, contents: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("outbox-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[tokio::test]
    async fn system_roots_when_no_ca_file() {
        // the machine running the tests has a CA bundle, as Lambda's runtime does
        client_config(&TrustedRoots::System, None).await.unwrap();
    }

    /// What a connect builds from a [`KafkaTls`] that is on.
    async fn rustls_of(tls: &KafkaTls) -> Result<Arc<rustls::ClientConfig>> {
        let KafkaTls::On {
            roots,
            client_certificate,
        } = tls
        else {
            panic!("TLS is off");
        };
        client_config(roots, client_certificate.as_ref()).await
    }

    #[test]
    fn kafka_tls_parses_the_variable_and_builds_up() {
        for on in ["true", "1", "YES", " on "] {
            assert_eq!(on.parse::<KafkaTls>().unwrap(), KafkaTls::system(), "{on}");
        }
        for off in ["false", "0", "no", "Off"] {
            assert_eq!(off.parse::<KafkaTls>().unwrap(), KafkaTls::Off, "{off}");
        }
        let e = "maybe".parse::<KafkaTls>().unwrap_err();
        assert!(matches!(&e, Error::InvalidOption { field, .. } if field == env::TLS));
        assert_eq!(e.to_string(), "KAFKA_TLS: \"maybe\" is not true or false");

        let off = KafkaTls::default();
        assert!(!off.is_on() && off.roots().is_none() && off.secrets().next().is_none());
        let ca = TlsSecret::new("arn:ca");
        let client = TlsSecret::new("arn:client");
        let tls = KafkaTls::Off
            .with_client_certificate(ClientCertificate::Secret(client.clone()))
            .with_roots(TrustedRoots::Secret(ca.clone()));
        assert_eq!(
            tls,
            KafkaTls::On {
                roots: TrustedRoots::Secret(ca),
                client_certificate: Some(ClientCertificate::Secret(client)),
            }
        );
        let ids: Vec<&str> = tls.secrets().map(TlsSecret::secret_id).collect();
        assert_eq!(ids, ["arn:ca", "arn:client"]);
    }

    #[tokio::test]
    async fn unreadable_or_empty_files_name_the_variable() {
        let tls = KafkaTls::system().with_roots(TrustedRoots::File("/nonexistent/ca.pem".into()));
        let e = rustls_of(&tls).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "misconfiguration: KAFKA_TLS_CA_FILE: /nonexistent/ca.pem: cannot be read"
        );
        // the I/O error stays the source
        let io = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the I/O error as the source");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        let empty = with_file("ca.pem", "not a certificate\n");
        let tls = KafkaTls::system().with_roots(TrustedRoots::File(empty.clone()));
        let e = rustls_of(&tls).await.unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "misconfiguration: KAFKA_TLS_CA_FILE: {}: holds no PEM certificate \
                 (-----BEGIN CERTIFICATE-----)",
                empty.display()
            )
        );
    }

    /// A CA (PEM) and a client certificate chain and key it issued (PEM).
    fn pki() -> (String, String, String) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["outbox-relay".to_string()])
            .unwrap()
            .signed_by(&key, &ca_cert, &ca_key)
            .unwrap();
        (ca_cert.pem(), leaf.pem(), key.serialize_pem())
    }

    fn client_json(certificate: &str, key: &str) -> String {
        serde_json::json!({"certificate": certificate, "privateKey": key}).to_string()
    }

    const ARN: &str = "arn:aws:secretsmanager:eu-west-1:1:secret:kafka-client";

    #[tokio::test]
    async fn secrets_give_rustls_its_roots_and_client_certificate_from_memory() {
        let (ca, cert, key) = pki();
        let tls = KafkaTls::system()
            .with_roots(TrustedRoots::Secret(
                TlsSecret::ca_read("arn:ca", &ca).unwrap(),
            ))
            .with_client_certificate(ClientCertificate::Secret(
                TlsSecret::client_read(ARN, &client_json(&cert, &key)).unwrap(),
            ));
        let rustls = rustls_of(&tls).await.unwrap();
        assert!(rustls.client_auth_cert_resolver.has_certs());
        // a bundle of two CAs and other text around them
        let (other_ca, _, _) = pki();
        let bundle = format!("# roots\n{ca}\nsome comment\n{other_ca}");
        assert_eq!(parse_ca_secret("arn:ca", &bundle).unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_key_file_on_one_line_is_an_error_that_shows_none_of_it() {
        // A key pasted with its line breaks lost (spaces, or a JSON string's `\n` kept as
        // two characters): the PEM parser's error holds the whole line.
        let (_, cert, key) = pki();
        let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
        for joined in [key.replace('\n', " "), key.replace('\n', "\\n")] {
            let key_path = with_file("key.pem", &joined);
            let tls = KafkaTls::system().with_client_certificate(ClientCertificate::Files {
                certificate: with_file("cert.pem", &cert),
                private_key: key_path.clone(),
            });
            let e = rustls_of(&tls).await.unwrap_err().to_string();
            assert!(
                e.starts_with(&format!(
                    "misconfiguration: KAFKA_TLS_KEY_FILE: {}: has no usable PEM private key (",
                    key_path.display()
                )),
                "{e}"
            );
            assert!(!e.contains(&body[..24]), "{e}");
            // Nor as the bytes a Debug of the parser's error would list.
            let bytes = format!("{:?}", &body.as_bytes()[..12]);
            assert!(!e.contains(&bytes[1..bytes.len() - 1]), "{e}");
        }
    }

    #[tokio::test]
    async fn a_key_that_is_not_the_certificates_is_a_clear_error() {
        let (_, cert, _) = pki();
        let (_, _, other_key) = pki();
        let tls = KafkaTls::system().with_client_certificate(ClientCertificate::Secret(
            TlsSecret::client_read(ARN, &client_json(&cert, &other_key)).unwrap(),
        ));
        let err = rustls_of(&tls).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "misconfiguration: KAFKA_TLS_CLIENT_SECRET_ARN: the secret {ARN}: its \
                 \"privateKey\" does not go with its \"certificate\""
            )
        );
        // rustls' refusal stays the source
        let source = std::error::Error::source(&err).expect("rustls' error as the source");
        assert!(
            source.downcast_ref::<rustls::Error>().is_some(),
            "{source:?}"
        );
        let e = crate::error::chain(&err);
        assert!(!e.contains("PRIVATE KEY"), "{e}");
    }

    #[test]
    fn client_secret_errors_name_the_variable_the_secret_and_the_rule_never_the_key() {
        let (_, cert, key) = pki();
        let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
        let cases = [
            (format!("not json {key}"), "is not JSON (it must be a JSON object with \"certificate\""),
            (
                serde_json::json!([cert, key]).to_string(),
                "is not a JSON object (it must be",
            ),
            (
                serde_json::json!({"privateKey": key}).to_string(),
                "has no \"certificate\" (it must be",
            ),
            (
                serde_json::json!({"certificate": cert}).to_string(),
                "has no \"privateKey\" (it must be",
            ),
            (
                serde_json::json!({"certificate": cert, "private_key": key}).to_string(),
                "has no \"privateKey\"",
            ),
            (
                serde_json::json!({"certificate": cert, "privateKey": 7}).to_string(),
                "has a \"privateKey\" that is not a string",
            ),
            (client_json("", &key), "has an empty \"certificate\""),
            (
                client_json("no pem here", &key),
                "has a \"certificate\" with no PEM certificate (-----BEGIN CERTIFICATE-----)",
            ),
            (
                client_json(&cert, &cert),
                "has a \"privateKey\" with no usable PEM private key (no -----BEGIN PRIVATE KEY-----",
            ),
            (
                client_json(
                    &cert,
                    &format!("-----BEGIN PRIVATE KEY-----\n{body}!!\n-----END PRIVATE KEY-----\n"),
                ),
                "has a \"privateKey\" with no usable PEM private key (a section is not valid base64)",
            ),
            (
                client_json(&cert, &format!("-----BEGIN PRIVATE KEY-----\n{body}\n")),
                "has a \"privateKey\" with no usable PEM private key (a section has no -----END",
            ),
        ];
        for (text, rule) in cases {
            let e = parse_client_secret(ARN, &text)
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "misconfiguration: KAFKA_TLS_CLIENT_SECRET_ARN: the secret {ARN} {rule}"
                )),
                "{e}\nwanted: {rule}"
            );
            assert!(!e.contains(&body[..40]), "the key's bytes in {e}");
        }
    }

    #[test]
    fn a_ca_secret_without_a_certificate_is_a_clear_error() {
        for text in [
            "",
            "not a certificate",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        ] {
            let e = parse_ca_secret("arn:ca", text).unwrap_err().to_string();
            assert_eq!(
                e,
                "misconfiguration: KAFKA_TLS_CA_SECRET_ARN: the secret arn:ca holds no PEM \
                 certificate (-----BEGIN CERTIFICATE-----); it must be a PEM bundle of the \
                 trusted CA certificates"
            );
        }
        let e = parse_ca_secret(
            "arn:ca",
            "-----BEGIN CERTIFICATE-----\nAA!A\n-----END CERTIFICATE-----\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("misconfiguration: KAFKA_TLS_CA_SECRET_ARN: the secret arn:ca is not a PEM bundle (a section is not valid base64)"),
            "{e}"
        );
    }

    #[test]
    fn debug_of_tls_with_a_read_key_holds_no_key_bytes() {
        let (ca, cert, key) = pki();
        // what a configuration's Debug shows of its TLS
        let config = KafkaTls::system()
            .with_roots(TrustedRoots::Secret(
                TlsSecret::ca_read("arn:ca", &ca).unwrap(),
            ))
            .with_client_certificate(ClientCertificate::Secret(
                TlsSecret::client_read(ARN, &client_json(&cert, &key)).unwrap(),
            ));
        let der = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let der = der.secret_der();
        let shown = format!("{config:?} {config:#?}");
        assert!(shown.contains(ARN) && shown.contains("arn:ca"), "{shown}");
        let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
        for line in key.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!shown.contains(line), "a line of the key's PEM in {shown}");
        }
        assert!(!shown.contains(&body[..20]));
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        let hex: String = der[..16].iter().map(|b| format!("{b:02x}")).collect();
        let list = format!("{:?}", &der[..16]);
        let list = list.trim_start_matches('[').trim_end_matches(']');
        assert!(!shown.contains(&hex) && !shown.contains(list), "{shown}");
    }

    /// The principal of mutual TLS: the leaf's subject as RFC 2253 writes it (what Kafka's
    /// default principal builder shows as `User:...`), from the file or the secret.
    #[tokio::test]
    async fn the_client_certificates_subject_reads_as_rfc_2253() {
        use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CountryName, "DE");
        dn.push(DnType::OrganizationName, "Example, Inc");
        dn.push(DnType::CommonName, "relay");
        dn.push(
            DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]),
            "ops@example.com",
        );
        params.distinguished_name = dn;
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            subject_rfc2253(cert.der()).as_deref(),
            Some(
                "1.2.840.113549.1.9.1=#0c0f6f7073406578616d706c652e636f6d,CN=relay,\
                 O=Example\\, Inc,C=DE"
            )
        );
        assert_eq!(escape_rfc2253("#a b "), "\\#a b\\ ");
        assert_eq!(subject_rfc2253(b"\x30\x03\x02\x01\x00"), None);

        // From the files and from the secret; none without a client certificate.
        let (_, pem, key) = pki();
        assert_eq!(client_subject(&KafkaTls::system()).await, None);
        let tls = KafkaTls::system().with_client_certificate(ClientCertificate::Secret(
            TlsSecret::client_read(ARN, &client_json(&pem, &key)).unwrap(),
        ));
        let expected = Some(Some("CN=rcgen self signed cert".to_owned()));
        assert_eq!(client_subject(&tls).await, expected);
        let tls = KafkaTls::system().with_client_certificate(ClientCertificate::Files {
            certificate: with_file("client.crt", &pem),
            private_key: with_file("client.key", &key),
        });
        assert_eq!(client_subject(&tls).await, expected);
        assert_eq!(client_subject(&KafkaTls::Off).await, None);
    }
}
