//! Request accounting: an `aws-sdk-dynamodb` interceptor that counts every HTTP attempt by
//! operation and outcome, so the cost model (requests per message, per idle round) can be
//! measured instead of assumed. DynamoDB bills attempts, retries included.
//!
//! Read operations (`Query`, `GetItem`, `Scan`) are also counted by consistency: a
//! strongly consistent read costs twice an eventually consistent one of the same size
//! (`RequestCounter::consistent_reads`).
//!
//! It also counts, by operation, the attempts DynamoDB answered with a refused condition
//! (`ConditionalCheckFailedException`, or a `TransactionCanceledException` one of whose
//! reasons is `ConditionalCheckFailed`), decided from the deserialized error of the attempt
//! itself: a count of refused conditional writes that does not depend on the relay's own
//! bookkeeping.
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
//! println!("{:?} refused: {:?}", counter.snapshot(), counter.refusals());
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::interceptors::{
    BeforeSerializationInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::execute_statement::ExecuteStatementError;
use aws_sdk_dynamodb::operation::execute_transaction::ExecuteTransactionError;
use aws_sdk_dynamodb::operation::get_item::GetItemInput;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::query::QueryInput;
use aws_sdk_dynamodb::operation::scan::ScanInput;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::error::TransactionCanceledException;
use aws_smithy_runtime_api::client::interceptors::context::Error as OperationError;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::retries::RequestAttempts;
use aws_smithy_types::config_bag::{Storable, StoreReplace};

/// The error code of a refused condition of a single-item write.
pub const CONDITIONAL_CHECK_FAILED: &str = "ConditionalCheckFailedException";
/// The error code of a cancelled transaction.
pub const TRANSACTION_CANCELED: &str = "TransactionCanceledException";
/// The cancellation reason code of a refused condition inside a transaction.
pub const CONDITIONAL_CHECK_FAILED_REASON: &str = "ConditionalCheckFailed";

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

/// Attempts of one operation that DynamoDB answered with a refused condition, split by
/// whether the attempt was the operation's first or an SDK retry (a retry of a write that
/// applied but whose answer was lost is refused by its own effect).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refusals {
    /// Refused on the operation's first attempt.
    pub first_attempt: u64,
    /// Refused on a retry by the SDK.
    pub retry: u64,
}

impl Refusals {
    /// Every refused attempt.
    pub fn total(&self) -> u64 {
        self.first_attempt + self.retry
    }
}

/// Whether a DynamoDB error is a refused condition: its code is
/// [`CONDITIONAL_CHECK_FAILED`], or it is [`TRANSACTION_CANCELED`] and one of the
/// cancellation reasons' codes is [`CONDITIONAL_CHECK_FAILED_REASON`] (a transaction
/// cancelled only by a conflict or a throttle is not a refused condition).
pub fn is_condition_refusal<'a>(
    code: Option<&str>,
    cancellation_reasons: impl IntoIterator<Item = Option<&'a str>>,
) -> bool {
    match code {
        Some(CONDITIONAL_CHECK_FAILED) => true,
        Some(TRANSACTION_CANCELED) => cancellation_reasons
            .into_iter()
            .any(|r| r == Some(CONDITIONAL_CHECK_FAILED_REASON)),
        _ => false,
    }
}

fn cancelled_by_condition(e: &TransactionCanceledException) -> bool {
    is_condition_refusal(
        Some(TRANSACTION_CANCELED),
        e.cancellation_reasons().iter().map(|r| r.code()),
    )
}

/// Whether the type-erased error of an attempt is a refused condition, for the DynamoDB
/// operations that carry conditions (`UpdateItem`, `PutItem`, `DeleteItem`,
/// `TransactWriteItems`, `ExecuteStatement`, `ExecuteTransaction`): the operation's
/// modelled variant, or (for an error the SDK did not model) its error code. Any other
/// error is not.
pub fn refused_condition(error: &OperationError) -> bool {
    if let Some(e) = error.downcast_ref::<UpdateItemError>() {
        e.is_conditional_check_failed_exception() || is_condition_refusal(e.code(), [])
    } else if let Some(e) = error.downcast_ref::<PutItemError>() {
        e.is_conditional_check_failed_exception() || is_condition_refusal(e.code(), [])
    } else if let Some(e) = error.downcast_ref::<DeleteItemError>() {
        e.is_conditional_check_failed_exception() || is_condition_refusal(e.code(), [])
    } else if let Some(e) = error.downcast_ref::<ExecuteStatementError>() {
        e.is_conditional_check_failed_exception() || is_condition_refusal(e.code(), [])
    } else if let Some(e) = error.downcast_ref::<TransactWriteItemsError>() {
        match e {
            TransactWriteItemsError::TransactionCanceledException(c) => cancelled_by_condition(c),
            other => is_condition_refusal(other.code(), []),
        }
    } else if let Some(e) = error.downcast_ref::<ExecuteTransactionError>() {
        match e {
            ExecuteTransactionError::TransactionCanceledException(c) => cancelled_by_condition(c),
            other => is_condition_refusal(other.code(), []),
        }
    } else {
        false
    }
}

#[derive(Debug, Default)]
struct Counts {
    attempts: BTreeMap<String, Attempts>,
    refusals: BTreeMap<String, Refusals>,
    consistent_reads: BTreeMap<String, u64>,
}

/// Whether the operation being sent is a strongly consistent read, noted before its input
/// is serialized (the input is gone when the attempt is counted).
#[derive(Debug, Clone, Copy)]
struct ConsistentRead(bool);

impl Storable for ConsistentRead {
    type Storer = StoreReplace<Self>;
}

/// Whether the type-erased input of an operation is a read with `ConsistentRead: true`.
fn consistent_read(input: &aws_smithy_runtime_api::client::interceptors::context::Input) -> bool {
    if let Some(q) = input.downcast_ref::<QueryInput>() {
        q.consistent_read() == Some(true)
    } else if let Some(g) = input.downcast_ref::<GetItemInput>() {
        g.consistent_read() == Some(true)
    } else if let Some(s) = input.downcast_ref::<ScanInput>() {
        s.consistent_read() == Some(true)
    } else {
        false
    }
}

/// Counts DynamoDB attempts by operation name (`Query`, `UpdateItem`, ...), and the
/// attempts answered with a refused condition. Clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    counts: Arc<Mutex<Counts>>,
}

impl RequestCounter {
    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counts so far.
    pub fn snapshot(&self) -> BTreeMap<String, Attempts> {
        self.lock().attempts.clone()
    }

    /// Attempts of one operation so far.
    pub fn get(&self, operation: &str) -> Attempts {
        self.lock()
            .attempts
            .get(operation)
            .copied()
            .unwrap_or_default()
    }

    /// Every attempt so far.
    pub fn total(&self) -> u64 {
        self.lock().attempts.values().map(Attempts::total).sum()
    }

    /// Attempts answered with a refused condition so far, by operation (operations without
    /// one are absent).
    pub fn refusals(&self) -> BTreeMap<String, Refusals> {
        self.lock().refusals.clone()
    }

    /// Attempts of one operation answered with a refused condition so far.
    pub fn refused(&self, operation: &str) -> Refusals {
        self.lock()
            .refusals
            .get(operation)
            .copied()
            .unwrap_or_default()
    }

    /// Every attempt answered with a refused condition so far.
    pub fn refused_total(&self) -> u64 {
        self.lock().refusals.values().map(Refusals::total).sum()
    }

    /// Attempts of strongly consistent reads so far, by operation (`Query`, `GetItem`,
    /// `Scan`; the rest of each operation's attempts were eventually consistent).
    pub fn consistent_reads(&self) -> BTreeMap<String, u64> {
        self.lock().consistent_reads.clone()
    }

    /// Forgets the counts.
    pub fn reset(&self) {
        let mut counts = self.lock();
        counts.attempts.clear();
        counts.refusals.clear();
        counts.consistent_reads.clear();
    }

    /// An attempt that is no strongly consistent read (the unit tests' shorthand).
    #[cfg(test)]
    fn record(&self, operation: &str, status: Option<u16>, refused: Option<u32>) {
        self.record_read(operation, status, refused, false);
    }

    /// Counts one attempt: its HTTP status (`None`: no answer); when `refused` is
    /// `Some(attempt)`, a refused condition on attempt number `attempt` (1 = the first);
    /// when `consistent`, a strongly consistent read.
    fn record_read(
        &self,
        operation: &str,
        status: Option<u16>,
        refused: Option<u32>,
        consistent: bool,
    ) {
        let mut counts = self.lock();
        if consistent {
            *counts
                .consistent_reads
                .entry(operation.to_string())
                .or_default() += 1;
        }
        counts
            .attempts
            .entry(operation.to_string())
            .or_default()
            .record(status);
        if let Some(attempt) = refused {
            let r = counts.refusals.entry(operation.to_string()).or_default();
            if attempt <= 1 {
                r.first_attempt += 1;
            } else {
                r.retry += 1;
            }
        }
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_serialization(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let consistent = consistent_read(context.input());
        cfg.interceptor_state()
            .store_put(ConsistentRead(consistent));
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let operation = cfg.load::<Metadata>().map_or("unknown", |m| m.name());
        let status = context.response().map(|r| r.status().as_u16());
        let refused = match context.output_or_error() {
            Some(Err(e)) => e.as_operation_error().is_some_and(refused_condition),
            _ => false,
        };
        let attempt = cfg.load::<RequestAttempts>().map_or(1, |a| a.attempts());
        let consistent = cfg.load::<ConsistentRead>().is_some_and(|c| c.0);
        self.record_read(operation, status, refused.then_some(attempt), consistent);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::types::error::ConditionalCheckFailedException;
    use aws_sdk_dynamodb::types::CancellationReason;

    #[test]
    fn counts_by_outcome() {
        let c = RequestCounter::default();
        c.record("Query", Some(200), None);
        c.record("Query", Some(400), None);
        c.record("UpdateItem", Some(500), None);
        c.record("UpdateItem", None, None);
        c.record("UpdateItem", Some(400), Some(1));
        c.record("UpdateItem", Some(400), Some(2));
        assert_eq!(
            c.get("Query"),
            Attempts {
                ok: 1,
                client_error: 1,
                server_error: 0
            }
        );
        assert_eq!(c.get("UpdateItem").server_error, 2);
        assert_eq!(c.get("UpdateItem").client_error, 2);
        assert_eq!(c.total(), 6);
        assert_eq!(
            c.refused("UpdateItem"),
            Refusals {
                first_attempt: 1,
                retry: 1
            }
        );
        assert_eq!(c.refused("Query"), Refusals::default());
        assert_eq!(c.refused_total(), 2);
        assert_eq!(c.refusals().len(), 1);
        c.reset();
        assert_eq!((c.total(), c.refused_total()), (0, 0));
    }

    #[test]
    fn a_refusal_is_a_failed_condition_or_a_transaction_cancelled_by_one() {
        assert!(is_condition_refusal(Some(CONDITIONAL_CHECK_FAILED), []));
        assert!(is_condition_refusal(
            Some(TRANSACTION_CANCELED),
            [Some("None"), Some("ConditionalCheckFailed")]
        ));
        assert!(!is_condition_refusal(
            Some(TRANSACTION_CANCELED),
            [Some("None"), Some("TransactionConflict")]
        ));
        assert!(!is_condition_refusal(Some(TRANSACTION_CANCELED), []));
        assert!(!is_condition_refusal(Some("ThrottlingException"), []));
        assert!(!is_condition_refusal(Some("ValidationException"), []));
        assert!(!is_condition_refusal(None, []));
    }

    fn ccf() -> ConditionalCheckFailedException {
        ConditionalCheckFailedException::builder()
            .message("The conditional request failed")
            .build()
    }

    fn cancelled(reasons: &[&str]) -> TransactionCanceledException {
        reasons
            .iter()
            .fold(TransactionCanceledException::builder(), |b, r| {
                b.cancellation_reasons(CancellationReason::builder().code(*r).build())
            })
            .message("Transaction cancelled")
            .build()
    }

    #[test]
    fn decides_from_the_operations_own_error() {
        assert!(refused_condition(&OperationError::erase(
            UpdateItemError::ConditionalCheckFailedException(ccf())
        )));
        assert!(refused_condition(&OperationError::erase(
            PutItemError::ConditionalCheckFailedException(ccf())
        )));
        assert!(refused_condition(&OperationError::erase(
            DeleteItemError::ConditionalCheckFailedException(ccf())
        )));
        assert!(refused_condition(&OperationError::erase(
            TransactWriteItemsError::TransactionCanceledException(cancelled(&[
                "None",
                "ConditionalCheckFailed"
            ]))
        )));
        assert!(!refused_condition(&OperationError::erase(
            TransactWriteItemsError::TransactionCanceledException(cancelled(&[
                "TransactionConflict"
            ]))
        )));
        assert!(!refused_condition(&OperationError::erase(
            UpdateItemError::ThrottlingException(
                aws_sdk_dynamodb::types::error::ThrottlingException::builder().build()
            )
        )));
        // An error of an operation without conditions.
        assert!(!refused_condition(&OperationError::erase(
            aws_sdk_dynamodb::operation::query::QueryError::unhandled("boom")
        )));
    }

    /// A client whose every attempt is answered by `answer(attempt number)` (status, body),
    /// without a network: the whole interceptor, on the SDK's own deserialized errors.
    fn canned_client(
        counter: &RequestCounter,
        answer: impl Fn(usize) -> (u16, &'static str) + Send + Sync + 'static,
    ) -> aws_sdk_dynamodb::Client {
        use aws_sdk_dynamodb::config::retry::RetryConfig;
        use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
        use aws_smithy_runtime_api::client::http::{
            http_client_fn, HttpConnector, HttpConnectorFuture, SharedHttpConnector,
        };
        use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
        use std::sync::atomic::{AtomicUsize, Ordering};

        struct Canned<F> {
            answer: F,
            calls: AtomicUsize,
        }
        impl<F> std::fmt::Debug for Canned<F> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Canned")
            }
        }
        impl<F: Fn(usize) -> (u16, &'static str) + Send + Sync> HttpConnector for Canned<F> {
            fn call(&self, _request: HttpRequest) -> HttpConnectorFuture {
                let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
                let (status, body) = (self.answer)(n);
                let mut response = HttpResponse::new(
                    status.try_into().expect("status"),
                    aws_smithy_types::body::SdkBody::from(body),
                );
                response
                    .headers_mut()
                    .insert("content-type", "application/x-amz-json-1.0");
                HttpConnectorFuture::ready(Ok(response))
            }
        }
        let connector = SharedHttpConnector::new(Canned {
            answer,
            calls: AtomicUsize::new(0),
        });
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("AKID", "SECRET", None, None, "test"))
            .endpoint_url("http://127.0.0.1:1")
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(3)
                    .with_initial_backoff(std::time::Duration::from_millis(1)),
            )
            .http_client(http_client_fn(move |_, _| connector.clone()))
            .interceptor(counter.clone())
            .build();
        aws_sdk_dynamodb::Client::from_conf(config)
    }

    const CCF_BODY: &str = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"}"#;
    const CANCELLED_BY_CONDITION: &str = r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"Transaction cancelled, please refer cancellation reasons for specific reasons [None, ConditionalCheckFailed]","CancellationReasons":[{"Code":"None"},{"Code":"ConditionalCheckFailed","Message":"The conditional request failed"}]}"#;
    const CANCELLED_BY_CONFLICT: &str = r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict]","CancellationReasons":[{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"}]}"#;
    const SERVER_ERROR: &str =
        r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}"#;

    #[tokio::test]
    async fn strongly_consistent_reads_are_counted_apart_retries_included() {
        let counter = RequestCounter::default();
        let client = canned_client(&counter, |_| (200, "{}"));
        for consistent in [Some(true), Some(false), None, Some(true)] {
            client
                .query()
                .table_name("t")
                .set_consistent_read(consistent)
                .send()
                .await
                .unwrap();
        }
        client
            .get_item()
            .table_name("t")
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        client.update_item().table_name("t").send().await.unwrap();
        // A strong query retried after a server error: each attempt is billed and counted.
        let retried = canned_client(&counter, |n| {
            if n == 1 {
                (500, SERVER_ERROR)
            } else {
                (200, "{}")
            }
        });
        retried
            .query()
            .table_name("t")
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        assert_eq!(counter.get("Query").total(), 6);
        assert_eq!(
            counter.consistent_reads(),
            BTreeMap::from([("GetItem".to_string(), 1), ("Query".to_string(), 4)])
        );
    }

    #[tokio::test]
    async fn the_interceptor_counts_refusals_from_the_deserialized_answer() {
        let counter = RequestCounter::default();
        let client = canned_client(&counter, |_| (400, CCF_BODY));
        let e = client
            .update_item()
            .table_name("t")
            .send()
            .await
            .unwrap_err();
        assert!(e
            .into_service_error()
            .is_conditional_check_failed_exception());
        let _ = client.put_item().table_name("t").send().await.unwrap_err();
        assert_eq!(counter.refused("UpdateItem").total(), 1);
        assert_eq!(counter.refused("PutItem").total(), 1);
        assert_eq!(counter.get("UpdateItem").client_error, 1, "not retried");

        let counter = RequestCounter::default();
        let client = canned_client(&counter, |_| (400, CANCELLED_BY_CONDITION));
        let _ = client.transact_write_items().send().await.unwrap_err();
        let client_conflict = canned_client(&counter, |_| (400, CANCELLED_BY_CONFLICT));
        // A transaction cancelled by a conflict: not a refused condition, however often sent.
        let _ = client_conflict
            .transact_write_items()
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            counter.refusals(),
            BTreeMap::from([(
                "TransactWriteItems".to_string(),
                Refusals {
                    first_attempt: 1,
                    retry: 0
                }
            )])
        );
        assert!(
            counter.get("TransactWriteItems").client_error >= 2,
            "{:?}",
            counter.snapshot()
        );

        // An answer that is not an error, and a server error, are not refusals.
        let counter = RequestCounter::default();
        let client = canned_client(&counter, |_| (200, "{}"));
        client.update_item().table_name("t").send().await.unwrap();
        let client = canned_client(&counter, |_| (500, SERVER_ERROR));
        let _ = client
            .delete_item()
            .table_name("t")
            .send()
            .await
            .unwrap_err();
        assert_eq!(counter.refused_total(), 0, "{:?}", counter.refusals());
        assert_eq!(counter.get("UpdateItem").ok, 1);
        assert_eq!(counter.get("DeleteItem").server_error, 3, "retried twice");
    }

    #[tokio::test]
    async fn a_refusal_on_a_retry_is_told_apart() {
        let counter = RequestCounter::default();
        // The first attempt fails with a 500 (the write may have applied), the retry is refused.
        let client = canned_client(&counter, |n| {
            if n == 1 {
                (500, SERVER_ERROR)
            } else {
                (400, CCF_BODY)
            }
        });
        let _ = client
            .update_item()
            .table_name("t")
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            counter.refused("UpdateItem"),
            Refusals {
                first_attempt: 0,
                retry: 1
            }
        );
        assert_eq!(counter.get("UpdateItem").total(), 2);
    }
}
