//! TLS to a broker for real: a TLS endpoint in front of the local broker (tansu), with a CA,
//! a server certificate and client certificates made here (rcgen), and the publisher's
//! `KAFKA_TLS_CA_FILE`, `KAFKA_TLS_CERT_FILE` and `KAFKA_TLS_KEY_FILE`, or the secrets of
//! `KAFKA_TLS_CA_SECRET_ARN` and `KAFKA_TLS_CLIENT_SECRET_ARN` (with `KAFKA_AUTH=mtls`)
//! in the stack's moto server.
//!
//! The endpoint is a small rustls proxy: it terminates TLS and forwards each Kafka frame to
//! tansu's plaintext listener. tansu advertises its own plaintext address in metadata, and
//! rskafka uses the bootstrap address only for its first metadata request: every broker
//! connection after that (the controller, the partition leaders) goes to the advertised
//! address. So the proxy rewrites the broker addresses of every Metadata response (the
//! versions rskafka speaks, v0 to v4) to its own, as a TLS listener's advertised address
//! would be; the client then reconnects through the proxy, never to tansu directly (with
//! TLS on, it could not talk to the plaintext port at all). The proxy records the API keys
//! it forwarded, so a test sees that the produce requests themselves went through TLS.
//! The records are read back by the independent client (confluent-kafka) straight from
//! tansu.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_outbox::protocol::schema::StoredMessage;
use dynamo_outbox::publish::env;
use dynamo_outbox::publish::{KafkaConfig, KafkaPublisher, Publisher};
use dynamo_outbox::OutboxMessage;
use outbox_testkit::{random_name, read_topic, stack_var};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PRODUCE: i16 = 0;
const METADATA: i16 = 3;

/// A CA: its certificate and key.
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

    /// A leaf certificate for `names` (IP addresses become IP SANs), for a server or a
    /// client.
    fn issue(
        &self,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> (rcgen::Certificate, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or("leaf"));
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert, key)
    }
}

/// The files of one test: the trusted CA, another CA, a client certificate and key.
struct Pki {
    dir: PathBuf,
    ca: Ca,
    server: (rcgen::Certificate, KeyPair),
}

impl Pki {
    fn new() -> Pki {
        let dir = std::env::temp_dir().join(random_name("outbox-tls"));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = Ca::new("outbox test CA");
        let server = ca.issue(
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let pki = Pki { dir, ca, server };
        pki.write("ca.pem", &pki.ca.cert.pem());
        pki
    }

    fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A client certificate issued by `ca`, written as `{name}.pem` and `{name}.key`.
    fn client_files(&self, ca: &Ca, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = ca.issue(&[name], ExtendedKeyUsagePurpose::ClientAuth);
        (
            self.write(&format!("{name}.pem"), &cert.pem()),
            self.write(&format!("{name}.key"), &key.serialize_pem()),
        )
    }

    /// The proxy's rustls configuration: its server certificate, and with `client_ca`
    /// a client certificate issued by it required.
    fn server_config(&self, client_ca: Option<&Ca>) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca.cert.der().clone()).unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let chain: Vec<CertificateDer<'static>> = vec![self.server.0.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server.1.serialize_der()));
        Arc::new(builder.with_single_cert(chain, key).unwrap())
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The TLS endpoint in front of tansu.
struct TlsProxy {
    address: String,
    /// API keys of the requests forwarded, in order.
    forwarded: Arc<Mutex<Vec<i16>>>,
    /// Why handshakes failed, as the proxy saw it.
    refused: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsProxy {
    async fn start(config: Arc<rustls::ServerConfig>) -> TlsProxy {
        let upstream = stack_var("KAFKA_BOOTSTRAP_SERVERS");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let forwarded = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let (fwd, refs) = (forwarded.clone(), refused.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, upstream, fwd, refs) = (
                    acceptor.clone(),
                    upstream.clone(),
                    fwd.clone(),
                    refs.clone(),
                );
                tokio::spawn(async move {
                    let tls = match acceptor.accept(tcp).into_fallible().await {
                        Ok(tls) => tls,
                        Err((e, mut tcp)) => {
                            refs.lock().unwrap().push(e.to_string());
                            // keep the socket open until the client hangs up: closing it
                            // with the client's request unread would reset the connection,
                            // and a reset can discard the alert before the client reads it
                            let mut sink = [0u8; 4096];
                            let drain = async {
                                while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
                            };
                            let _ = tokio::time::timeout(Duration::from_secs(10), drain).await;
                            return;
                        }
                    };
                    let Ok(broker) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    relay(tls, broker, port, fwd).await;
                });
            }
        });
        TlsProxy {
            address: format!("127.0.0.1:{port}"),
            forwarded,
            refused,
            task,
        }
    }
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let len = r.read_i32().await?;
    let mut frame = vec![0u8; len.max(0) as usize];
    r.read_exact(&mut frame).await?;
    Ok(frame)
}

async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> std::io::Result<()> {
    w.write_all(&(frame.len() as i32).to_be_bytes()).await?;
    w.write_all(frame).await?;
    w.flush().await
}

/// Forwards frames both ways until either side closes, rewriting Metadata responses.
async fn relay(
    client: tokio_rustls::server::TlsStream<TcpStream>,
    broker: TcpStream,
    proxy_port: u16,
    forwarded: Arc<Mutex<Vec<i16>>>,
) {
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut broker_read, mut broker_write) = broker.into_split();
    // correlation id -> (api key, version) of the requests in flight
    let pending: Arc<Mutex<HashMap<i32, (i16, i16)>>> = Arc::default();
    let requests = {
        let pending = pending.clone();
        async move {
            while let Ok(frame) = read_frame(&mut client_read).await {
                if frame.len() < 8 {
                    return;
                }
                let key = i16::from_be_bytes([frame[0], frame[1]]);
                let version = i16::from_be_bytes([frame[2], frame[3]]);
                let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
                pending.lock().unwrap().insert(correlation, (key, version));
                forwarded.lock().unwrap().push(key);
                if write_frame(&mut broker_write, &frame).await.is_err() {
                    return;
                }
            }
        }
    };
    let responses = async move {
        while let Ok(frame) = read_frame(&mut broker_read).await {
            if frame.len() < 4 {
                return;
            }
            let correlation = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
            let request = pending.lock().unwrap().remove(&correlation);
            let frame = match request {
                Some((METADATA, version)) => rewrite_metadata(&frame, version, proxy_port),
                _ => frame,
            };
            if write_frame(&mut client_write, &frame).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = responses => {}
    }
}

/// A Metadata response (v0 to v8: not flexible) with every broker's address replaced by
/// the proxy's: `[throttle_time_ms (v3+)] brokers: [node_id host port rack (v1+)] ...`.
fn rewrite_metadata(frame: &[u8], version: i16, port: u16) -> Vec<u8> {
    assert!(
        version <= 8,
        "Metadata v{version} is flexible: the proxy does not rewrite it"
    );
    let i16_at = |at: usize| i16::from_be_bytes([frame[at], frame[at + 1]]);
    let i32_at =
        |at: usize| i32::from_be_bytes([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]]);
    let mut out = frame[..4].to_vec(); // correlation id
    let mut at = 4;
    if version >= 3 {
        out.extend_from_slice(&frame[at..at + 4]);
        at += 4;
    }
    let brokers = i32_at(at);
    out.extend_from_slice(&frame[at..at + 4]);
    at += 4;
    for _ in 0..brokers.max(0) {
        out.extend_from_slice(&frame[at..at + 4]); // node id
        at += 4;
        at += 2 + i16_at(at) as usize; // the broker's host
        let host = "127.0.0.1";
        out.extend_from_slice(&(host.len() as i16).to_be_bytes());
        out.extend_from_slice(host.as_bytes());
        at += 4; // the broker's port
        out.extend_from_slice(&i32::from(port).to_be_bytes());
        if version >= 1 {
            let rack = i16_at(at);
            let len = 2 + rack.max(0) as usize;
            out.extend_from_slice(&frame[at..at + len]);
            at += len;
        }
    }
    out.extend_from_slice(&frame[at..]);
    out
}

/// The publisher's configuration for `proxy`, as the relay reads it from the environment.
fn config(proxy: &TlsProxy, vars: &[(&str, &Path)]) -> KafkaConfig {
    let mut all: Vec<(&str, String)> = vec![(env::BOOTSTRAP_SERVERS, proxy.address.clone())];
    all.extend(vars.iter().map(|(k, v)| (*k, v.display().to_string())));
    let mut config = KafkaConfig::from_lookup(|name| {
        all.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    })
    .expect("a valid configuration");
    assert!(config.tls, "TLS files turn TLS on");
    // a failed handshake is not retried for long
    config.retry_budget = Duration::from_secs(1);
    config
}

async fn connect(config: KafkaConfig) -> dynamo_outbox::Result<KafkaPublisher> {
    KafkaPublisher::connect(
        config,
        tokio::time::Instant::now() + Duration::from_secs(30),
    )
    .await
}

/// Creates a topic through `publisher`, publishes three messages to it, and checks that
/// the proxy forwarded the produce requests and that confluent-kafka reads them back.
async fn publish_and_read_back(publisher: &KafkaPublisher, proxy: &TlsProxy) {
    let topic = random_name("tls");
    // bounded here: rskafka's controller connection has no timeout of its own, and a TLS
    // client talking to a plaintext port (the advertised address, were it not rewritten)
    // waits forever
    let created = tokio::time::timeout(
        Duration::from_secs(30),
        publisher.create_topic(&topic, 1, 1),
    )
    .await
    .expect("creating the topic through the TLS endpoint timed out");
    assert!(created.unwrap());
    let batch: Vec<StoredMessage> = (0..3)
        .map(|i| StoredMessage {
            bucket: 0,
            sequence: i + 1,
            message: OutboxMessage::new(&topic, 8)
                .with_key(format!("k{i}"))
                .with_value(format!("over TLS {i}")),
        })
        .collect();
    let outcome = publisher.publish(&batch).await;
    assert_eq!(outcome.acknowledged, 3, "{:?}", outcome.error);
    assert!(
        proxy.forwarded.lock().unwrap().contains(&PRODUCE),
        "the produce requests did not go through the TLS endpoint"
    );
    let read = tokio::task::spawn_blocking(move || read_topic(&topic))
        .await
        .unwrap();
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

#[tokio::test]
async fn publishing_through_tls_with_a_ca_file_works_and_confluent_reads_it_back() {
    let pki = Pki::new();
    let proxy = TlsProxy::start(pki.server_config(None)).await;
    let publisher = connect(config(&proxy, &[(env::TLS_CA_FILE, &pki.ca_file())]))
        .await
        .expect("connect through TLS with the test CA");
    publish_and_read_back(&publisher, &proxy).await;
    assert!(proxy.refused.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_broker_certificate_from_another_ca_is_refused_with_a_clear_error() {
    let pki = Pki::new();
    let proxy = TlsProxy::start(pki.server_config(None)).await;
    let other = Ca::new("some other CA");
    let other_file = pki.write("other-ca.pem", &other.cert.pem());
    let err = connect(config(&proxy, &[(env::TLS_CA_FILE, &other_file)]))
        .await
        .expect_err("the broker's certificate is not from that CA");
    assert_eq!(
        err.to_string(),
        format!(
            "kafka: TLS with the brokers failed: their certificate is not trusted \
             (UnknownIssuer) by the roots of KAFKA_TLS_CA_FILE ({})",
            other_file.display()
        )
    );
    assert!(!err.is_retryable());
    // the CA file replaces the system roots, which do not know the test CA either
    let mut system_roots = KafkaConfig::new([proxy.address.clone()]);
    system_roots.tls = true;
    system_roots.retry_budget = Duration::from_secs(1);
    let err = connect(system_roots)
        .await
        .expect_err("the system roots do not know the test CA");
    assert_eq!(
        err.to_string(),
        "kafka: TLS with the brokers failed: their certificate is not trusted (UnknownIssuer) \
         by the system's roots (KAFKA_TLS_CA_FILE and KAFKA_TLS_CA_SECRET_ARN are unset)"
    );
    // nothing reached the broker
    assert!(proxy.forwarded.lock().unwrap().is_empty());
}

#[tokio::test]
async fn mutual_tls_refuses_a_missing_or_foreign_client_certificate_and_accepts_the_right_one() {
    let pki = Pki::new();
    let client_ca = Ca::new("outbox test client CA");
    let proxy = TlsProxy::start(pki.server_config(Some(&client_ca))).await;
    let ca_file = pki.ca_file();

    // no client certificate
    let err = connect(config(&proxy, &[(env::TLS_CA_FILE, &ca_file)]))
        .await
        .expect_err("the endpoint requires a client certificate");
    assert_eq!(
        err.to_string(),
        "kafka: TLS with the brokers failed: they require a client certificate (alert \
         CertificateRequired): set KAFKA_TLS_CLIENT_SECRET_ARN (or KAFKA_TLS_CERT_FILE and \
         KAFKA_TLS_KEY_FILE)"
    );
    assert!(!err.is_retryable());
    let refused = proxy.refused.lock().unwrap().clone();
    assert!(
        refused
            .iter()
            .any(|r| r.contains("peer sent no certificates")),
        "{refused:?}"
    );

    // a client certificate from a CA the endpoint does not trust
    let (cert, key) = pki.client_files(&Ca::new("a stranger's CA"), "stranger");
    let err = connect(config(
        &proxy,
        &[
            (env::TLS_CA_FILE, &ca_file),
            (env::TLS_CERT_FILE, &cert),
            (env::TLS_KEY_FILE, &key),
        ],
    ))
    .await
    .expect_err("a foreign client certificate");
    assert!(
        err.to_string().starts_with(&format!(
            "kafka: TLS with the brokers failed: they refused the client certificate of \
             KAFKA_TLS_CERT_FILE ({}) (alert ",
            cert.display()
        )),
        "{err}"
    );
    assert!(proxy.forwarded.lock().unwrap().is_empty());

    // the client certificate the endpoint trusts: publishing works
    let (cert, key) = pki.client_files(&client_ca, "outbox-relay");
    let publisher = connect(config(
        &proxy,
        &[
            (env::TLS_CA_FILE, &ca_file),
            (env::TLS_CERT_FILE, &cert),
            (env::TLS_KEY_FILE, &key),
        ],
    ))
    .await
    .expect("connect with the trusted client certificate");
    publish_and_read_back(&publisher, &proxy).await;
}

#[tokio::test]
async fn a_key_that_does_not_match_the_certificate_is_a_clear_error() {
    let pki = Pki::new();
    let (cert, _) = pki.client_files(&pki.ca, "one");
    let (_, other_key) = pki.client_files(&pki.ca, "two");
    let proxy = TlsProxy::start(pki.server_config(None)).await;
    let err = connect(config(
        &proxy,
        &[
            (env::TLS_CA_FILE, &pki.ca_file()),
            (env::TLS_CERT_FILE, &cert),
            (env::TLS_KEY_FILE, &other_key),
        ],
    ))
    .await
    .expect_err("the key is another certificate's");
    assert!(
        err.to_string().starts_with(&format!(
            "misconfiguration: KAFKA_TLS_KEY_FILE: {}: does not go with the certificate of \
             KAFKA_TLS_CERT_FILE (",
            other_key.display()
        )),
        "{err}"
    );
    let not_a_key = pki.write("empty.key", "no key here\n");
    let err = connect(config(
        &proxy,
        &[
            (env::TLS_CA_FILE, &pki.ca_file()),
            (env::TLS_CERT_FILE, &cert),
            (env::TLS_KEY_FILE, &not_a_key),
        ],
    ))
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

/// A client certificate issued by `ca` as the JSON of `KAFKA_TLS_CLIENT_SECRET_ARN`, and
/// its key's PEM.
fn client_secret_json(ca: &Ca, name: &str) -> (String, String) {
    let (cert, key) = ca.issue(&[name], ExtendedKeyUsagePurpose::ClientAuth);
    let key = key.serialize_pem();
    (
        serde_json::json!({"certificate": cert.pem(), "privateKey": key}).to_string(),
        key,
    )
}

/// The relay's configuration for `proxy` with `KAFKA_AUTH=mtls` and the CA and client
/// certificate from secrets, as it reads them from the environment.
fn mtls_config(proxy: &TlsProxy, ca_secret: &str, client_secret: &str) -> KafkaConfig {
    let vars = [
        (env::BOOTSTRAP_SERVERS, proxy.address.as_str()),
        (env::AUTH, "mtls"),
        (env::TLS_CA_SECRET_ARN, ca_secret),
        (env::TLS_CLIENT_SECRET_ARN, client_secret),
    ];
    let mut config = KafkaConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    })
    .expect("a valid configuration");
    config.retry_budget = Duration::from_secs(1);
    config
}

#[tokio::test]
async fn mutual_tls_with_the_ca_certificate_and_key_from_secrets_publishes() {
    let pki = Pki::new();
    let client_ca = Ca::new("outbox test client CA");
    let proxy = TlsProxy::start(pki.server_config(Some(&client_ca))).await;
    let ca_secret = create_secret(&pki.ca.cert.pem()).await;

    // a client certificate from a CA the endpoint does not trust
    let (foreign, _) = client_secret_json(&Ca::new("a stranger's CA"), "stranger");
    let foreign_secret = create_secret(&foreign).await;
    let err = connect(mtls_config(&proxy, &ca_secret, &foreign_secret))
        .await
        .expect_err("a foreign client certificate");
    assert!(
        err.to_string().starts_with(&format!(
            "kafka: TLS with the brokers failed: they refused the client certificate of \
             KAFKA_TLS_CLIENT_SECRET_ARN ({foreign_secret}) (alert "
        )),
        "{err}"
    );
    assert!(proxy.forwarded.lock().unwrap().is_empty());

    // the trusted one: read from moto, given to rustls from memory
    let (json, key) = client_secret_json(&client_ca, "outbox-relay");
    let client_secret = create_secret(&json).await;
    let config = mtls_config(&proxy, &ca_secret, &client_secret);
    let publisher = connect(config.clone())
        .await
        .expect("connect with the client certificate from the secret");
    publish_and_read_back(&publisher, &proxy).await;
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
    let pki = Pki::new();
    let proxy = TlsProxy::start(pki.server_config(None)).await;
    let secret = create_secret("{\"ca\": \"not PEM\"}").await;
    let vars = [
        (env::BOOTSTRAP_SERVERS, proxy.address.clone()),
        (env::TLS_CA_SECRET_ARN, secret.clone()),
    ];
    let config = KafkaConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap();
    let err = connect(config)
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
