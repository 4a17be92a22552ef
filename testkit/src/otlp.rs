//! An OTLP/HTTP receiver for the tests of the OpenTelemetry export (metrics from
//! `outboxctl relay`, publish spans from `outboxctl relay` and the relay function): it
//! keeps every request as it came; each test decodes the bodies it expects with
//! `opentelemetry-proto`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct OtlpRequest {
    /// The request path (`/v1/metrics`, `/v1/traces`).
    pub path: String,
    /// The `content-type` header, empty when absent.
    pub content_type: String,
    /// The `authorization` header, empty when absent.
    pub authorization: String,
    /// The body (`content-length` bytes).
    pub body: Vec<u8>,
}

/// An OTLP/HTTP receiver on a free loopback port: answers every request of every
/// connection with 200 and an empty protobuf body, and keeps the requests in arrival
/// order.
#[derive(Debug, Clone)]
pub struct OtlpReceiver {
    /// `http://127.0.0.1:PORT`, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    requests: Arc<Mutex<Vec<OtlpRequest>>>,
}

impl OtlpReceiver {
    /// Starts the receiver on its own threads (one per connection); it runs until the
    /// test process ends.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
        let requests: Arc<Mutex<Vec<OtlpRequest>>> = Arc::default();
        let store = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let store = store.clone();
                std::thread::spawn(move || serve(stream, &store));
            }
        });
        OtlpReceiver { endpoint, requests }
    }

    /// The metrics exports so far (every request but the spans' `/v1/traces`).
    pub fn metrics_requests(&self) -> Vec<OtlpRequest> {
        self.requests_where(|path| path != TRACES_PATH)
    }

    /// The span exports so far (`/v1/traces`).
    pub fn trace_requests(&self) -> Vec<OtlpRequest> {
        self.requests_where(|path| path == TRACES_PATH)
    }

    fn requests_where(&self, keep: impl Fn(&str) -> bool) -> Vec<OtlpRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|r| keep(&r.path))
            .cloned()
            .collect()
    }
}

/// Where OTLP/HTTP exporters post spans.
const TRACES_PATH: &str = "/v1/traces";

/// Answers the requests of one connection until it closes.
fn serve(stream: TcpStream, store: &Mutex<Vec<OtlpRequest>>) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut stream = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        let (mut length, mut content_type, mut authorization) =
            (0usize, String::new(), String::new());
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "content-type" => content_type = value.trim().to_string(),
                "authorization" => authorization = value.trim().to_string(),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(OtlpRequest {
                path,
                content_type,
                authorization,
                body,
            });
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}
