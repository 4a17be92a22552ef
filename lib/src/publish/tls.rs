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
//! A secret ([`TlsSecret`]) is read from AWS Secrets Manager at the first connect and kept,
//! parsed, for the life of the process (one Lambda execution environment); the clones of
//! one [`KafkaConfig`] share it. rustls takes it from memory: no file is written. When a
//! TLS handshake fails (a certificate refused or not trusted) the secrets are forgotten,
//! so the connect after a rotation reads the new ones. Neither the private key nor
//! anything else read from a secret appears in `Debug` output, in errors or in logs.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::config::KafkaConfig;
use super::env;
use crate::error::{Error, Result};

/// The format of the secret of [`env::TLS_CLIENT_SECRET_ARN`], for errors.
const CLIENT_SECRET_FORMAT: &str =
    "a JSON object with \"certificate\" (the PEM chain, leaf first) and \"privateKey\" (its PEM key)";
/// The format of the secret of [`env::TLS_CA_SECRET_ARN`], for errors.
const CA_SECRET_FORMAT: &str = "a PEM bundle of the trusted CA certificates";

/// A Secrets Manager secret with TLS material, and what was read from it (shared by the
/// clones): for [`KafkaConfig::tls_ca_secret`] a PEM bundle of CA certificates, for
/// [`KafkaConfig::tls_client_secret`] a JSON object with `certificate` and `privateKey`.
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

    /// The CA certificates of a [`KafkaConfig::tls_ca_secret`].
    async fn roots(&self) -> Result<Vec<CertificateDer<'static>>> {
        match &*self
            .material(env::TLS_CA_SECRET_ARN, CA_SECRET_FORMAT, |id, text| {
                parse_ca_secret(id, text).map(Material::Roots)
            })
            .await?
        {
            Material::Roots(roots) => Ok(roots.clone()),
            Material::Identity { .. } => Err(Error::Misconfiguration(format!(
                "{}: the secret {} is also the client certificate's secret",
                env::TLS_CA_SECRET_ARN,
                self.secret_id
            ))),
        }
    }

    /// The certificate chain and key of a [`KafkaConfig::tls_client_secret`].
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
            Material::Roots(_) => Err(Error::Misconfiguration(format!(
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
        Error::Misconfiguration(format!(
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
        Error::Misconfiguration(format!(
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

/// The rustls client configuration `config` asks for (its `tls` must be on); the secrets it
/// names are read on the first call (once per process).
pub(crate) async fn client_config(config: &KafkaConfig) -> Result<Arc<rustls::ClientConfig>> {
    let roots = match (&config.tls_ca_file, &config.tls_ca_secret) {
        (Some(path), _) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(env::TLS_CA_FILE, path)? {
                roots.add(cert).map_err(|e| {
                    bad(
                        env::TLS_CA_FILE,
                        path,
                        &format!("holds a certificate that is not a usable CA: {e}"),
                    )
                })?;
            }
            roots
        }
        (None, Some(secret)) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in secret.roots().await? {
                roots.add(cert).map_err(|e| {
                    Error::Misconfiguration(format!(
                        "{}: the secret {} holds a certificate that is not a usable CA: {e}",
                        env::TLS_CA_SECRET_ARN,
                        secret.secret_id
                    ))
                })?;
            }
            roots
        }
        (None, None) => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Misconfiguration(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = match (
        &config.tls_cert_file,
        &config.tls_key_file,
        &config.tls_client_secret,
    ) {
        (Some(cert_path), Some(key_path), _) => {
            let chain = read_certs(env::TLS_CERT_FILE, cert_path)?;
            let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
                bad(
                    env::TLS_KEY_FILE,
                    key_path,
                    &format!("has no usable PEM private key ({})", pem_error(&e)),
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                bad(
                    env::TLS_KEY_FILE,
                    key_path,
                    &format!(
                        "does not go with the certificate of {} ({e})",
                        env::TLS_CERT_FILE
                    ),
                )
            })?
        }
        (_, _, Some(secret)) => {
            let (chain, key) = secret.identity().await?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                Error::Misconfiguration(format!(
                    "{}: the secret {}: its \"privateKey\" does not go with its \"certificate\" ({e})",
                    env::TLS_CLIENT_SECRET_ARN,
                    secret.secret_id
                ))
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The system's trusted roots (what Lambda's runtime and most machines ship).
pub(crate) fn system_roots() -> Result<rustls::RootCertStore> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(Error::Misconfiguration(format!(
            "KAFKA_TLS: no trusted root certificates found on this system ({} errors while \
             loading); name a PEM bundle in {}",
            found.errors.len(),
            env::TLS_CA_FILE
        )));
    }
    Ok(roots)
}

fn bad(variable: &str, path: &Path, rule: &str) -> Error {
    Error::Misconfiguration(format!("{variable}: {}: {rule}", path.display()))
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
        return Err(bad(variable, path, &format!("cannot be read ({e})")));
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

/// The subject of the client certificate `config` names, for the publisher's principal:
/// `None` without one (TLS off, or no client certificate), else its leaf's subject as
/// [`subject_rfc2253`] writes it (`Some(None)` when it cannot be read). Read as the connect
/// read it: the file again, or what was kept of the secret.
pub(crate) async fn client_subject(config: &KafkaConfig) -> Option<Option<String>> {
    if !config.tls {
        return None;
    }
    let leaf = match (&config.tls_cert_file, &config.tls_client_secret) {
        (Some(path), _) => read_certs(env::TLS_CERT_FILE, path)
            .ok()
            .and_then(|chain| chain.into_iter().next()),
        (None, Some(secret)) => secret
            .identity()
            .await
            .ok()
            .and_then(|(chain, _)| chain.into_iter().next()),
        (None, None) => return None,
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
        let mut config = KafkaConfig::new(["h:1"]);
        config.tls = true;
        client_config(&config).await.unwrap();
    }

    #[tokio::test]
    async fn unreadable_or_empty_files_name_the_variable() {
        let mut config = KafkaConfig::new(["h:1"]);
        config.tls = true;
        config.tls_ca_file = Some("/nonexistent/ca.pem".into());
        let e = client_config(&config).await.unwrap_err().to_string();
        assert!(
            e.starts_with(
                "misconfiguration: KAFKA_TLS_CA_FILE: /nonexistent/ca.pem: cannot be read ("
            ),
            "{e}"
        );
        let empty = with_file("ca.pem", "not a certificate\n");
        config.tls_ca_file = Some(empty.clone());
        let e = client_config(&config).await.unwrap_err().to_string();
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
        let mut config = KafkaConfig::new(["h:1"]);
        config.tls = true;
        config.tls_ca_secret = Some(TlsSecret::ca_read("arn:ca", &ca).unwrap());
        config.tls_client_secret =
            Some(TlsSecret::client_read(ARN, &client_json(&cert, &key)).unwrap());
        config.validate().unwrap();
        let rustls = client_config(&config).await.unwrap();
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
            let mut config = KafkaConfig::new(["h:1"]);
            config.tls = true;
            config.tls_cert_file = Some(with_file("cert.pem", &cert));
            let key_path = with_file("key.pem", &joined);
            config.tls_key_file = Some(key_path.clone());
            let e = client_config(&config).await.unwrap_err().to_string();
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
        let mut config = KafkaConfig::new(["h:1"]);
        config.tls = true;
        config.tls_client_secret =
            Some(TlsSecret::client_read(ARN, &client_json(&cert, &other_key)).unwrap());
        let e = client_config(&config).await.unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "misconfiguration: KAFKA_TLS_CLIENT_SECRET_ARN: the secret {ARN}: its \
                 \"privateKey\" does not go with its \"certificate\" ("
            )),
            "{e}"
        );
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
    fn debug_of_a_config_with_a_read_key_holds_no_key_bytes() {
        let (ca, cert, key) = pki();
        let mut config = KafkaConfig::new(["h:1"]);
        config.auth = crate::publish::KafkaAuth::Mtls;
        config.tls = true;
        config.tls_ca_secret = Some(TlsSecret::ca_read("arn:ca", &ca).unwrap());
        config.tls_client_secret =
            Some(TlsSecret::client_read(ARN, &client_json(&cert, &key)).unwrap());
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
        let mut config = KafkaConfig::new(["h:1"]);
        config.tls = true;
        assert_eq!(client_subject(&config).await, None);
        config.tls_client_secret =
            Some(TlsSecret::client_read(ARN, &client_json(&pem, &key)).unwrap());
        let expected = Some(Some("CN=rcgen self signed cert".to_owned()));
        assert_eq!(client_subject(&config).await, expected);
        config.tls_client_secret = None;
        config.tls_cert_file = Some(with_file("client.crt", &pem));
        config.tls_key_file = Some(with_file("client.key", &key));
        assert_eq!(client_subject(&config).await, expected);
        config.tls = false;
        assert_eq!(client_subject(&config).await, None);
    }
}
