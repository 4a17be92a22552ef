//! The OTLP/HTTP transport of [`super::Telemetry`]: the HTTP client the OpenTelemetry
//! exporters send through (hyper, the client the AWS SDK already brings, TLS by rustls
//! with the system's roots for `https://`), the resource, and the tracer provider whose
//! spans (the Kafka publisher's publish spans) go to an OTLP/HTTP endpoint.
//!
//! The exporters run on threads of their own (the SDK's periodic reader and batch span
//! processor); each HTTP request runs on the tokio runtime the client was built on, and
//! gives up after its timeout. A failed or refused export is logged at `warn` and its data
//! dropped: telemetry never holds the relay up.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use opentelemetry::{Key, KeyValue};
use opentelemetry_http::HttpError;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

use crate::error::{Error, Result};

/// OTLP/HTTP requests on the runtime the client was built on, over hyper.
#[derive(Clone)]
pub(crate) struct OtlpHttpClient {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    endpoint: String,
    /// What it exports, for its log lines: `metrics` or `spans`.
    signal: &'static str,
}

impl std::fmt::Debug for OtlpHttpClient {
    // The requests carry OTEL_EXPORTER_OTLP_HEADERS (often a token): never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpHttpClient")
            .field("endpoint", &self.endpoint)
            .field("signal", &self.signal)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OtlpHttpClient {
    /// A client for `endpoint` (exporting `signal`) and any of `others`, each request
    /// bounded by `timeout`; the system's root certificates are loaded when one of them is
    /// `https://`. Must run inside a tokio runtime (the requests run on it).
    pub(crate) fn new(
        endpoint: &str,
        signal: &'static str,
        others: &[&str],
        timeout: Duration,
    ) -> Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        if let Some(https) = std::iter::once(endpoint)
            .chain(others.iter().copied())
            .find(|e| e.starts_with("https://"))
        {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(Error::misconfigured(format!(
                    "OTLP endpoint {https}: no trusted root certificates found on this system"
                )));
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::misconfigured(format!("OTLP TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        Ok(OtlpHttpClient {
            client,
            runtime: tokio::runtime::Handle::try_current()
                .map_err(|_| Error::misconfigured("the OTLP client needs a tokio runtime"))?,
            timeout,
            endpoint: endpoint.to_string(),
            signal,
        })
    }

    /// The same client (connections, runtime, timeout) for another `signal`'s `endpoint`.
    pub(crate) fn for_signal(&self, endpoint: &str, signal: &'static str) -> Self {
        OtlpHttpClient {
            endpoint: endpoint.to_string(),
            signal,
            ..self.clone()
        }
    }

    /// Each request's time limit.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The endpoint this client exports to.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OtlpHttpClient {
    async fn send_bytes(
        &self,
        request: Request<Bytes>,
    ) -> std::result::Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(body));
        let (client, timeout) = (self.client.clone(), self.timeout);
        // The exporter's thread has no runtime: the request runs on the client's.
        let exchange = self.runtime.spawn(async move {
            let response = tokio::time::timeout(timeout, async {
                let response = client.request(request).await?;
                let (parts, body) = response.into_parts();
                let body = body.collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            })
            .await;
            match response {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {} ms", timeout.as_millis()).into()),
            }
        });
        let result = match exchange.await {
            Ok(r) => r,
            Err(e) => Err(e.into()),
        };
        match &result {
            Ok(r) if !r.status().is_success() => tracing::warn!(
                endpoint = %self.endpoint,
                signal = self.signal,
                status = r.status().as_u16(),
                "OTLP export refused; these {} are dropped",
                self.signal
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                endpoint = %self.endpoint,
                signal = self.signal,
                error = %e,
                "OTLP export failed; these {} are dropped",
                self.signal
            ),
        }
        result
    }
}

/// The SDK's resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), with
/// `service.name` `default_service` and `service.instance.id` `instance_id` (when given)
/// where they are not set.
pub(crate) fn resource(default_service: &str, instance_id: Option<&str>) -> Resource {
    let detected = Resource::builder().build();
    let mut builder = Resource::builder();
    let service = detected.get(&Key::from_static_str("service.name"));
    if service.is_none_or(|s| s.as_str() == "unknown_service") {
        builder = builder.with_service_name(default_service.to_string());
    }
    if let Some(id) = instance_id {
        if detected
            .get(&Key::from_static_str("service.instance.id"))
            .is_none()
        {
            builder = builder.with_attribute(KeyValue::new("service.instance.id", id.to_string()));
        }
    }
    builder.build()
}

/// A tracer provider exporting its spans through `client` (to its endpoint, as protobuf)
/// with the SDK's batch span processor (`OTEL_BSP_*`), for `resource`. The caller installs
/// it as the global provider, which the Kafka publisher's spans go to, and flushes it.
pub(crate) fn tracer_provider(
    client: &OtlpHttpClient,
    resource: Resource,
) -> Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client.clone())
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(client.endpoint().to_string())
        .with_timeout(client.timeout())
        .build()
        .map_err(|e| Error::misconfigured(format!("OTLP span exporter: {e}")))?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}
