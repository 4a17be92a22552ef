//! A fake Kafka broker for the SASL exchanges a real broker cannot play: Amazon MSK IAM
//! (SASL/OAUTHBEARER whose token only MSK verifies) and a SCRAM broker that does not know
//! the password. The stack's Apache Kafka covers SCRAM and PLAIN themselves.
//!
//! It speaks just enough of the protocol for rskafka to connect (ApiVersions v0,
//! SaslHandshake v1, SaslAuthenticate v0, Metadata v0, plaintext), records what the
//! client sent, and answers as [`FakeSasl`] says. A refused exchange is answered as Kafka
//! does: `SASL_AUTHENTICATION_FAILED` with Kafka's message.

use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The Metadata API key: the first request a client sends once authenticated.
pub const METADATA: i16 = 3;
const API_VERSIONS: i16 = 18;
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const UNSUPPORTED_VERSION: i16 = 35;
const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// How the fake answers authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeSasl {
    /// SASL/OAUTHBEARER: any initial response is accepted (the test checks the MSK IAM
    /// token in it).
    AcceptOauthBearer,
    /// SASL/OAUTHBEARER: every initial response is refused.
    RefuseOauthBearer,
    /// SASL/SCRAM-SHA-512 from a broker that does not know the password: it answers the
    /// client-first message (RFC 5802) with a server-first message, then claims success
    /// with a forged server signature. A client must refuse it.
    ScramSha512ForgedServer,
    /// SASL/SCRAM-SHA-512 from a broken or hostile broker: it answers the client-first
    /// message with `server_first`, in which `{nonce}` stands for the client's nonce with
    /// the server's part appended, and the client-final message with `server_final`.
    ScramSha512Answers {
        /// The server-first message (`{nonce}` is replaced).
        server_first: &'static str,
        /// The server-final message.
        server_final: &'static str,
    },
}

impl FakeSasl {
    /// The one mechanism the fake enables.
    pub fn mechanism(self) -> &'static str {
        match self {
            FakeSasl::AcceptOauthBearer | FakeSasl::RefuseOauthBearer => "OAUTHBEARER",
            FakeSasl::ScramSha512ForgedServer | FakeSasl::ScramSha512Answers { .. } => {
                "SCRAM-SHA-512"
            }
        }
    }
}

/// A running fake broker on a loopback port; stops when dropped.
#[derive(Debug)]
pub struct FakeBroker {
    /// `127.0.0.1:PORT`, to bootstrap from.
    pub address: String,
    state: State,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, Clone, Default)]
struct State {
    /// The SASL mechanisms clients asked for, in order.
    mechanisms: Arc<Mutex<Vec<String>>>,
    /// The SaslAuthenticate bytes clients sent, in order.
    auth_bytes: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Exchanges the fake answered as successful.
    accepted: Arc<Mutex<usize>>,
    /// API keys of the requests received after a successful exchange, in order.
    after_auth: Arc<Mutex<Vec<i16>>>,
}

impl FakeBroker {
    /// Starts the fake on a free loopback port (on the current tokio runtime).
    pub async fn start(sasl: FakeSasl) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let state = State::default();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(socket, port, sasl, &state).await;
                });
            }
        });
        FakeBroker {
            address: format!("127.0.0.1:{port}"),
            state,
            task,
        }
    }

    /// The SASL mechanisms clients asked for (SaslHandshake), in order.
    pub fn mechanisms(&self) -> Vec<String> {
        self.state.mechanisms.lock().unwrap().clone()
    }

    /// The bytes of every SaslAuthenticate request, in order.
    pub fn auth_bytes(&self) -> Vec<Vec<u8>> {
        self.state.auth_bytes.lock().unwrap().clone()
    }

    /// How many exchanges the fake answered as successful.
    pub fn accepted(&self) -> usize {
        *self.state.accepted.lock().unwrap()
    }

    /// API keys of the requests received on a connection after its exchange succeeded.
    pub fn after_auth(&self) -> Vec<i16> {
        self.state.after_auth.lock().unwrap().clone()
    }
}

/// Where a connection's SCRAM exchange is.
enum Scram {
    Start,
    /// The server-first message was sent.
    Challenged,
}

/// Answers one connection's requests, in order, until the client hangs up or sends what
/// the fake does not speak (or anything but the exchange before authentication), which
/// closes the connection as a broker does.
async fn serve(
    mut socket: TcpStream,
    port: u16,
    sasl: FakeSasl,
    state: &State,
) -> std::io::Result<()> {
    let mut authenticated = false;
    let mut scram = Scram::Start;
    loop {
        let size = socket.read_i32().await?;
        let mut frame = vec![0u8; usize::try_from(size).unwrap_or(0)];
        socket.read_exact(&mut frame).await?;
        let mut r = Reader(&frame);
        let api_key = r.i16();
        let version = r.i16();
        let correlation_id = r.i32();
        let _client_id = r.string();
        let body = match (api_key, version) {
            (API_VERSIONS, version) => api_versions(version),
            (SASL_HANDSHAKE, 1) => {
                let mechanism = r.string().unwrap_or_default();
                state.mechanisms.lock().unwrap().push(mechanism.clone());
                sasl_handshake(&mechanism, sasl)
            }
            (SASL_AUTHENTICATE, 0) => {
                let len = usize::try_from(r.i32()).unwrap_or(0);
                let bytes = r.take(len).to_vec();
                state.auth_bytes.lock().unwrap().push(bytes.clone());
                let step = authenticate(sasl, &mut scram, &bytes);
                if let Step::Done(_) = step {
                    *state.accepted.lock().unwrap() += 1;
                    authenticated = true;
                }
                sasl_authenticate(step, sasl)
            }
            (METADATA, 0) if authenticated => {
                state.after_auth.lock().unwrap().push(api_key);
                metadata(port)
            }
            _ => return Ok(()),
        };
        let mut response = Vec::with_capacity(body.len() + 8);
        response.extend(((body.len() + 4) as i32).to_be_bytes());
        response.extend(correlation_id.to_be_bytes());
        response.extend(body);
        socket.write_all(&response).await?;
    }
}

/// The ApiVersions response: v0 lists the four APIs the fake speaks; any other version
/// gets what a real broker sends, a v0 error response (the client tries v0 then).
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
fn sasl_handshake(asked: &str, sasl: FakeSasl) -> Vec<u8> {
    let code = if asked == sasl.mechanism() {
        0i16
    } else {
        UNSUPPORTED_SASL_MECHANISM
    };
    let mut body = Vec::new();
    body.extend(code.to_be_bytes());
    body.extend(1i32.to_be_bytes());
    put_string(&mut body, sasl.mechanism());
    body
}

/// What one SaslAuthenticate request gets.
enum Step {
    /// Go on with these server bytes.
    Continue(Vec<u8>),
    /// Authenticated, with these final server bytes.
    Done(Vec<u8>),
    /// Refused.
    Refuse,
}

fn authenticate(sasl: FakeSasl, scram: &mut Scram, bytes: &[u8]) -> Step {
    match sasl {
        FakeSasl::AcceptOauthBearer => Step::Done(Vec::new()),
        FakeSasl::RefuseOauthBearer => Step::Refuse,
        FakeSasl::ScramSha512ForgedServer => match scram {
            Scram::Start => {
                // client-first-message: "n,,n=<saslname>,r=<nonce>"
                let text = String::from_utf8_lossy(bytes);
                let Some(nonce) = text.split(",r=").nth(1) else {
                    return Step::Refuse;
                };
                *scram = Scram::Challenged;
                let server_first = format!(
                    "r={nonce}{},s={},i=4096",
                    uuid::Uuid::new_v4().simple(),
                    B64.encode(uuid::Uuid::new_v4().as_bytes())
                );
                Step::Continue(server_first.into_bytes())
            }
            // the client's proof is not checked (the fake has no password): claim success
            // with a signature that cannot be the server's (64 bytes: SHA-512)
            Scram::Challenged => Step::Done(format!("v={}", B64.encode([0u8; 64])).into_bytes()),
        },
        FakeSasl::ScramSha512Answers {
            server_first,
            server_final,
        } => match scram {
            Scram::Start => {
                let text = String::from_utf8_lossy(bytes);
                let Some(nonce) = text.split(",r=").nth(1) else {
                    return Step::Refuse;
                };
                *scram = Scram::Challenged;
                let nonce = format!("{nonce}{}", uuid::Uuid::new_v4().simple());
                Step::Continue(server_first.replace("{nonce}", &nonce).into_bytes())
            }
            Scram::Challenged => Step::Done(server_final.as_bytes().to_vec()),
        },
    }
}

/// The SaslAuthenticate v0 response of `step`.
fn sasl_authenticate(step: Step, sasl: FakeSasl) -> Vec<u8> {
    let (code, message, server_bytes) = match step {
        Step::Continue(b) | Step::Done(b) => (0i16, None, b),
        Step::Refuse => (
            SASL_AUTHENTICATION_FAILED,
            // Kafka's own wording for a failed exchange
            Some(format!(
                "Authentication failed during authentication due to invalid credentials with \
                 SASL mechanism {}",
                sasl.mechanism()
            )),
            Vec::new(),
        ),
    };
    let mut body = Vec::new();
    body.extend(code.to_be_bytes());
    match message {
        Some(m) => put_string(&mut body, &m),
        None => body.extend((-1i16).to_be_bytes()),
    }
    body.extend((server_bytes.len() as i32).to_be_bytes());
    body.extend(server_bytes);
    body
}

/// The Metadata v0 response: this one broker, no topics.
fn metadata(port: u16) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(1i32.to_be_bytes()); // one broker
    body.extend(0i32.to_be_bytes()); // its node id
    put_string(&mut body, "127.0.0.1");
    body.extend(i32::from(port).to_be_bytes());
    body.extend(0i32.to_be_bytes()); // no topics
    body
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as i16).to_be_bytes());
    out.extend(s.as_bytes());
}

/// Reads a request's fields; a short frame reads as zeros and empty strings.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let b = self.take(N);
        out[..b.len()].copy_from_slice(b);
        out
    }
    fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.array())
    }
    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.array())
    }
    fn string(&mut self) -> Option<String> {
        let len = self.i16();
        let len = usize::try_from(len).ok()?;
        Some(String::from_utf8_lossy(self.take(len)).into_owned())
    }
}
