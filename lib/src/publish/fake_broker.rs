//! A tiny fake Kafka broker for tests of the SASL/OAUTHBEARER exchange: it speaks just
//! enough of the protocol (ApiVersions v0, SaslHandshake v1, SaslAuthenticate v0,
//! Metadata v0) for rskafka to connect, and records what the client authenticated with.
//! The local broker (tansu) has no SASL, and MSK is not reachable from tests.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const API_VERSIONS: i16 = 18;
const METADATA: i16 = 3;
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const UNSUPPORTED_VERSION: i16 = 35;
const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// How the fake answers authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// Accept any OAUTHBEARER initial response.
    Accept,
    /// Refuse with `SASL_AUTHENTICATION_FAILED`.
    Refuse,
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
    /// API keys of requests received after authentication, in order.
    pub(crate) after_auth: Arc<Mutex<Vec<i16>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeBroker {
    pub(crate) async fn start(auth: Auth) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mechanisms = Arc::new(Mutex::new(Vec::new()));
        let auth_bytes = Arc::new(Mutex::new(Vec::new()));
        let after_auth = Arc::new(Mutex::new(Vec::new()));
        let state = (
            Arc::clone(&mechanisms),
            Arc::clone(&auth_bytes),
            Arc::clone(&after_auth),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let state = (
                    Arc::clone(&state.0),
                    Arc::clone(&state.1),
                    Arc::clone(&state.2),
                );
                tokio::spawn(async move {
                    let _ = serve(socket, port, auth, state).await;
                });
            }
        });
        FakeBroker {
            address: format!("127.0.0.1:{port}"),
            mechanisms,
            auth_bytes,
            after_auth,
            task,
        }
    }
}

type State = (
    Arc<Mutex<Vec<String>>>,
    Arc<Mutex<Vec<Vec<u8>>>>,
    Arc<Mutex<Vec<i16>>>,
);

async fn serve(mut socket: TcpStream, port: u16, auth: Auth, state: State) -> std::io::Result<()> {
    let mut authenticated = false;
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
        let mut body = Vec::new();
        match (api_key, version) {
            (API_VERSIONS, 0) => {
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
            }
            (API_VERSIONS, _) => {
                // what a real broker does: a v0 error response; the client tries lower versions
                body.extend(UNSUPPORTED_VERSION.to_be_bytes());
                body.extend(0i32.to_be_bytes());
            }
            (SASL_HANDSHAKE, 1) => {
                let mechanism = r.string().unwrap_or_default();
                state.0.lock().unwrap().push(mechanism);
                body.extend(0i16.to_be_bytes());
                body.extend(1i32.to_be_bytes());
                put_string(&mut body, "OAUTHBEARER");
            }
            (SASL_AUTHENTICATE, 0) => {
                let len = r.i32() as usize;
                let bytes = r.take(len).to_vec();
                state.1.lock().unwrap().push(bytes);
                match auth {
                    Auth::Accept => {
                        authenticated = true;
                        body.extend(0i16.to_be_bytes());
                        body.extend((-1i16).to_be_bytes()); // no error message
                        body.extend(0i32.to_be_bytes()); // empty server response
                    }
                    Auth::Refuse => {
                        body.extend(SASL_AUTHENTICATION_FAILED.to_be_bytes());
                        put_string(&mut body, "Access denied");
                        body.extend(0i32.to_be_bytes());
                    }
                }
            }
            (METADATA, 0) if authenticated => {
                state.2.lock().unwrap().push(api_key);
                body.extend(1i32.to_be_bytes()); // one broker
                body.extend(0i32.to_be_bytes());
                put_string(&mut body, "127.0.0.1");
                body.extend(i32::from(port).to_be_bytes());
                body.extend(0i32.to_be_bytes()); // no topics
            }
            _ => {
                // anything else (or anything before authentication): hang up, as a broker does
                return Ok(());
            }
        }
        let mut response = Vec::with_capacity(body.len() + 8);
        response.extend(((body.len() + 4) as i32).to_be_bytes());
        response.extend(correlation_id.to_be_bytes());
        response.extend(body);
        socket.write_all(&response).await?;
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
    use crate::publish::msk_iam::tests::{static_credentials, verify_token, SECRET_KEY};
    use crate::publish::{KafkaConfig, KafkaPublisher};

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
        assert!(!broker.auth_bytes.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn connect_gives_up_at_the_deadline() {
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
