//! Request accounting: an `aws-sdk-dynamodb` interceptor that counts every HTTP attempt by
//! operation and outcome, so the cost model (requests per message, per idle round) can be
//! measured instead of assumed. DynamoDB bills attempts, retries included.
//!
//! ```no_run
//! # async fn f() {
//! use dynamo_outbox::accounting::RequestCounter;
//! let counter = RequestCounter::default();
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let client = aws_sdk_dynamodb::Client::from_conf(
//!     aws_sdk_dynamodb::config::Builder::from(&config)
//!         .interceptor(counter.clone())
//!         .build(),
//! );
//! // ... use the client ...
//! println!("{:?}", counter.snapshot());
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::interceptors::FinalizerInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::client::orchestrator::Metadata;

/// Attempts of one operation, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attempts {
    /// Answered with a 2xx status.
    pub ok: u64,
    /// Answered with a 4xx status (refused conditions, throttling, validation).
    pub client_error: u64,
    /// Answered with a 5xx status, or not answered at all (timeout, connection).
    pub server_error: u64,
}

impl Attempts {
    /// Every attempt.
    pub fn total(&self) -> u64 {
        self.ok + self.client_error + self.server_error
    }

    /// Counts one attempt by its HTTP status (`None`: no answer).
    pub fn record(&mut self, status: Option<u16>) {
        match status {
            Some(s) if (200..300).contains(&s) => self.ok += 1,
            Some(s) if (400..500).contains(&s) => self.client_error += 1,
            _ => self.server_error += 1,
        }
    }

    /// `self - earlier`, outcome by outcome.
    pub fn since(&self, earlier: &Attempts) -> Attempts {
        Attempts {
            ok: self.ok - earlier.ok,
            client_error: self.client_error - earlier.client_error,
            server_error: self.server_error - earlier.server_error,
        }
    }
}

/// Counts DynamoDB attempts by operation name (`Query`, `UpdateItem`, ...). Clones share
/// the counts.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    counts: Arc<Mutex<BTreeMap<String, Attempts>>>,
}

impl RequestCounter {
    /// The counts so far.
    pub fn snapshot(&self) -> BTreeMap<String, Attempts> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Attempts of one operation so far.
    pub fn get(&self, operation: &str) -> Attempts {
        self.snapshot().get(operation).copied().unwrap_or_default()
    }

    /// Every attempt so far.
    pub fn total(&self) -> u64 {
        self.snapshot().values().map(Attempts::total).sum()
    }

    /// Forgets the counts.
    pub fn reset(&self) {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn record(&self, operation: &str, status: Option<u16>) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts
            .entry(operation.to_string())
            .or_default()
            .record(status);
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let operation = cfg.load::<Metadata>().map_or("unknown", |m| m.name());
        let status = context.response().map(|r| r.status().as_u16());
        self.record(operation, status);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_outcome() {
        let c = RequestCounter::default();
        c.record("Query", Some(200));
        c.record("Query", Some(400));
        c.record("UpdateItem", Some(500));
        c.record("UpdateItem", None);
        assert_eq!(
            c.get("Query"),
            Attempts {
                ok: 1,
                client_error: 1,
                server_error: 0
            }
        );
        assert_eq!(c.get("UpdateItem").server_error, 2);
        assert_eq!(c.total(), 4);
        c.reset();
        assert_eq!(c.total(), 0);
    }
}
