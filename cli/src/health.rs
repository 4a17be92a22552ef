//! `outboxctl relay --health-listen ADDR`: liveness and readiness for orchestrators
//! (Kubernetes probes, ECS health checks, a load balancer's target check), over plain
//! HTTP/1.1 on a tokio listener.
//!
//! - `GET /healthz` (live): 200 from the start until the relay loop has ended, 503 after.
//!   A process whose runtime is wedged does not answer at all.
//! - `GET /readyz` (ready): 200 while the relay is connected and heartbeating: its last
//!   acquisition round (heartbeat, read of the coordination partition, renewals and
//!   claims on DynamoDB) completed less than a lease duration ago, that round's heartbeat
//!   was not refused, and no owned bucket's latest batch failed (a publish to Kafka, or
//!   the delete after it). 503 before the first round (connecting to Kafka, first
//!   heartbeat), once a stop signal arrived, and after the loop ended.
//!
//! Each answer is one line of text saying why (`ready: 4 buckets owned, last round 0.8 s
//! ago`). `HEAD` answers the same without a body; other paths are 404, other methods 405.
//! The state comes from the relay's metrics seam ([`RelayMetrics`]), so a probe costs no
//! request to DynamoDB or Kafka.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_outbox::metrics::RelayMetrics;
use dynamo_outbox::protocol::store::WriteKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::{failure, usage, Failure};

/// Longest request head read.
const MAX_REQUEST: usize = 8 * 1024;
/// Time a client has to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections answered at once; more wait for a slot.
const MAX_CONNECTIONS: usize = 32;

#[derive(Debug, Default)]
struct State {
    /// The relay loop has started.
    started: bool,
    /// The relay loop has ended.
    ended: bool,
    /// A stop signal arrived.
    stopping: bool,
    last_round: Option<Instant>,
    /// A heartbeat was refused in the round now running / in the last completed round.
    heartbeat_refused: bool,
    last_round_heartbeat_refused: bool,
    owned: usize,
    /// Owned buckets whose latest batch failed.
    failing: BTreeSet<u32>,
}

/// The relay's health, fed by the metrics seam and by the command around the relay.
#[derive(Debug)]
pub(crate) struct Health {
    lease_duration: Duration,
    state: Mutex<State>,
}

impl Health {
    pub(crate) fn new(lease_duration: Duration) -> Self {
        Health {
            lease_duration,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The relay loop starts.
    pub(crate) fn started(&self) {
        self.lock().started = true;
    }

    /// A stop signal arrived: not ready any more (the relay is releasing its leases).
    pub(crate) fn stopping(&self) {
        self.lock().stopping = true;
    }

    /// The relay loop has ended.
    pub(crate) fn ended(&self) {
        self.lock().ended = true;
    }

    /// Liveness: whether, and why.
    pub(crate) fn live(&self) -> (bool, String) {
        let s = self.lock();
        match (s.started, s.ended) {
            (_, true) => (false, "not live: the relay loop has ended".into()),
            (false, _) => (true, "live: starting".into()),
            (true, false) => (true, "live: the relay loop is running".into()),
        }
    }

    /// Readiness at `now`: whether, and why.
    pub(crate) fn ready(&self, now: Instant) -> (bool, String) {
        let s = self.lock();
        let not = |why: String| (false, format!("not ready: {why}"));
        if s.ended {
            return not("the relay loop has ended".into());
        }
        if s.stopping {
            return not("stopping (releasing leases)".into());
        }
        if !s.started {
            return not("starting (connecting to DynamoDB and Kafka)".into());
        }
        let Some(last) = s.last_round else {
            return not("no acquisition round has completed yet (first heartbeat)".into());
        };
        let ago = now.saturating_duration_since(last);
        if ago > self.lease_duration {
            return not(format!(
                "the last completed acquisition round was {:.1} s ago, more than the lease duration ({:.1} s): DynamoDB unreachable or slow",
                ago.as_secs_f64(),
                self.lease_duration.as_secs_f64()
            ));
        }
        if s.last_round_heartbeat_refused {
            return not("the last round's heartbeat was refused (another process with this relay id, or a clock set back)".into());
        }
        if !s.failing.is_empty() {
            return not(format!(
                "the latest batch of buckets {:?} failed (Kafka or DynamoDB); retrying",
                s.failing
            ));
        }
        (
            true,
            format!(
                "ready: {} buckets owned, last round {:.1} s ago",
                s.owned,
                ago.as_secs_f64()
            ),
        )
    }
}

impl RelayMetrics for Health {
    fn published(&self, bucket: u32, _count: u64) {
        self.lock().failing.remove(&bucket);
    }

    fn publish_failed(&self, bucket: u32, _permanent: bool) {
        self.lock().failing.insert(bucket);
    }

    fn refused_write(&self, kind: WriteKind) {
        if kind == WriteKind::Heartbeat {
            self.lock().heartbeat_refused = true;
        }
    }

    fn owned_buckets(&self, count: usize) {
        self.lock().owned = count;
    }

    fn ownership(&self, bucket: u32, owned: bool) {
        if !owned {
            self.lock().failing.remove(&bucket);
        }
    }

    fn round_duration(&self, _duration: Duration) {
        let mut s = self.lock();
        s.last_round = Some(Instant::now());
        s.last_round_heartbeat_refused = std::mem::take(&mut s.heartbeat_refused);
    }
}

/// Binds `listen` (`host:port`; port 0 picks a free one, logged) and answers probes in
/// the background until the process ends.
pub(crate) async fn serve(listen: &str, health: Arc<Health>) -> Result<SocketAddr, Failure> {
    let addr: SocketAddr = listen.parse().map_err(|e| {
        usage(format!(
            "--health-listen: {listen:?} is not an address:port such as 127.0.0.1:8080 ({e})"
        ))
    })?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| failure(format!("--health-listen: cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| failure(format!("--health-listen: {e}")))?;
    tracing::info!(addr = %bound, "health endpoint listening (GET /healthz, /readyz)");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            match listener.accept().await {
                Ok((stream, _)) => {
                    let health = health.clone();
                    tokio::spawn(async move {
                        let _ = answer(stream, &health).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    tracing::debug!(error = %e, "health endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(bound)
}

/// Reads one request head and answers it; the connection closes after the answer.
async fn answer(mut stream: TcpStream, health: &Health) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let (status, body, with_body) = route(&head, health);
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let body = format!("{body}\n");
    let mut response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\ncache-control: no-store\r\nconnection: close\r\n",
        body.len()
    );
    if status == 405 {
        response.push_str("allow: GET, HEAD\r\n");
    }
    response.push_str("\r\n");
    if with_body {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Status, body and whether to send the body, for one request head.
fn route(head: &[u8], health: &Health) -> (u16, String, bool) {
    let line = head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .and_then(|l| std::str::from_utf8(l).ok())
        .unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return (400, "bad request".into(), true);
    };
    if !version.starts_with("HTTP/1.") {
        return (400, "bad request".into(), true);
    }
    let with_body = method != "HEAD";
    if method != "GET" && method != "HEAD" {
        return (405, "only GET and HEAD".into(), true);
    }
    let path = target.split('?').next().unwrap_or("");
    let (ok, text) = match path {
        "/healthz" | "/livez" => health.live(),
        "/readyz" => health.ready(Instant::now()),
        _ => return (404, "not found: GET /healthz or /readyz".into(), with_body),
    };
    (if ok { 200 } else { 503 }, text, with_body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(health: &Health, path: &str) -> (u16, String) {
        let (status, body, _) = route(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes(),
            health,
        );
        (status, body)
    }

    #[test]
    fn readiness_follows_rounds_heartbeats_and_batches() {
        let h = Health::new(Duration::from_secs(3));
        assert_eq!(get(&h, "/healthz").0, 200, "live while starting");
        let (s, why) = get(&h, "/readyz");
        assert_eq!(s, 503);
        assert!(why.contains("starting"), "{why}");
        h.started();
        assert!(get(&h, "/readyz").1.contains("no acquisition round"));
        h.owned_buckets(2);
        h.round_duration(Duration::from_millis(5));
        let (s, why) = get(&h, "/readyz");
        assert_eq!(
            (s, why.starts_with("ready: 2 buckets owned")),
            (200, true),
            "{why}"
        );

        // A round whose heartbeat was refused.
        h.refused_write(WriteKind::Claim);
        h.round_duration(Duration::from_millis(5));
        assert_eq!(
            get(&h, "/readyz").0,
            200,
            "a refused claim is the protocol at work"
        );
        h.refused_write(WriteKind::Heartbeat);
        h.round_duration(Duration::from_millis(5));
        assert!(get(&h, "/readyz").1.contains("heartbeat was refused"));
        h.round_duration(Duration::from_millis(5));
        assert_eq!(
            get(&h, "/readyz").0,
            200,
            "the next round's heartbeat landed"
        );

        // A failed batch, until the bucket publishes again or is handed over.
        h.published(1, 3);
        h.publish_failed(1, false);
        assert!(get(&h, "/readyz").1.contains("buckets {1} failed"));
        h.published(1, 0);
        assert_eq!(get(&h, "/readyz").0, 200);
        h.publish_failed(4, false);
        h.ownership(4, false);
        assert_eq!(get(&h, "/readyz").0, 200);

        // No round for longer than a lease.
        let later = Instant::now() + Duration::from_secs(4);
        let (ok, why) = h.ready(later);
        assert!(!ok && why.contains("lease duration"), "{why}");

        h.stopping();
        assert!(get(&h, "/readyz").1.contains("stopping"));
        assert_eq!(get(&h, "/healthz").0, 200);
        h.ended();
        assert_eq!(get(&h, "/healthz").0, 503);
        assert_eq!(get(&h, "/readyz").0, 503);
    }

    #[test]
    fn other_requests() {
        let h = Health::new(Duration::from_secs(3));
        assert_eq!(get(&h, "/").0, 404);
        assert_eq!(get(&h, "/healthz?verbose=1").0, 200);
        let (s, _, body) = route(b"HEAD /healthz HTTP/1.1\r\n\r\n", &h);
        assert_eq!((s, body), (200, false));
        assert_eq!(route(b"POST /healthz HTTP/1.1\r\n\r\n", &h).0, 405);
        assert_eq!(route(b"\x16\x03\x01 garbage", &h).0, 400);
        assert_eq!(route(b"", &h).0, 400);
    }
}
