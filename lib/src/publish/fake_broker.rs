//! A tiny fake Kafka broker for tests of the SASL exchanges: it speaks just enough of the
//! protocol (ApiVersions v0, SaslHandshake v1, SaslAuthenticate v0, Metadata v0) for
//! rskafka to connect, records what the client authenticated with, and checks it:
//!
//! - OAUTHBEARER: any initial response is accepted ([`Auth::Accept`]) or refused
//!   ([`Auth::Refuse`]); the tests check the MSK IAM token in it.
//! - PLAIN (RFC 4616): the message must be exactly `\0username\0password`.
//! - SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): the client-first message must be
//!   exactly `n,,n=<saslname>,r=<nonce>` (no channel binding, no authzid, the username
//!   escaped), the client-final message exactly `c=biws,r=<nonce>,p=<proof>` with the
//!   combined nonce, and the proof must verify against the password with RFC 5802's
//!   algorithm (salted password by PBKDF2, ClientKey, StoredKey, AuthMessage); the server's
//!   signature goes back in the server-final message, which the client checks in turn.
//!
//! A refused exchange is answered as Kafka does: `SASL_AUTHENTICATION_FAILED` with a
//! message. The local broker (tansu) has no SASL, and MSK is not reachable from tests.

use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ring::{digest, hmac, pbkdf2};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const API_VERSIONS: i16 = 18;
const METADATA: i16 = 3;
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const UNSUPPORTED_VERSION: i16 = 35;
const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// The SCRAM iteration count the fake announces (Kafka's minimum for SCRAM-SHA-256/512).
pub(crate) const SCRAM_ITERATIONS: u32 = 4096;

/// A SCRAM hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scram {
    Sha256,
    Sha512,
}

impl Scram {
    fn mechanism(self) -> &'static str {
        match self {
            Scram::Sha256 => "SCRAM-SHA-256",
            Scram::Sha512 => "SCRAM-SHA-512",
        }
    }
    fn hmac(self) -> hmac::Algorithm {
        match self {
            Scram::Sha256 => hmac::HMAC_SHA256,
            Scram::Sha512 => hmac::HMAC_SHA512,
        }
    }
    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Scram::Sha256 => &digest::SHA256,
            Scram::Sha512 => &digest::SHA512,
        }
    }
    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            Scram::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Scram::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }
    fn len(self) -> usize {
        self.digest().output_len()
    }
}

/// How the fake answers authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Auth {
    /// OAUTHBEARER: accept any initial response.
    Accept,
    /// OAUTHBEARER: refuse with `SASL_AUTHENTICATION_FAILED`.
    Refuse,
    /// PLAIN with this user.
    Plain { username: String, password: String },
    /// SCRAM with this user (the broker's stored credentials derive from the password).
    Scram {
        hash: Scram,
        username: String,
        password: String,
    },
    /// SCRAM as [`Auth::Scram`], but the server-final message carries a forged server
    /// signature (a broker that does not know the password): the client must refuse it.
    ScramForgedServer { hash: Scram, username: String },
}

impl Auth {
    fn mechanism(&self) -> &'static str {
        match self {
            Auth::Accept | Auth::Refuse => "OAUTHBEARER",
            Auth::Plain { .. } => "PLAIN",
            Auth::Scram { hash, .. } | Auth::ScramForgedServer { hash, .. } => hash.mechanism(),
        }
    }
}

/// What the fake concluded about one authentication exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accepted,
    /// Refused, and why (a message for the test, not the client).
    Refused(String),
}

/// A running fake broker.
#[derive(Debug)]
pub(crate) struct FakeBroker {
    /// `127.0.0.1:port`.
    pub(crate) address: String,
    /// The SASL mechanisms clients asked for, in order.
    pub(crate) mechanisms: Arc<Mutex<Vec<String>>>,
    /// The SASL authentication bytes clients sent, in order.
    pub(crate) auth_bytes: Arc<Mutex<Vec<Vec<u8>>>>,
    /// The fake's verdict on each finished exchange, in order.
    pub(crate) verdicts: Arc<Mutex<Vec<Verdict>>>,
    /// API keys of requests received after authentication, in order.
    pub(crate) after_auth: Arc<Mutex<Vec<i16>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, Clone)]
struct State {
    mechanisms: Arc<Mutex<Vec<String>>>,
    auth_bytes: Arc<Mutex<Vec<Vec<u8>>>>,
    verdicts: Arc<Mutex<Vec<Verdict>>>,
    after_auth: Arc<Mutex<Vec<i16>>>,
}

impl FakeBroker {
    pub(crate) async fn start(auth: Auth) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = State {
            mechanisms: Arc::default(),
            auth_bytes: Arc::default(),
            verdicts: Arc::default(),
            after_auth: Arc::default(),
        };
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let state = shared.clone();
                let auth = auth.clone();
                tokio::spawn(async move {
                    let _ = serve(socket, port, &auth, &state).await;
                });
            }
        });
        FakeBroker {
            address: format!("127.0.0.1:{port}"),
            mechanisms: state.mechanisms,
            auth_bytes: state.auth_bytes,
            verdicts: state.verdicts,
            after_auth: state.after_auth,
            task,
        }
    }
}

/// Where a connection's SCRAM exchange is.
enum ScramStage {
    Start,
    /// The server-first message was sent.
    Challenged {
        client_first_bare: String,
        server_first: String,
        nonce: String,
        salt: Vec<u8>,
    },
}

/// What one SaslAuthenticate request gets.
enum Step {
    /// Go on (or finish) with these server bytes.
    Continue(Vec<u8>),
    /// Done: authenticated, with these final server bytes.
    Done(Vec<u8>),
    /// Refused, with this reason (for the test's record).
    Refuse(String),
}

/// Answers one connection's requests, in order, until the client hangs up or sends what
/// the fake does not speak.
async fn serve(
    mut socket: TcpStream,
    port: u16,
    auth: &Auth,
    state: &State,
) -> std::io::Result<()> {
    let mut authenticated = false;
    let mut scram = ScramStage::Start;
    loop {
        let size = socket.read_i32().await? as usize;
        let mut frame = vec![0u8; size];
        socket.read_exact(&mut frame).await?;
        let mut r = Reader(&frame);
        let api_key = r.i16();
        let version = r.i16();
        let correlation_id = r.i32();
        let _client_id = r.string();
        if api_key == API_VERSIONS && version >= 3 {
            r.tagged_fields();
        }
        let body = match (api_key, version) {
            (API_VERSIONS, version) => api_versions(version),
            (SASL_HANDSHAKE, 1) => sasl_handshake(&mut r, auth, state),
            (SASL_AUTHENTICATE, 0) => {
                let (body, done) = sasl_authenticate(&mut r, auth, state, &mut scram);
                authenticated |= done;
                body
            }
            (METADATA, 0) if authenticated => {
                state.after_auth.lock().unwrap().push(api_key);
                metadata(port)
            }
            _ => {
                // anything else (or anything before authentication): hang up, as a broker does
                return Ok(());
            }
        };
        let mut response = Vec::with_capacity(body.len() + 8);
        response.extend(((body.len() + 4) as i32).to_be_bytes());
        response.extend(correlation_id.to_be_bytes());
        response.extend(body);
        socket.write_all(&response).await?;
    }
}

/// The ApiVersions response: v0 lists the four APIs the fake speaks; any other version
/// gets what a real broker sends, a v0 error response (the client tries lower versions).
fn api_versions(version: i16) -> Vec<u8> {
    let mut body = Vec::new();
    if version != 0 {
        body.extend(UNSUPPORTED_VERSION.to_be_bytes());
        body.extend(0i32.to_be_bytes());
        return body;
    }
    body.extend(0i16.to_be_bytes());
    let apis: [(i16, i16, i16); 4] = [
        (API_VERSIONS, 0, 0),
        (METADATA, 0, 0),
        (SASL_HANDSHAKE, 1, 1),
        (SASL_AUTHENTICATE, 0, 0),
    ];
    body.extend((apis.len() as i32).to_be_bytes());
    for (key, min, max) in apis {
        body.extend(key.to_be_bytes());
        body.extend(min.to_be_bytes());
        body.extend(max.to_be_bytes());
    }
    body
}

/// The SaslHandshake v1 response: the one mechanism enabled, and an error when the client
/// asked for another.
fn sasl_handshake(r: &mut Reader<'_>, auth: &Auth, state: &State) -> Vec<u8> {
    let mechanism = r.string().unwrap_or_default();
    let enabled = auth.mechanism();
    let code = if mechanism == enabled {
        0i16
    } else {
        UNSUPPORTED_SASL_MECHANISM
    };
    state.mechanisms.lock().unwrap().push(mechanism);
    let mut body = Vec::new();
    body.extend(code.to_be_bytes());
    body.extend(1i32.to_be_bytes());
    put_string(&mut body, enabled);
    body
}

/// The SaslAuthenticate v0 response to one step of the exchange, and whether the client
/// is now authenticated.
fn sasl_authenticate(
    r: &mut Reader<'_>,
    auth: &Auth,
    state: &State,
    scram: &mut ScramStage,
) -> (Vec<u8>, bool) {
    let len = r.i32() as usize;
    let bytes = r.take(len).to_vec();
    state.auth_bytes.lock().unwrap().push(bytes.clone());
    let (code, message, server_bytes, done) = match authenticate(auth, scram, &bytes) {
        Step::Continue(b) => (0i16, None, b, false),
        Step::Done(b) => {
            state.verdicts.lock().unwrap().push(Verdict::Accepted);
            (0i16, None, b, true)
        }
        Step::Refuse(why) => {
            state.verdicts.lock().unwrap().push(Verdict::Refused(why));
            // Kafka's own wording for a failed SCRAM or PLAIN exchange
            let message = format!(
                "Authentication failed during authentication due to invalid \
                 credentials with SASL mechanism {}",
                auth.mechanism()
            );
            (SASL_AUTHENTICATION_FAILED, Some(message), Vec::new(), false)
        }
    };
    let mut body = Vec::new();
    body.extend(code.to_be_bytes());
    match message {
        Some(m) => put_string(&mut body, &m),
        None => body.extend((-1i16).to_be_bytes()),
    }
    body.extend((server_bytes.len() as i32).to_be_bytes());
    body.extend(server_bytes);
    (body, done)
}

/// What `auth` makes of the client's `bytes` at this step of the exchange.
fn authenticate(auth: &Auth, scram: &mut ScramStage, bytes: &[u8]) -> Step {
    match auth {
        Auth::Accept => Step::Done(Vec::new()),
        Auth::Refuse => Step::Refuse("refusing every token".into()),
        Auth::Plain { username, password } => plain(bytes, username, password),
        Auth::Scram {
            hash,
            username,
            password,
        } => scram_step(*hash, username, password, scram, bytes),
        Auth::ScramForgedServer { hash, username } => {
            match scram_step(*hash, username, "", scram, bytes) {
                // the proof cannot verify without the password: claim it did
                Step::Refuse(_) if !bytes.starts_with(b"n,,") => {
                    let forged = vec![0u8; hash.len()];
                    Step::Done(format!("v={}", B64.encode(forged)).into_bytes())
                }
                other => other,
            }
        }
    }
}

/// The Metadata v0 response: this one broker, no topics.
fn metadata(port: u16) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(1i32.to_be_bytes()); // one broker
    body.extend(0i32.to_be_bytes());
    put_string(&mut body, "127.0.0.1");
    body.extend(i32::from(port).to_be_bytes());
    body.extend(0i32.to_be_bytes()); // no topics
    body
}

/// RFC 4616: `[authzid] NUL authcid NUL passwd`; a Kafka client sends no authzid.
fn plain(bytes: &[u8], username: &str, password: &str) -> Step {
    let expected = [b"\0", username.as_bytes(), b"\0", password.as_bytes()].concat();
    if bytes == expected {
        Step::Done(Vec::new())
    } else if bytes.starts_with(&[b"\0", username.as_bytes(), b"\0"].concat()) {
        Step::Refuse("wrong password".into())
    } else {
        Step::Refuse(format!(
            "not \\0{username}\\0<password>: {:?}",
            String::from_utf8_lossy(bytes)
        ))
    }
}

/// RFC 5802 `saslname`: `=` and `,` escaped as `=3D` and `=2C`.
pub(crate) fn saslname(username: &str) -> String {
    username.replace('=', "=3D").replace(',', "=2C")
}

fn hmac_sign(hash: Scram, key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hash.hmac(), key), data)
        .as_ref()
        .to_vec()
}

/// One SCRAM step on the server side (RFC 5802 section 3 and 5).
fn scram_step(
    hash: Scram,
    username: &str,
    password: &str,
    stage: &mut ScramStage,
    bytes: &[u8],
) -> Step {
    let Ok(message) = std::str::from_utf8(bytes) else {
        return Step::Refuse("not UTF-8".into());
    };
    match std::mem::replace(stage, ScramStage::Start) {
        ScramStage::Start => {
            // client-first-message = gs2-header client-first-message-bare, with gs2-header
            // "n,," (no channel binding, no authzid)
            let Some(bare) = message.strip_prefix("n,,") else {
                return Step::Refuse(format!("gs2 header is not \"n,,\": {message:?}"));
            };
            let prefix = format!("n={},r=", saslname(username));
            let Some(client_nonce) = bare.strip_prefix(&prefix) else {
                return Step::Refuse(format!(
                    "client-first-bare is not {prefix}<nonce>: {bare:?}"
                ));
            };
            if client_nonce.is_empty()
                || !client_nonce
                    .bytes()
                    .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
            {
                return Step::Refuse(format!("bad client nonce {client_nonce:?}"));
            }
            let server_nonce: String = (0..24)
                .map(|_| char::from(b'a' + rand::random::<u8>() % 26))
                .collect();
            let nonce = format!("{client_nonce}{server_nonce}");
            let salt: Vec<u8> = (0..16).map(|_| rand::random::<u8>()).collect();
            let server_first = format!("r={nonce},s={},i={SCRAM_ITERATIONS}", B64.encode(&salt));
            *stage = ScramStage::Challenged {
                client_first_bare: bare.to_owned(),
                server_first: server_first.clone(),
                nonce,
                salt,
            };
            Step::Continue(server_first.into_bytes())
        }
        ScramStage::Challenged {
            client_first_bare,
            server_first,
            nonce,
            salt,
        } => {
            // client-final-message = "c=" base64(gs2-header) ",r=" nonce ",p=" proof
            let Some((without_proof, proof)) = message.rsplit_once(",p=") else {
                return Step::Refuse(format!("no proof in {message:?}"));
            };
            let expected = format!("c={},r={nonce}", B64.encode("n,,"));
            if without_proof != expected {
                return Step::Refuse(format!(
                    "client-final-without-proof is not {expected:?}: {without_proof:?}"
                ));
            }
            let Ok(proof) = B64.decode(proof) else {
                return Step::Refuse("proof is not base64".into());
            };
            if proof.len() != hash.len() {
                return Step::Refuse(format!("proof of {} bytes", proof.len()));
            }
            // the broker's stored credentials: StoredKey and ServerKey of the password
            let mut salted = vec![0u8; hash.len()];
            pbkdf2::derive(
                hash.pbkdf2(),
                std::num::NonZeroU32::new(SCRAM_ITERATIONS).unwrap(),
                &salt,
                password.as_bytes(),
                &mut salted,
            );
            let client_key = hmac_sign(hash, &salted, b"Client Key");
            let stored_key = digest::digest(hash.digest(), &client_key);
            let server_key = hmac_sign(hash, &salted, b"Server Key");
            let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
            let client_signature = hmac_sign(hash, stored_key.as_ref(), auth_message.as_bytes());
            // ClientKey = ClientProof XOR ClientSignature; the proof holds when H(ClientKey)
            // is the StoredKey
            let recovered: Vec<u8> = proof
                .iter()
                .zip(&client_signature)
                .map(|(p, s)| p ^ s)
                .collect();
            if digest::digest(hash.digest(), &recovered).as_ref() != stored_key.as_ref() {
                return Step::Refuse("the client proof does not verify (wrong password)".into());
            }
            let server_signature = hmac_sign(hash, &server_key, auth_message.as_bytes());
            Step::Done(format!("v={}", B64.encode(server_signature)).into_bytes())
        }
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as i16).to_be_bytes());
    out.extend(s.as_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    fn i16(&mut self) -> i16 {
        let b = self.take(2);
        i16::from_be_bytes([b[0], b[1]])
    }
    fn i32(&mut self) -> i32 {
        let b = self.take(4);
        i32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    fn string(&mut self) -> Option<String> {
        let len = self.i16();
        (len >= 0).then(|| String::from_utf8_lossy(self.take(len as usize)).into_owned())
    }
    fn tagged_fields(&mut self) {
        // the clients here send none: a single zero varint
        self.take(1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use aws_credential_types::provider::SharedCredentialsProvider;

    use super::*;
    use crate::logging::Captured;
    use crate::publish::token_check::{static_credentials, verify_token, SECRET_KEY};
    use crate::publish::{KafkaAuth, KafkaConfig, KafkaPublisher, SaslCredentials};

    /// One connecting test at a time: the SCRAM test captures logs through its thread's
    /// default subscriber, and a test registering rskafka's callsites at the same moment on
    /// a thread without one can leave them disabled for it.
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    fn config(broker: &FakeBroker) -> KafkaConfig {
        let mut config = KafkaConfig::new([broker.address.clone()])
            .with_msk_iam("eu-west-1")
            .with_credentials(SharedCredentialsProvider::new(static_credentials()));
        config.tls = false; // the fake speaks plaintext; MSK itself needs TLS
        config.retry_budget = Duration::from_millis(300);
        config
    }

    #[tokio::test]
    async fn oauthbearer_carries_a_valid_msk_iam_token() {
        let _serial = SERIAL.lock().await;
        let broker = FakeBroker::start(Auth::Accept).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let publisher = KafkaPublisher::connect(config(&broker), deadline)
            .await
            .expect("connect through SASL/OAUTHBEARER");

        assert_eq!(broker.mechanisms.lock().unwrap()[0], "OAUTHBEARER");
        let sent = broker.auth_bytes.lock().unwrap()[0].clone();
        let sent = String::from_utf8(sent).unwrap();
        // RFC 7628 initial client response: gs2 header "n,,", then kvsep-separated pairs
        let token = sent
            .strip_prefix("n,,\x01auth=Bearer ")
            .and_then(|rest| rest.strip_suffix("\x01\x01"))
            .unwrap_or_else(|| panic!("not an OAUTHBEARER initial response: {sent:?}"));
        verify_token(token, "eu-west-1", SECRET_KEY, SystemTime::now());
        // and the client went on to use the authenticated connection
        assert_eq!(broker.after_auth.lock().unwrap().first(), Some(&METADATA));
        let debug = format!("{publisher:?}");
        assert!(
            !debug.contains(token) && !debug.contains(SECRET_KEY),
            "{debug}"
        );
    }

    #[tokio::test]
    async fn refused_authentication_fails_the_connect_in_bounded_time() {
        let _serial = SERIAL.lock().await;
        let broker = FakeBroker::start(Auth::Refuse).await;
        let started = tokio::time::Instant::now();
        let deadline = started + Duration::from_secs(10);
        let err = KafkaPublisher::connect(config(&broker), deadline)
            .await
            .expect_err("the broker refused");
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(err, crate::Error::Kafka { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "kafka: the brokers refused SASL/OAUTHBEARER (MSK IAM) authentication: check the \
             role's kafka-cluster:Connect permission and the cluster's IAM access control"
        );
        assert!(!err.is_retryable());
        assert!(!broker.auth_bytes.lock().unwrap().is_empty());
    }

    fn sasl_config(broker: &FakeBroker, auth: KafkaAuth, creds: SaslCredentials) -> KafkaConfig {
        let mut config = KafkaConfig::new([broker.address.clone()]).with_sasl(auth, creds);
        config.tls = false; // the fake speaks plaintext
        config.allow_plain_without_tls = true;
        config.retry_budget = Duration::from_millis(300);
        config
    }

    fn scram_auth(hash: Scram, username: &str, password: &str) -> Auth {
        Auth::Scram {
            hash,
            username: username.into(),
            password: password.into(),
        }
    }

    #[tokio::test]
    async fn scram_sha_256_and_512_send_rfc_5802_messages_whose_proof_verifies() {
        let _serial = SERIAL.lock().await;
        // the username needs RFC 5802's escaping ("=" and "," in a saslname)
        let (username, password) = ("al=ice,ops", "correct horse 7f3a9c5e2b1d");
        for (hash, auth) in [
            (Scram::Sha256, KafkaAuth::ScramSha256),
            (Scram::Sha512, KafkaAuth::ScramSha512),
        ] {
            let broker = FakeBroker::start(scram_auth(hash, username, password)).await;
            let logs = Captured::default();
            let _default = tracing::subscriber::set_default(crate::logging::cli_subscriber(
                Some("trace"),
                logs.clone(),
            ));
            let config = sasl_config(&broker, auth, SaslCredentials::new(username, password));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let publisher = KafkaPublisher::connect(config, deadline)
                .await
                .unwrap_or_else(|e| panic!("{hash:?}: {e:#?}"));

            assert_eq!(broker.mechanisms.lock().unwrap()[0], hash.mechanism());
            assert_eq!(broker.verdicts.lock().unwrap()[0], Verdict::Accepted);
            let sent = broker.auth_bytes.lock().unwrap().clone();
            assert!(sent.len() >= 2, "{sent:?}");
            let first = String::from_utf8(sent[0].clone()).unwrap();
            let nonce = first
                .strip_prefix("n,,n=al=3Dice=2Cops,r=")
                .unwrap_or_else(|| panic!("client-first: {first:?}"));
            assert!(nonce.len() >= 16 && !nonce.contains(','), "{first:?}");
            let last = String::from_utf8(sent[1].clone()).unwrap();
            let rest = last
                .strip_prefix(&format!("c=biws,r={nonce}"))
                .unwrap_or_else(|| panic!("client-final: {last:?}"));
            let (server_nonce, proof) = rest.split_once(",p=").unwrap();
            assert_eq!(server_nonce.len(), 24, "{last:?}");
            assert_eq!(B64.decode(proof).unwrap().len(), hash.len(), "{last:?}");
            // the client used the authenticated connection, and nothing shows the password
            assert_eq!(broker.after_auth.lock().unwrap().first(), Some(&METADATA));
            let logs = logs.text();
            assert!(logs.contains("rskafka"), "no trace output captured: {logs}");
            let debug = format!("{publisher:?}");
            for text in [&logs, &debug] {
                assert!(!text.contains("7f3a9c5e2b1d"), "{text}");
            }
        }
    }

    #[tokio::test]
    async fn plain_sends_exactly_nul_username_nul_password() {
        let _serial = SERIAL.lock().await;
        let broker = FakeBroker::start(Auth::Plain {
            username: "alice".into(),
            password: "pw 1".into(),
        })
        .await;
        let config = sasl_config(
            &broker,
            KafkaAuth::Plain,
            SaslCredentials::new("alice", "pw 1"),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        KafkaPublisher::connect(config, deadline)
            .await
            .expect("connect through SASL/PLAIN");
        assert_eq!(broker.mechanisms.lock().unwrap()[0], "PLAIN");
        assert_eq!(broker.auth_bytes.lock().unwrap()[0], b"\0alice\0pw 1");
        assert_eq!(broker.verdicts.lock().unwrap()[0], Verdict::Accepted);
        assert_eq!(broker.after_auth.lock().unwrap().first(), Some(&METADATA));
    }

    #[tokio::test]
    async fn a_wrong_password_is_refused_with_an_error_naming_the_user_and_the_variables() {
        let _serial = SERIAL.lock().await;
        for (auth, broker_auth, name) in [
            (
                KafkaAuth::ScramSha256,
                scram_auth(Scram::Sha256, "alice", "right"),
                "SCRAM-SHA-256",
            ),
            (
                KafkaAuth::ScramSha512,
                scram_auth(Scram::Sha512, "alice", "right"),
                "SCRAM-SHA-512",
            ),
            (
                KafkaAuth::Plain,
                Auth::Plain {
                    username: "alice".into(),
                    password: "right".into(),
                },
                "PLAIN",
            ),
        ] {
            let broker = FakeBroker::start(broker_auth).await;
            let config = sasl_config(&broker, auth, SaslCredentials::new("alice", "wrong-9d2e"));
            let started = tokio::time::Instant::now();
            let err = KafkaPublisher::connect(config, started + Duration::from_secs(10))
                .await
                .expect_err("the broker refused");
            assert!(
                started.elapsed() < Duration::from_secs(8),
                "{:?}",
                started.elapsed()
            );
            assert_eq!(
                err.to_string(),
                format!(
                    "kafka: the brokers refused SASL/{name} authentication as user \"alice\": \
                     check the username and password in KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"
                )
            );
            assert!(!err.is_retryable());
            assert!(!format!("{err:?}").contains("wrong-9d2e"), "{err:?}");
            let verdicts = broker.verdicts.lock().unwrap().clone();
            assert!(
                matches!(&verdicts[0], Verdict::Refused(why) if why.contains("wrong password")),
                "{name}: {verdicts:?}"
            );
            assert!(broker.after_auth.lock().unwrap().is_empty());
        }
    }

    #[tokio::test]
    async fn refused_credentials_from_a_secret_are_forgotten_and_the_error_names_the_secret() {
        let _serial = SERIAL.lock().await;
        let broker = FakeBroker::start(scram_auth(Scram::Sha512, "alice", "rotated")).await;
        let creds = SaslCredentials::secrets_manager_read(
            "arn:aws:secretsmanager:eu-west-1:111122223333:secret:AmazonMSK_outbox",
            crate::publish::sasl::UsernamePassword {
                username: "alice".into(),
                password: crate::publish::sasl::Password::new("before-rotation"),
            },
        );
        let config = sasl_config(&broker, KafkaAuth::ScramSha512, creds.clone());
        let err = KafkaPublisher::connect(
            config,
            tokio::time::Instant::now() + Duration::from_secs(10),
        )
        .await
        .expect_err("the broker refused");
        assert_eq!(
            err.to_string(),
            "kafka: the brokers refused SASL/SCRAM-SHA-512 authentication: check the username \
             and password in the secret \
             arn:aws:secretsmanager:eu-west-1:111122223333:secret:AmazonMSK_outbox \
             (KAFKA_SASL_SECRET_ARN)"
        );
        // the next connect reads the secret again
        assert!(!creds.holds_secret().await);
    }

    #[tokio::test]
    async fn the_client_refuses_a_broker_whose_server_signature_is_forged() {
        let _serial = SERIAL.lock().await;
        let broker = FakeBroker::start(Auth::ScramForgedServer {
            hash: Scram::Sha512,
            username: "alice".into(),
        })
        .await;
        let config = sasl_config(
            &broker,
            KafkaAuth::ScramSha512,
            SaslCredentials::new("alice", "pw"),
        );
        let err = KafkaPublisher::connect(
            config,
            tokio::time::Instant::now() + Duration::from_secs(10),
        )
        .await
        .expect_err("a forged server signature");
        assert!(!err.is_retryable(), "{err:?}");
        // the fake claimed success, and the client hung up instead of going on
        assert_eq!(broker.verdicts.lock().unwrap()[0], Verdict::Accepted);
        assert!(broker.after_auth.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_mechanism_the_broker_does_not_enable_fails_the_connect() {
        let _serial = SERIAL.lock().await;
        let broker = FakeBroker::start(scram_auth(Scram::Sha512, "alice", "pw")).await;
        let config = sasl_config(
            &broker,
            KafkaAuth::ScramSha256,
            SaslCredentials::new("alice", "pw"),
        );
        let err = KafkaPublisher::connect(
            config,
            tokio::time::Instant::now() + Duration::from_secs(10),
        )
        .await
        .expect_err("SCRAM-SHA-256 is not enabled");
        assert!(!err.is_retryable(), "{err:?}");
        assert_eq!(
            err.to_string(),
            "kafka: the SASL/SCRAM-SHA-256 exchange with the brokers failed (is \
             KAFKA_AUTH=scram-sha-256 enabled on this listener?)"
        );
        assert_eq!(broker.mechanisms.lock().unwrap()[0], "SCRAM-SHA-256");
        assert!(broker.auth_bytes.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn connect_gives_up_at_the_deadline() {
        let _serial = SERIAL.lock().await;
        // a listener that accepts and never answers
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let _keep = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let started = tokio::time::Instant::now();
        let err = KafkaPublisher::connect(
            KafkaConfig::new([address]),
            started + Duration::from_millis(500),
        )
        .await
        .expect_err("nobody answers");
        assert!(matches!(err, crate::Error::DeadlineExceeded(_)), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
