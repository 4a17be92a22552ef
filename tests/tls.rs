//! Mutual TLS with the stack's Apache Kafka, for real: its SSL listener
//! (`OUTBOX_KAFKA_SSL`: a client certificate required, the principal its subject, `User:CN=NAME`)
//! with the stack's CA and client certificates (`OUTBOX_KAFKA_TLS_DIR`), given to the
//! publisher as files (`KAFKA_TLS_CA_FILE`, `KAFKA_TLS_CERT_FILE`, `KAFKA_TLS_KEY_FILE`) or
//! as secrets in the stack's moto server (`KAFKA_TLS_CA_SECRET_ARN`,
//! `KAFKA_TLS_CLIENT_SECRET_ARN`), read through `KafkaConfig::from_lookup` as the relay
//! reads its environment. A CA the broker does not know, and client certificates it did
//! not issue, are made here (rcgen).
//!
//! The publisher bootstraps from the SSL listener, and the broker advertises that listener
//! in the metadata it answers there: every connection of the publisher is TLS to the
//! broker itself. Topics are created and read back by the independent client
//! (confluent-kafka) on the stack's PLAINTEXT listener.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dynamo_outbox::message::StoredMessage;
use dynamo_outbox::publish::env;
use dynamo_outbox::publish::{KafkaAuth, KafkaConfig, KafkaPublisher, Publisher};
use dynamo_outbox::OutboxMessage;
use outbox_testkit::kafka::{grant_topic, SecureListeners};
use outbox_testkit::{create_topic, random_name, read_topic, stack_var};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A CA the stack's broker does not know: its certificate and key.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A client certificate for `cn`, and its key (PKCS#8 PEM).
    fn client(&self, cn: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A directory of files written by one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(random_name("outbox-tls"));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The publisher's configuration from these variables, as the relay reads its
/// environment, with a short retry budget (a refused handshake is not retried for long).
fn config(vars: &[(&str, String)]) -> KafkaConfig {
    let mut config = KafkaConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .expect("a valid configuration");
    assert!(config.tls.is_on(), "TLS files and secrets turn TLS on");
    config.retry_budget = Duration::from_secs(1);
    config
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// `KAFKA_AUTH=mtls` to the SSL listener with the client certificate files of `user`
/// (`outbox` or `nogrant`) and the CA file `ca`.
fn mtls_files(listeners: &SecureListeners, ca: &Path, user: &str) -> KafkaConfig {
    config(&[
        (env::BOOTSTRAP_SERVERS, listeners.ssl.clone()),
        (env::AUTH, "mtls".into()),
        (env::TLS_CA_FILE, path(ca)),
        (env::TLS_CERT_FILE, path(&listeners.cert_file(user))),
        (env::TLS_KEY_FILE, path(&listeners.key_file(user))),
    ])
}

const DEADLINE: Duration = Duration::from_secs(30);

async fn connect(config: KafkaConfig) -> dynamo_outbox::Result<KafkaPublisher> {
    KafkaPublisher::connect(config, tokio::time::Instant::now() + DEADLINE).await
}

/// A fresh topic (one partition), created by the independent client.
async fn fresh_topic() -> String {
    let topic = random_name("tls");
    let t = topic.clone();
    tokio::task::spawn_blocking(move || create_topic(&t, 1))
        .await
        .unwrap();
    topic
}

/// Three messages for `topic`, in one bucket's order.
fn batch(topic: &str) -> Vec<StoredMessage> {
    (0..3)
        .map(|i| {
            StoredMessage::new(
                0,
                i + 1,
                OutboxMessage::new(topic, 8)
                    .with_key(format!("k{i}"))
                    .with_value(format!("over TLS {i}")),
            )
        })
        .collect()
}

/// Every record of `topic`, read by the independent client.
async fn read_topic_now(topic: &str) -> Vec<outbox_testkit::ReadRecord> {
    let t = topic.to_owned();
    tokio::task::spawn_blocking(move || read_topic(&t))
        .await
        .unwrap()
}

/// Checks that the independent reader finds exactly `batch` in `topic`: the values and
/// the message ids, in order.
async fn assert_read_back(topic: &str, batch: &[StoredMessage]) {
    let read = read_topic_now(topic).await;
    let values: Vec<Vec<u8>> = read.iter().filter_map(|r| r.value_bytes()).collect();
    assert_eq!(
        values,
        (0..3)
            .map(|i| format!("over TLS {i}").into_bytes())
            .collect::<Vec<_>>()
    );
    let ids: Vec<String> = read.iter().filter_map(|r| r.message_id()).collect();
    let written: Vec<String> = batch
        .iter()
        .map(|m| m.message.message_id.to_string())
        .collect();
    assert_eq!(ids, written);
}

/// Publishes three messages to a fresh topic through `publisher` and checks that the
/// independent reader reads them back.
async fn publish_and_read_back(publisher: &KafkaPublisher) {
    let topic = fresh_topic().await;
    let batch = batch(&topic);
    let outcome = publisher.publish(&batch).await;
    assert_eq!(outcome.acknowledged, 3, "{:?}", outcome.error);
    assert_read_back(&topic, &batch).await;
}

#[tokio::test]
async fn mutual_tls_with_certificate_files_publishes_and_the_reader_reads_it_back() {
    let listeners = SecureListeners::from_stack();
    let config = mtls_files(&listeners, &listeners.ca_file, "outbox");
    assert_eq!(config.auth, KafkaAuth::Mtls);
    let publisher = connect(config)
        .await
        .expect("connect to the SSL listener with the outbox certificate");
    publish_and_read_back(&publisher).await;
}

#[tokio::test]
async fn a_broker_certificate_from_a_ca_not_trusted_is_refused_naming_the_setting() {
    let listeners = SecureListeners::from_stack();
    let scratch = Scratch::new();
    let other = scratch.write("other-ca.pem", &Ca::new("some other CA").cert.pem());
    let err = connect(mtls_files(&listeners, &other, "outbox"))
        .await
        .expect_err("the broker's certificate is not from that CA");
    assert_eq!(
        err.to_string(),
        format!(
            "kafka: TLS with the brokers failed: their certificate is not trusted \
             (UnknownIssuer) by the roots of KAFKA_TLS_CA_FILE ({})",
            other.display()
        )
    );
    assert!(!err.is_retryable());

    // without a CA file the system's roots decide, and they do not know the stack's CA
    let err = connect(config(&[
        (env::BOOTSTRAP_SERVERS, listeners.ssl.clone()),
        (env::AUTH, "mtls".into()),
        (env::TLS_CERT_FILE, path(&listeners.cert_file("outbox"))),
        (env::TLS_KEY_FILE, path(&listeners.key_file("outbox"))),
    ]))
    .await
    .expect_err("the system roots do not know the stack's CA");
    assert_eq!(
        err.to_string(),
        "kafka: TLS with the brokers failed: their certificate is not trusted (UnknownIssuer) \
         by the system's roots (KAFKA_TLS_CA_FILE and KAFKA_TLS_CA_SECRET_ARN are unset)"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn the_broker_refuses_a_missing_or_foreign_client_certificate() {
    let listeners = SecureListeners::from_stack();
    let scratch = Scratch::new();

    // TLS with the stack's CA but no client certificate (no KAFKA_AUTH: mtls would refuse
    // the configuration before any broker is reached)
    let err = connect(config(&[
        (env::BOOTSTRAP_SERVERS, listeners.ssl.clone()),
        (env::TLS_CA_FILE, path(&listeners.ca_file)),
    ]))
    .await
    .expect_err("the SSL listener requires a client certificate");
    // Java's TLS 1.3 server refuses an empty certificate message with bad_certificate
    let text = err.to_string();
    assert!(
        text.starts_with(
            "kafka: TLS with the brokers failed: they require a client certificate \
             (alert BadCertificate): set KAFKA_TLS_CLIENT_SECRET_ARN (or KAFKA_TLS_CERT_FILE \
             and KAFKA_TLS_KEY_FILE)"
        ),
        "{text}"
    );
    assert!(!err.is_retryable());

    // a client certificate from a CA the broker does not trust, with the CN of the
    // principal that may write
    let (cert, key) = Ca::new("a stranger's CA").client("outbox");
    let cert = scratch.write("stranger.crt", &cert);
    let key = scratch.write("stranger.key", &key);
    let err = connect(config(&[
        (env::BOOTSTRAP_SERVERS, listeners.ssl.clone()),
        (env::AUTH, "mtls".into()),
        (env::TLS_CA_FILE, path(&listeners.ca_file)),
        (env::TLS_CERT_FILE, path(&cert)),
        (env::TLS_KEY_FILE, path(&key)),
    ]))
    .await
    .expect_err("a client certificate the broker did not issue");
    assert!(
        err.to_string().starts_with(&format!(
            "kafka: TLS with the brokers failed: they refused the client certificate of \
             KAFKA_TLS_CERT_FILE ({}) (alert ",
            cert.display()
        )),
        "{err}"
    );
    assert!(!err.is_retryable());
}

/// The principal is the certificate's distinguished name, as on MSK: `nogrant`'s
/// certificate is accepted, but it may not write until the test grants `User:CN=nogrant`
/// the topic; the same publisher then publishes.
#[tokio::test]
async fn the_certificates_subject_is_the_principal_the_broker_authorizes() {
    let listeners = SecureListeners::from_stack();
    let publisher = connect(mtls_files(&listeners, &listeners.ca_file, "nogrant"))
        .await
        .expect("the nogrant certificate is from the stack's CA");
    let topic = fresh_topic().await;
    let batch = batch(&topic);
    let outcome = publisher.publish(&batch).await;
    assert_eq!(outcome.acknowledged, 0);
    let err = outcome.error.expect("User:CN=nogrant may not write");
    let text = err.to_string();
    assert!(text.contains("nogrant") && text.contains(&topic), "{err:?}");
    assert!(read_topic_now(&topic).await.is_empty());

    let (p, t) = ("User:CN=nogrant".to_owned(), topic.clone());
    tokio::task::spawn_blocking(move || grant_topic(&p, &t))
        .await
        .unwrap()
        .expect("grant the topic");
    let outcome = publisher.publish(&batch).await;
    assert_eq!(outcome.acknowledged, 3, "{:?}", outcome.error);
    assert_read_back(&topic, &batch).await;
}

#[tokio::test]
async fn a_key_that_does_not_match_the_certificate_is_a_clear_error() {
    let listeners = SecureListeners::from_stack();
    let scratch = Scratch::new();
    let vars = |key: &Path| {
        config(&[
            (env::BOOTSTRAP_SERVERS, listeners.ssl.clone()),
            (env::AUTH, "mtls".into()),
            (env::TLS_CA_FILE, path(&listeners.ca_file)),
            (env::TLS_CERT_FILE, path(&listeners.cert_file("outbox"))),
            (env::TLS_KEY_FILE, path(key)),
        ])
    };
    let other_key = listeners.key_file("nogrant");
    let err = connect(vars(&other_key))
        .await
        .expect_err("the key is another certificate's");
    assert_eq!(
        err.to_string(),
        format!(
            "misconfiguration: KAFKA_TLS_KEY_FILE: {}: does not go with the certificate of \
             KAFKA_TLS_CERT_FILE",
            other_key.display()
        )
    );
    // rustls' refusal stays the source
    assert!(
        std::error::Error::source(&err).is_some_and(|s| !s.to_string().is_empty()),
        "{err:?}"
    );
    let not_a_key = scratch.write("empty.key", "no key here\n");
    let err = connect(vars(&not_a_key))
        .await
        .expect_err("no key in the file");
    assert_eq!(
        err.to_string(),
        format!(
            "misconfiguration: KAFKA_TLS_KEY_FILE: {}: has no usable PEM private key (no PEM \
             item of that kind)",
            not_a_key.display()
        )
    );
}

/// A secret in the stack's moto server (`AWS_ENDPOINT_URL_SECRETS_MANAGER`) holding `text`;
/// its ARN.
async fn create_secret(text: &str) -> String {
    stack_var("AWS_ENDPOINT_URL_SECRETS_MANAGER");
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    aws_sdk_secretsmanager::Client::new(&sdk)
        .create_secret()
        .name(random_name("outbox-tls"))
        .secret_string(text)
        .send()
        .await
        .expect("create the secret in moto")
        .arn()
        .expect("moto returns the ARN")
        .to_owned()
}

/// `KAFKA_AUTH=mtls` to the SSL listener with the CA and the client certificate from
/// secrets.
fn mtls_secrets(listeners: &SecureListeners, ca_secret: &str, client_secret: &str) -> KafkaConfig {
    config(&[
        (env::BOOTSTRAP_SERVERS, listeners.ssl.clone()),
        (env::AUTH, "mtls".into()),
        (env::TLS_CA_SECRET_ARN, ca_secret.into()),
        (env::TLS_CLIENT_SECRET_ARN, client_secret.into()),
    ])
}

#[tokio::test]
async fn mutual_tls_with_the_ca_and_client_certificate_from_secrets_publishes() {
    let listeners = SecureListeners::from_stack();
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
    let ca_secret = create_secret(&read(listeners.ca_file.clone())).await;

    // a client certificate from a CA the broker does not trust
    let (cert, key) = Ca::new("a stranger's CA").client("outbox");
    let foreign = serde_json::json!({"certificate": cert, "privateKey": key}).to_string();
    let foreign_secret = create_secret(&foreign).await;
    let err = connect(mtls_secrets(&listeners, &ca_secret, &foreign_secret))
        .await
        .expect_err("a client certificate the broker did not issue");
    assert!(
        err.to_string().starts_with(&format!(
            "kafka: TLS with the brokers failed: they refused the client certificate of \
             KAFKA_TLS_CLIENT_SECRET_ARN ({foreign_secret}) (alert "
        )),
        "{err}"
    );

    // the stack's outbox certificate: read from moto, given to rustls from memory
    let key = read(listeners.key_file("outbox"));
    let json = serde_json::json!({
        "certificate": read(listeners.cert_file("outbox")),
        "privateKey": key,
    })
    .to_string();
    let client_secret = create_secret(&json).await;
    let config = mtls_secrets(&listeners, &ca_secret, &client_secret);
    let publisher = connect(config.clone())
        .await
        .expect("connect with the client certificate from the secret");
    publish_and_read_back(&publisher).await;
    // the clones share what was read; their Debug names the secrets, never the key
    let shown = format!("{config:?} {publisher:?}");
    assert!(shown.contains(&client_secret), "{shown}");
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(
            !shown.contains(line),
            "a line of the private key in {shown}"
        );
    }
}

#[tokio::test]
async fn a_ca_secret_that_is_not_a_pem_bundle_is_a_clear_error() {
    let listeners = SecureListeners::from_stack();
    let secret = create_secret("{\"ca\": \"not PEM\"}").await;
    let err = connect(config(&[
        (env::BOOTSTRAP_SERVERS, listeners.ssl.clone()),
        (env::TLS_CA_SECRET_ARN, secret.clone()),
    ]))
    .await
    .expect_err("no certificate in the secret");
    assert_eq!(
        err.to_string(),
        format!(
            "misconfiguration: KAFKA_TLS_CA_SECRET_ARN: the secret {secret} holds no PEM \
             certificate (-----BEGIN CERTIFICATE-----); it must be a PEM bundle of the trusted \
             CA certificates"
        )
    );
}
