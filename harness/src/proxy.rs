//! A fault-injecting HTTP/1.1 proxy in front of DynamoDB Local (scenario 5): per request,
//! a `ThrottlingException` (400), an `InternalServerError` (500), added latency, or a
//! request forwarded and applied whose response is dropped (the connection is closed
//! instead), the case that makes an applied conditional write look refused on retry.
//! With fault injection off it is a plain forwarder, which the harness puts in front of
//! every relay of every scenario: it counts the answers in which DynamoDB refused a
//! condition ([`ProxyStats::condition_refused`]), a count of refused conditional writes
//! taken at the wire, apart from the relays' own. Loopback only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Probabilities of each fault per request (the rest is forwarded untouched; the default:
/// no fault).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FaultMix {
    /// Answered `400 ThrottlingException` without forwarding.
    pub throttle: f64,
    /// Answered `500 InternalServerError` without forwarding.
    pub server_error: f64,
    /// Forwarded (and applied), the response dropped: the connection is closed.
    pub drop_response: f64,
    /// Forwarded after a delay of up to `max_latency`.
    pub slow: f64,
    /// Longest added latency.
    pub max_latency: Duration,
    /// Every release of a graceful stop (an `UpdateItem` that removes the lease's owner,
    /// guarded by the owner alone: [`stop_release_of`]) is held for a random time in this
    /// range before it is forwarded (`None`: not held). A stopping relay sends its releases
    /// concurrently, each on a connection of its own, so held releases land in random
    /// order, spread around its peers' re-reads (where no claim may be refused).
    pub hold_stop_releases: Option<(Duration, Duration)>,
}

/// What the proxy did.
#[derive(Debug, Default, Serialize)]
pub struct ProxyStats {
    /// Requests forwarded (dropped responses included).
    pub forwarded: AtomicU64,
    /// Throttling errors returned.
    pub throttled: AtomicU64,
    /// 500 errors returned.
    pub server_errors: AtomicU64,
    /// Responses dropped after the request was applied.
    pub dropped_responses: AtomicU64,
    /// Requests delayed.
    pub delayed: AtomicU64,
    /// Releases of a graceful stop held ([`FaultMix::hold_stop_releases`]).
    pub held_stop_releases: AtomicU64,
    /// Answers from DynamoDB that refused a condition (a `ConditionalCheckFailedException`,
    /// or a transaction cancelled by a `ConditionalCheckFailed` reason), passed on to the
    /// relay (dropped ones are not: no relay heard of them).
    pub condition_refused: AtomicU64,
    /// Those refusals by the request's operation (`X-Amz-Target`: `UpdateItem`,
    /// `DeleteItem`, ...).
    pub condition_refused_by_operation: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

/// The operation of a raw HTTP request to DynamoDB: its `X-Amz-Target` header's value
/// after the last dot (`DynamoDB_20120810.UpdateItem` gives `UpdateItem`).
pub fn operation(request: &[u8]) -> String {
    let end = request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(request.len());
    String::from_utf8_lossy(&request[..end])
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim().eq_ignore_ascii_case("x-amz-target").then(|| {
                value
                    .trim()
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Whether a raw HTTP response from DynamoDB refuses a condition: a 4xx status whose JSON
/// body names `ConditionalCheckFailedException` as its `__type`, or is a
/// `TransactionCanceledException` with a `ConditionalCheckFailed` cancellation reason.
pub fn refuses_condition(response: &[u8]) -> bool {
    let Some(at) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&response[..at]).to_ascii_lowercase();
    let body = &response[at + 4..];
    let client_error = head
        .split_whitespace()
        .nth(1)
        .is_some_and(|status| status.starts_with('4'));
    if !client_error {
        return false;
    }
    let chunked = head
        .lines()
        .any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return false;
    };
    let error_type = json["__type"].as_str().unwrap_or_default();
    let error_type = error_type.rsplit('#').next().unwrap_or_default();
    match error_type {
        "ConditionalCheckFailedException" => true,
        "TransactionCanceledException" => {
            json["CancellationReasons"]
                .as_array()
                .is_some_and(|reasons| {
                    reasons
                        .iter()
                        .any(|r| r["Code"].as_str() == Some("ConditionalCheckFailed"))
                })
        }
        _ => false,
    }
}

/// The relay id of a graceful stop's release, from a raw HTTP request: an `UpdateItem`
/// whose update removes the owner (`REMOVE #owner`) guarded by the owner alone (`:me`; a
/// round's planned releases also carry the expiry read, `:read`).
pub fn stop_release_of(request: &[u8]) -> Option<String> {
    let at = request.windows(4).position(|w| w == b"\r\n\r\n")?;
    let json: serde_json::Value = serde_json::from_slice(&request[at + 4..]).ok()?;
    let values = &json["ExpressionAttributeValues"];
    (json["UpdateExpression"] == "REMOVE #owner" && values.get(":read").is_none())
        .then(|| values[":me"]["S"].as_str().map(String::from))
        .flatten()
}

/// The payload of a chunked body (sizes in hex, each chunk followed by CRLF, a last
/// chunk of size 0).
fn dechunk(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size_line = String::from_utf8_lossy(&rest[..eol]);
        let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or("0"), 16)
            .unwrap_or(0);
        let after = &rest[eol + 2..];
        if size == 0 || after.len() < size {
            break;
        }
        out.extend_from_slice(&after[..size]);
        rest = after[size..]
            .strip_prefix(b"\r\n")
            .unwrap_or(&after[size..]);
    }
    out
}

/// A running proxy.
#[derive(Debug)]
pub struct HttpFaultProxy {
    addr: SocketAddr,
    enabled: Arc<AtomicBool>,
    /// Counters.
    pub stats: Arc<ProxyStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpFaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum Action {
    Forward,
    Throttle,
    ServerError,
    Drop,
    Slow(Duration),
}

impl HttpFaultProxy {
    /// Listens on a free loopback port and forwards to `upstream` (a loopback address).
    pub async fn start(upstream: SocketAddr, mix: FaultMix, seed: u64) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let enabled = Arc::new(AtomicBool::new(true));
        let stats = Arc::new(ProxyStats::default());
        let rng = Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)));
        let (en, st) = (enabled.clone(), stats.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (en, st, rng) = (en.clone(), st.clone(), rng.clone());
                tokio::spawn(async move {
                    let _ = serve(client, upstream, mix, en, st, rng).await;
                });
            }
        });
        Ok(HttpFaultProxy {
            addr,
            enabled,
            stats,
            task,
        })
    }

    /// The endpoint URL to give clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Turns fault injection on or off (off: a plain forwarder).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::SeqCst);
    }
}

fn choose(mix: &FaultMix, rng: &Mutex<rand::rngs::StdRng>) -> Action {
    let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
    let x: f64 = rng.gen();
    let mut edge = mix.throttle;
    if x < edge {
        return Action::Throttle;
    }
    edge += mix.server_error;
    if x < edge {
        return Action::ServerError;
    }
    edge += mix.drop_response;
    if x < edge {
        return Action::Drop;
    }
    edge += mix.slow;
    if x < edge {
        let ms = rng.gen_range(0..=mix.max_latency.as_millis() as u64);
        return Action::Slow(Duration::from_millis(ms));
    }
    Action::Forward
}

/// Reads one HTTP/1.1 message (head and body, by Content-Length or chunked), raw.
async fn read_message<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut raw = Vec::new();
    let mut content_length = 0usize;
    let mut chunked = false;
    let mut first = true;
    loop {
        let mut line = Vec::new();
        let n = r.read_until(b'\n', &mut line).await?;
        if n == 0 {
            return if first {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        first = false;
        raw.extend_from_slice(&line);
        let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
        let text = text.trim_end();
        if text.is_empty() {
            break;
        }
        if let Some(v) = text.strip_prefix("content-length:") {
            content_length = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = text.strip_prefix("transfer-encoding:") {
            chunked = v.contains("chunked");
        }
    }
    if chunked {
        loop {
            let mut size_line = Vec::new();
            r.read_until(b'\n', &mut size_line).await?;
            raw.extend_from_slice(&size_line);
            let size_text = String::from_utf8_lossy(&size_line);
            let size = usize::from_str_radix(size_text.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).await?;
            raw.extend_from_slice(&chunk);
            if size == 0 {
                break;
            }
        }
    } else if content_length > 0 {
        let mut body = vec![0; content_length];
        r.read_exact(&mut body).await?;
        raw.extend_from_slice(&body);
    }
    Ok(Some(raw))
}

fn error_response(status: &str, error_type: &str) -> Vec<u8> {
    let body = format!(
        "{{\"__type\":\"com.amazonaws.dynamodb.v20120810#{error_type}\",\"message\":\"injected by the outbox harness\"}}"
    );
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/x-amz-json-1.0\r\nx-amzn-ErrorType: {error_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    mix: FaultMix,
    enabled: Arc<AtomicBool>,
    stats: Arc<ProxyStats>,
    rng: Arc<Mutex<rand::rngs::StdRng>>,
) -> std::io::Result<()> {
    let (client_r, mut client_w) = client.into_split();
    let mut client_r = BufReader::new(client_r);
    let mut up: Option<(
        BufReader<tokio::net::tcp::OwnedReadHalf>,
        tokio::net::tcp::OwnedWriteHalf,
    )> = None;
    while let Some(request) = read_message(&mut client_r).await? {
        let on = enabled.load(Ordering::SeqCst);
        let action = if on {
            choose(&mix, &rng)
        } else {
            Action::Forward
        };
        if let (true, Some((min, max))) = (on, mix.hold_stop_releases) {
            if stop_release_of(&request).is_some() {
                stats.held_stop_releases.fetch_add(1, Ordering::Relaxed);
                let ms = {
                    let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
                    rng.gen_range(
                        min.as_millis() as u64..=max.as_millis().max(min.as_millis()) as u64,
                    )
                };
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
        }
        match action {
            Action::Throttle => {
                stats.throttled.fetch_add(1, Ordering::Relaxed);
                client_w
                    .write_all(&error_response("400 Bad Request", "ThrottlingException"))
                    .await?;
                continue;
            }
            Action::ServerError => {
                stats.server_errors.fetch_add(1, Ordering::Relaxed);
                client_w
                    .write_all(&error_response(
                        "500 Internal Server Error",
                        "InternalServerError",
                    ))
                    .await?;
                continue;
            }
            Action::Slow(d) => {
                stats.delayed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(d).await;
            }
            Action::Forward | Action::Drop => {}
        }
        if up.is_none() {
            let s = TcpStream::connect(upstream).await?;
            let (r, w) = s.into_split();
            up = Some((BufReader::new(r), w));
        }
        let (up_r, up_w) = up.as_mut().expect("connected above");
        stats.forwarded.fetch_add(1, Ordering::Relaxed);
        up_w.write_all(&request).await?;
        let Some(response) = read_message(up_r).await? else {
            return Ok(());
        };
        if matches!(action, Action::Drop) {
            // Applied upstream; the client never hears of it.
            stats.dropped_responses.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if refuses_condition(&response) {
            stats.condition_refused.fetch_add(1, Ordering::Relaxed);
            *stats
                .condition_refused_by_operation
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(operation(&request))
                .or_default() += 1;
        }
        client_w.write_all(&response).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_operation_of_a_request() {
        let request =
            b"POST / HTTP/1.1\r\nhost: x\r\nX-Amz-Target: DynamoDB_20120810.DeleteItem\r\n\r\n{}";
        assert_eq!(operation(request), "DeleteItem");
        assert_eq!(operation(b"POST / HTTP/1.1\r\n\r\n"), "unknown");
    }

    fn response(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[test]
    fn recognises_the_releases_of_a_graceful_stop() {
        let request = |body: &str| {
            format!(
                "POST / HTTP/1.1\r\nX-Amz-Target: DynamoDB_20120810.UpdateItem\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        };
        assert_eq!(
            stop_release_of(&request(
                r##"{"TableName":"t","UpdateExpression":"REMOVE #owner","ConditionExpression":"#owner = :me","ExpressionAttributeValues":{":me":{"S":"r1"}}}"##
            )),
            Some("r1".to_string())
        );
        // A round's planned release also names the expiry read.
        assert_eq!(
            stop_release_of(&request(
                r##"{"UpdateExpression":"REMOVE #owner","ExpressionAttributeValues":{":me":{"S":"r1"},":read":{"N":"5"}}}"##
            )),
            None
        );
        assert_eq!(
            stop_release_of(&request(
                r##"{"UpdateExpression":"SET #owner = :me","ExpressionAttributeValues":{":me":{"S":"r1"}}}"##
            )),
            None
        );
        assert_eq!(stop_release_of(b"POST / HTTP/1.1\r\n\r\n"), None);
    }

    #[test]
    fn tells_a_refused_condition_from_other_answers() {
        assert!(refuses_condition(&response(
            "400 Bad Request",
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"}"#
        )));
        assert!(refuses_condition(&response(
            "400 Bad Request",
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"Transaction cancelled","CancellationReasons":[{"Code":"None"},{"Code":"ConditionalCheckFailed"}]}"#
        )));
        assert!(!refuses_condition(&response(
            "400 Bad Request",
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"Transaction cancelled","CancellationReasons":[{"Code":"TransactionConflict"}]}"#
        )));
        assert!(!refuses_condition(&error_response(
            "400 Bad Request",
            "ThrottlingException"
        )));
        // A successful answer whose data happens to contain the words.
        assert!(!refuses_condition(&response(
            "200 OK",
            r#"{"Attributes":{"note":{"S":"ConditionalCheckFailedException"}}}"#
        )));
        assert!(!refuses_condition(b"HTTP/1.1 400 Bad Request\r\n"));
        let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"}"#;
        let (a, b) = body.split_at(20);
        let chunked = format!(
            "HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        assert!(refuses_condition(chunked.as_bytes()));
    }
}
