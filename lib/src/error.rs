//! Errors of the library, one enum, split by what the caller can do about them.

use std::error::Error as StdError;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::RequestId as _;
use aws_smithy_runtime_api::http::Response as HttpResponse;

/// A boxed source error (an SDK error, an I/O error) kept whole, never flattened into text.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the outbox.
///
/// The variants say what the caller can do: fix the input ([`Error::InvalidOption`],
/// [`Error::InvalidMessage`], [`Error::Limit`]), fix the deployment
/// ([`Error::Misconfiguration`]), retry later ([`Error::DynamoDb`] with
/// [`Error::is_retryable`]), or accept a lost race ([`Error::ConditionFailed`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An option broke a rule; `field` names it (the environment variable or struct field).
    #[error("{field}: {rule}")]
    InvalidOption {
        /// The option's name.
        field: String,
        /// The rule it broke.
        rule: String,
    },
    /// A message (or a request carrying messages) broke a rule; `field` names the part.
    #[error("{field}: {rule}")]
    InvalidMessage {
        /// The offending field, e.g. `messages[3].topic`.
        field: String,
        /// The rule it broke.
        rule: String,
    },
    /// A DynamoDB limit would be exceeded; checked before any request is sent.
    #[error("{what}: {actual} exceeds the limit of {limit}")]
    Limit {
        /// What is limited (`item size in bytes`, `items in one transaction`).
        what: String,
        /// The value the request would have.
        actual: usize,
        /// DynamoDB's limit.
        limit: usize,
    },
    /// The deployment disagrees with itself (bucket counts, key schema, a secret's
    /// content, a certificate); retrying will not help.
    #[error("misconfiguration: {reason}")]
    Misconfiguration {
        /// What is wrong, and what to change.
        reason: String,
        /// The error that revealed it (an SDK or I/O error, a TLS library's refusal), when
        /// there is one. Errors about a secret's content keep none: the parser's message
        /// could quote the secret.
        #[source]
        source: Option<BoxError>,
    },
    /// An item in the table cannot be read as what its key says it is.
    #[error("unreadable item {pk}/{sk}: {reason}")]
    Corrupt {
        /// Partition key of the item.
        pk: String,
        /// Sort key of the item.
        sk: String,
        /// What is wrong with it.
        reason: String,
        /// The decoding error, when there is one (an unreadable header blob).
        #[source]
        source: Option<BoxError>,
    },
    /// A conditional write was refused: a lost race, a lost lease, or a stale heartbeat.
    #[error("conditional {operation} refused")]
    #[non_exhaustive]
    ConditionFailed {
        /// The operation (`heartbeat`, `renew`, `release`, `claim`, `put`).
        operation: &'static str,
        /// The AWS request id of the refused request (what AWS support asks for), when the
        /// response carried one.
        request_id: Option<String>,
        /// The SDK error (`ConditionalCheckFailedException`).
        #[source]
        source: BoxError,
    },
    /// A transaction was cancelled; `reasons` holds each item's cancellation code, in
    /// request order (`None` for items that were not the cause).
    #[error("transaction cancelled: [{}]", reasons.join(", "))]
    #[non_exhaustive]
    TransactionCanceled {
        /// Cancellation code per item (`ConditionalCheckFailed`, `TransactionConflict`, ...).
        reasons: Vec<String>,
        /// Whether a retry may succeed (conflicts, throttling), as opposed to a failed condition.
        retryable: bool,
        /// The AWS request id of the cancelled request, when the response carried one.
        request_id: Option<String>,
        /// The SDK error (with the cancellation messages).
        #[source]
        source: BoxError,
    },
    /// A DynamoDB request failed.
    #[error("dynamodb {operation} failed{}", if *.retryable { " (retryable)" } else { "" })]
    #[non_exhaustive]
    DynamoDb {
        /// The API operation.
        operation: &'static str,
        /// Whether the failure is transient (throttling, 5xx, timeouts).
        retryable: bool,
        /// The AWS request id of the failed request, when a response carried one.
        request_id: Option<String>,
        /// The SDK error.
        #[source]
        source: BoxError,
    },
    /// A request to AWS Lambda failed (a relay starting its successor).
    #[error("lambda {operation} failed")]
    Lambda {
        /// The API operation.
        operation: &'static str,
        /// The SDK error.
        #[source]
        source: BoxError,
    },
    /// Publishing to Kafka failed.
    #[error("kafka: {message}")]
    Kafka {
        /// What was being done.
        message: String,
        /// Whether another try may succeed (connection lost, leader moved).
        retryable: bool,
        /// The client error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The broker refused one record for good (see [`Rejection`]): retrying the same record
    /// will not help, but the records after it are unaffected. A publisher reports it for the
    /// first record it did not acknowledge, so the relay can set that record aside.
    #[error("kafka rejected a record for topic {topic}: {reason}")]
    KafkaRejected {
        /// The record's topic.
        topic: String,
        /// Why the record cannot be published.
        reason: Rejection,
        /// The client error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The brokers refused the publisher's principal on a topic (an ACL or IAM permission
    /// is missing): retryable, never a rejection of the records. An operator's grant ends
    /// it, so the relay retries it after its error backoff like any transient failure,
    /// under every poison policy: it parks no bucket and quarantines nothing.
    #[error("kafka: {denied}")]
    KafkaNotAuthorized {
        /// Who was refused what, on which topic.
        denied: NotAuthorized,
        /// The client error.
        #[source]
        source: Option<BoxError>,
    },
    /// The caller's deadline passed before the work could finish.
    #[error("deadline passed during {0}")]
    DeadlineExceeded(&'static str),
}

/// An authorization the brokers refused (see [`Error::KafkaNotAuthorized`]): what the
/// relay logs and reports as metrics, so that an operator knows what to grant to whom.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotAuthorized {
    /// The topic of the refused request.
    pub topic: String,
    /// Who the publisher authenticates as (`User:NAME` with SCRAM or PLAIN, `User:` and the
    /// client certificate's subject with mutual TLS, `msk-iam`, `User:ANONYMOUS`): see
    /// [`KafkaPublisher::principal`](crate::publish::KafkaPublisher::principal).
    pub principal: String,
    /// The Kafka ACL operation the refused request needs: `DESCRIBE` for the topic's
    /// metadata, `WRITE` for a produce.
    pub operation: &'static str,
    /// The broker's error code.
    pub failure: AuthorizationFailure,
}

impl NotAuthorized {
    /// `principal` may not do `operation` (a Kafka ACL operation) on `topic`: the brokers
    /// answered `failure`.
    pub fn new(
        topic: impl Into<String>,
        principal: impl Into<String>,
        operation: &'static str,
        failure: AuthorizationFailure,
    ) -> Self {
        NotAuthorized {
            topic: topic.into(),
            principal: principal.into(),
            operation,
            failure,
        }
    }
}

impl std::fmt::Display for NotAuthorized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let NotAuthorized {
            topic,
            principal,
            operation,
            failure,
        } = self;
        match failure {
            AuthorizationFailure::Topic => write!(
                f,
                "{failure}: {principal} may not {operation} topic {topic} (grant it, through \
                 an ACL or an IAM policy; publishing retries until then)"
            ),
            // Not the topic's ACL: the refused resource is the cluster, a group, a
            // transactional id or a token, met while publishing to the topic.
            _ => write!(
                f,
                "{failure}: {principal} was refused by the brokers while publishing to topic \
                 {topic} (grant the principal what the failure names, through an ACL or an \
                 IAM policy; publishing retries until then)"
            ),
        }
    }
}

impl std::error::Error for NotAuthorized {}

/// The broker's error code of a refused authorization (Kafka's protocol error names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorizationFailure {
    /// The principal lacks the operation on the topic.
    #[error("TOPIC_AUTHORIZATION_FAILED")]
    Topic,
    /// The principal lacks the operation on the cluster.
    #[error("CLUSTER_AUTHORIZATION_FAILED")]
    Cluster,
    /// The principal lacks the operation on a transactional id.
    #[error("TRANSACTIONAL_ID_AUTHORIZATION_FAILED")]
    TransactionalId,
    /// The principal lacks the operation on a consumer group.
    #[error("GROUP_AUTHORIZATION_FAILED")]
    Group,
    /// The principal lacks the operation on a delegation token.
    #[error("DELEGATION_TOKEN_AUTHORIZATION_FAILED")]
    DelegationToken,
}

/// Why Kafka will never accept a record (see [`Error::KafkaRejected`]). A missing
/// authorization is not among them: an operator can grant it, so it is
/// [`Error::KafkaNotAuthorized`], which is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The record (or, alone in its request, its batch) exceeds the broker's or topic's size limit.
    #[error("record too large")]
    TooLarge,
    /// The topic does not exist.
    #[error("unknown topic")]
    UnknownTopic,
    /// The explicit partition does not exist in the topic.
    #[error("unknown partition")]
    UnknownPartition,
    /// The broker found the record itself invalid (timestamp, format, a broker policy).
    #[error("invalid record")]
    InvalidRecord,
}

impl Error {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::DynamoDb { retryable, .. }
            | Error::Kafka { retryable, .. }
            | Error::TransactionCanceled { retryable, .. } => *retryable,
            Error::DeadlineExceeded(_)
            | Error::Lambda { .. }
            | Error::KafkaNotAuthorized { .. } => true,
            _ => false,
        }
    }

    /// The `errorType` a function reports for this error: what the caller can do about it.
    ///
    /// `ValidationError` (fix the request: [`Error::InvalidMessage`], [`Error::Limit`]),
    /// `Misconfiguration` (fix the deployment: [`Error::InvalidOption`],
    /// [`Error::Misconfiguration`]), `DynamoDb`, `Kafka`, `Lambda` or `DeadlineExceeded`.
    pub fn error_type(&self) -> &'static str {
        match self {
            Error::InvalidMessage { .. } | Error::Limit { .. } => "ValidationError",
            Error::InvalidOption { .. } | Error::Misconfiguration { .. } => "Misconfiguration",
            Error::DynamoDb { .. }
            | Error::ConditionFailed { .. }
            | Error::TransactionCanceled { .. }
            | Error::Corrupt { .. } => "DynamoDb",
            Error::Kafka { .. }
            | Error::KafkaRejected { .. }
            | Error::KafkaNotAuthorized { .. } => "Kafka",
            Error::Lambda { .. } => "Lambda",
            Error::DeadlineExceeded(_) => "DeadlineExceeded",
        }
    }

    /// The AWS request id of a failed DynamoDB request ([`Error::DynamoDb`],
    /// [`Error::ConditionFailed`], [`Error::TransactionCanceled`]), when the response
    /// carried one: what AWS support asks for.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Error::DynamoDb { request_id, .. }
            | Error::ConditionFailed { request_id, .. }
            | Error::TransactionCanceled { request_id, .. } => request_id.as_deref(),
            _ => None,
        }
    }

    /// [`Error::Misconfiguration`] without a source.
    pub(crate) fn misconfigured(reason: impl Into<String>) -> Self {
        Error::Misconfiguration {
            reason: reason.into(),
            source: None,
        }
    }

    /// [`Error::Misconfiguration`] revealed by `source`.
    pub(crate) fn misconfigured_by(reason: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Misconfiguration {
            reason: reason.into(),
            source: Some(source.into()),
        }
    }

    /// Shorthand for [`Error::InvalidOption`].
    pub(crate) fn option(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::InvalidOption {
            field: field.into(),
            rule: rule.into(),
        }
    }

    /// Shorthand for [`Error::InvalidMessage`].
    pub(crate) fn message(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::InvalidMessage {
            field: field.into(),
            rule: rule.into(),
        }
    }
}

/// An error's text followed by its sources, `: `-separated (how the functions and
/// `outboxctl` report errors).
pub fn chain(e: &dyn StdError) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Why an item cannot be read, for a report that already names the item: the reason of an
/// [`Error::Corrupt`] (and its source's chain), else the whole error's chain.
pub(crate) fn unreadable_because(e: &Error) -> String {
    match e {
        Error::Corrupt {
            reason,
            source: None,
            ..
        } => reason.clone(),
        Error::Corrupt {
            reason,
            source: Some(source),
            ..
        } => format!("{reason}: {}", chain(source.as_ref())),
        other => chain(other),
    }
}

/// Turns an SDK error into [`Error`], recognising refused conditions and transient
/// failures; the SDK error stays the source, its request id is kept.
pub(crate) fn from_sdk<E>(operation: &'static str, err: SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    let request_id = err.request_id().map(str::to_owned);
    let retryable = match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or_default();
            if code == "ConditionalCheckFailedException" {
                return Error::ConditionFailed {
                    operation,
                    request_id,
                    source: Box::new(err),
                };
            }
            matches!(
                code,
                "ProvisionedThroughputExceededException"
                    | "ThrottlingException"
                    | "RequestLimitExceeded"
                    | "InternalServerError"
                    | "ServiceUnavailable"
                    | "TransactionConflictException"
                    | "TransactionInProgressException"
            )
        }
        _ => false,
    };
    Error::DynamoDb {
        operation,
        retryable,
        request_id,
        source: Box::new(err),
    }
}

/// Turns a failed `TransactWriteItems` into [`Error`]: [`Error::TransactionCanceled`] with
/// each item's cancellation reason when DynamoDB cancelled the transaction, else as any
/// failed request. For a caller that sends the writer's
/// [`transact_write_items`](crate::writer::DynamoDbOutboxWriter::transact_write_items) in
/// its own transaction.
///
/// # Examples
/// ```no_run
/// # async fn example(client: aws_sdk_dynamodb::Client) -> dynamo_outbox::Result<()> {
/// use dynamo_outbox::error::transaction_error;
///
/// client
///     .transact_write_items()
///     // .transact_items(...): the business write and the writer's outbox items
///     .send()
///     .await
///     .map_err(transaction_error)?;
/// # Ok(())
/// # }
/// ```
pub fn transaction_error(err: SdkError<TransactWriteItemsError, HttpResponse>) -> Error {
    if let Some(TransactWriteItemsError::TransactionCanceledException(e)) = err.as_service_error() {
        let reasons: Vec<String> = e
            .cancellation_reasons()
            .iter()
            .map(|r| r.code().unwrap_or("None").to_string())
            .collect();
        let retryable = reasons.iter().any(|r| {
            matches!(
                r.as_str(),
                "TransactionConflict" | "ThrottlingError" | "ProvisionedThroughputExceeded"
            )
        });
        return Error::TransactionCanceled {
            reasons,
            retryable,
            request_id: err.request_id().map(str::to_owned),
            source: Box::new(err),
        };
    }
    from_sdk("TransactWriteItems", err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::operation::put_item::PutItemError;

    #[test]
    fn error_types_say_what_to_fix() {
        assert_eq!(Error::misconfigured("x").error_type(), "Misconfiguration");
        assert_eq!(
            Error::Limit {
                what: "item size".into(),
                actual: 2,
                limit: 1
            }
            .error_type(),
            "ValidationError"
        );
        assert_eq!(
            Error::DeadlineExceeded("x").error_type(),
            "DeadlineExceeded"
        );
    }

    /// A `PutItem` refused by DynamoDB with `code`, as the SDK returns it: the service's
    /// error and the raw response, whose headers carry the request id.
    fn refused_put(code: &str) -> SdkError<PutItemError, HttpResponse> {
        use aws_sdk_dynamodb::types::error::ConditionalCheckFailedException;
        use aws_smithy_runtime_api::http::StatusCode;
        use aws_smithy_types::body::SdkBody;
        use aws_smithy_types::error::ErrorMetadata;

        let meta = ErrorMetadata::builder()
            .code(code)
            .message("The conditional request failed")
            .build();
        let err = if code == "ConditionalCheckFailedException" {
            PutItemError::ConditionalCheckFailedException(
                ConditionalCheckFailedException::builder()
                    .message("The conditional request failed")
                    .meta(meta)
                    .build(),
            )
        } else {
            PutItemError::generic(meta)
        };
        let mut raw = HttpResponse::new(StatusCode::try_from(400).unwrap(), SdkBody::empty());
        raw.headers_mut().insert(
            "x-amzn-requestid",
            "8GRB5UQ1Q7OQ1PCM8GRB5UQ1Q7OQ1PCMVV4KQNSO5AEMVJF66Q9ASUAAJG",
        );
        SdkError::service_error(err, raw)
    }

    #[test]
    fn a_refused_condition_keeps_the_sdk_error_and_its_request_id() {
        let e = from_sdk("PutItem", refused_put("ConditionalCheckFailedException"));
        assert!(
            matches!(
                e,
                Error::ConditionFailed {
                    operation: "PutItem",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.request_id(),
            Some("8GRB5UQ1Q7OQ1PCM8GRB5UQ1Q7OQ1PCMVV4KQNSO5AEMVJF66Q9ASUAAJG")
        );
        assert!(!e.is_retryable());
        let source = e.source().expect("the SDK error is the source");
        let sdk = source
            .downcast_ref::<SdkError<PutItemError, HttpResponse>>()
            .expect("the SDK error itself, not a copy of its text");
        assert!(sdk
            .as_service_error()
            .is_some_and(PutItemError::is_conditional_check_failed_exception));
        assert!(
            chain(&e).starts_with("conditional PutItem refused: "),
            "{}",
            chain(&e)
        );
    }

    #[test]
    fn a_failed_request_keeps_the_sdk_error_and_its_request_id() {
        let e = from_sdk("PutItem", refused_put("ThrottlingException"));
        assert!(
            matches!(
                e,
                Error::DynamoDb {
                    retryable: true,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.request_id().is_some_and(|id| id.starts_with("8GRB5")));
        assert!(e.source().is_some_and(|s| s
            .downcast_ref::<SdkError<PutItemError, HttpResponse>>()
            .is_some()));
    }

    #[test]
    fn a_misconfiguration_keeps_what_revealed_it() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = Error::misconfigured_by("KAFKA_TLS_CA_FILE: /ca.pem: cannot be read", io);
        assert_eq!(
            e.to_string(),
            "misconfiguration: KAFKA_TLS_CA_FILE: /ca.pem: cannot be read"
        );
        assert_eq!(
            chain(&e),
            "misconfiguration: KAFKA_TLS_CA_FILE: /ca.pem: cannot be read: denied"
        );
        assert!(e
            .source()
            .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()));
        assert!(Error::misconfigured("x").source().is_none());
    }
}
