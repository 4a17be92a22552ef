//! TLS to the brokers: the trusted roots (the system's, or the PEM bundle of
//! `KAFKA_TLS_CA_FILE` instead) and the client certificate (`KAFKA_TLS_CERT_FILE` and
//! `KAFKA_TLS_KEY_FILE`, for MSK's mutual TLS), on rustls' ring provider.
//!
//! A CA file replaces the system roots, as librdkafka's `ssl.ca.location` and a Java
//! truststore do: a cluster with a private CA is then trusted through that CA only, and a
//! certificate from a public CA is not. For MSK with a public CA leave it unset; for a
//! private CA (MSK with ACM Private CA, self-hosted clusters) put the whole chain's roots
//! in the file.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::config::KafkaConfig;
use super::env;
use crate::error::{Error, Result};

/// The rustls client configuration `config` asks for (its `tls` must be on).
pub(crate) fn client_config(config: &KafkaConfig) -> Result<Arc<rustls::ClientConfig>> {
    let roots = match &config.tls_ca_file {
        Some(path) => {
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
        None => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Misconfiguration(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert_path), Some(key_path)) => {
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

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM item of that kind".into(),
        other => format!("{other:?}"),
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

    #[test]
    fn system_roots_when_no_ca_file() {
        // the machine running the tests has a CA bundle, as Lambda's runtime does
        let mut config = KafkaConfig::new(["h:1"]);
        config.tls = true;
        client_config(&config).unwrap();
    }

    #[test]
    fn unreadable_or_empty_files_name_the_variable() {
        let mut config = KafkaConfig::new(["h:1"]);
        config.tls = true;
        config.tls_ca_file = Some("/nonexistent/ca.pem".into());
        let e = client_config(&config).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "misconfiguration: KAFKA_TLS_CA_FILE: /nonexistent/ca.pem: cannot be read ("
            ),
            "{e}"
        );
        let empty = with_file("ca.pem", "not a certificate\n");
        config.tls_ca_file = Some(empty.clone());
        let e = client_config(&config).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "misconfiguration: KAFKA_TLS_CA_FILE: {}: holds no PEM certificate \
                 (-----BEGIN CERTIFICATE-----)",
                empty.display()
            )
        );
    }
}
