//! What a failed Kafka request means for the publisher: retry it (after a metadata
//! refresh when the leader or the topic may have moved), set the records aside (the
//! brokers will never accept them), report a refused authorization (retried later, never
//! set aside: an operator's grant ends it), or give up (authentication, versions). The
//! verdict comes from the first broker error code or SASL failure in rskafka's error chain.

use rskafka::client::error::{Error as ClientError, ProtocolError};

use crate::error::{AuthorizationFailure, BoxError, Error, NotAuthorized, Rejection};

/// What to do about a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Transient; `refresh_metadata` when the leader or the topic may have moved.
    Retry { refresh_metadata: bool },
    /// The principal lacks an authorization (an ACL, an IAM permission). Not retried within
    /// the request (a grant takes an operator), but retryable: the caller tries again after
    /// its backoff, and never sets the records aside for it.
    NotAuthorized(AuthorizationFailure),
    /// The records themselves (or their topic) will never be accepted.
    Reject(Rejection),
    /// Retrying will not help, but it is not about the records (authentication, versions).
    Fatal,
}

/// Classifies an rskafka error by the first broker error code or SASL failure in its chain.
pub(super) fn verdict(e: &ClientError) -> Verdict {
    if let Some(code) = protocol_error(e) {
        return protocol_verdict(code);
    }
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if err.downcast_ref::<rskafka::SaslError>().is_some() {
            return Verdict::Fatal;
        }
        current = err.source();
    }
    Verdict::Retry {
        refresh_metadata: false,
    }
}

/// The first broker error code in an rskafka error's chain.
pub(super) fn protocol_error(e: &ClientError) -> Option<ProtocolError> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(ClientError::ServerError { protocol_error, .. }) =
            err.downcast_ref::<ClientError>()
        {
            return Some(*protocol_error);
        }
        current = err.source();
    }
    None
}

fn protocol_verdict(code: ProtocolError) -> Verdict {
    use ProtocolError as P;
    match code {
        P::MessageTooLarge | P::RecordListTooLarge => Verdict::Reject(Rejection::TooLarge),
        P::TopicAuthorizationFailed => Verdict::NotAuthorized(AuthorizationFailure::Topic),
        P::ClusterAuthorizationFailed => Verdict::NotAuthorized(AuthorizationFailure::Cluster),
        P::TransactionalIdAuthorizationFailed => {
            Verdict::NotAuthorized(AuthorizationFailure::TransactionalId)
        }
        P::GroupAuthorizationFailed => Verdict::NotAuthorized(AuthorizationFailure::Group),
        P::DelegationTokenAuthorizationFailed => {
            Verdict::NotAuthorized(AuthorizationFailure::DelegationToken)
        }
        P::InvalidTopicException => Verdict::Reject(Rejection::UnknownTopic),
        P::InvalidRecord | P::InvalidTimestamp | P::PolicyViolation => {
            Verdict::Reject(Rejection::InvalidRecord)
        }
        P::UnknownTopicOrPartition
        | P::NotLeaderOrFollower
        | P::LeaderNotAvailable
        | P::FencedLeaderEpoch
        | P::UnknownLeaderEpoch
        | P::BrokerNotAvailable
        | P::ReplicaNotAvailable
        | P::KafkaStorageError => Verdict::Retry {
            refresh_metadata: true,
        },
        P::SaslAuthenticationFailed
        | P::UnsupportedSaslMechanism
        | P::IllegalSaslState
        | P::UnsupportedVersion
        | P::UnsupportedForMessageFormat
        | P::UnsupportedCompressionType
        | P::InvalidRequiredAcks
        | P::InvalidRequest
        | P::SecurityDisabled => Verdict::Fatal,
        // timeouts, not enough replicas, network trouble, throttling, unknown codes
        _ => Verdict::Retry {
            refresh_metadata: false,
        },
    }
}

/// The error of a produce to `topic`/`partition` that failed with `e`, judged `verdict`;
/// `principal` is who the publisher authenticates as (named when it was refused).
pub(super) fn produce_error(
    topic: &str,
    partition: i32,
    principal: &str,
    verdict: Verdict,
    e: ClientError,
) -> Error {
    let source: BoxError = Box::new(e);
    match verdict {
        Verdict::Reject(reason) => Error::KafkaRejected {
            topic: topic.to_owned(),
            reason,
            source: Some(source),
        },
        Verdict::NotAuthorized(failure) => {
            not_authorized(topic, principal, "WRITE", failure, Some(source))
        }
        Verdict::Fatal | Verdict::Retry { .. } => Error::Kafka {
            message: format!("producing to {topic}/{partition}"),
            retryable: matches!(verdict, Verdict::Retry { .. }),
            source: Some(source),
        },
    }
}

/// [`Error::KafkaNotAuthorized`]: `principal` may not do `operation` (a Kafka ACL
/// operation) on `topic`.
pub(super) fn not_authorized(
    topic: &str,
    principal: &str,
    operation: &'static str,
    failure: AuthorizationFailure,
    source: Option<BoxError>,
) -> Error {
    Error::KafkaNotAuthorized {
        denied: NotAuthorized {
            topic: topic.to_owned(),
            principal: principal.to_owned(),
            operation,
            failure,
        },
        source,
    }
}

/// The error of a failed request that concerns no one topic (`what` was being done):
/// retryable unless its verdict is fatal.
pub(super) fn client_error(what: &str, e: ClientError) -> Error {
    let retryable = !matches!(verdict(&e), Verdict::Fatal);
    Error::Kafka {
        message: what.to_owned(),
        retryable,
        source: Some(Box::new(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn server_error(code: ProtocolError) -> ClientError {
        ClientError::ServerError {
            protocol_error: code,
            error_message: None,
            request: rskafka::client::error::RequestContext::Partition("t".into(), 0),
            response: None,
            is_virtual: false,
        }
    }

    #[test]
    fn permanent_rejections_are_not_retryable() {
        for (code, reason) in [
            (ProtocolError::MessageTooLarge, Rejection::TooLarge),
            (ProtocolError::RecordListTooLarge, Rejection::TooLarge),
            (ProtocolError::InvalidRecord, Rejection::InvalidRecord),
            (
                ProtocolError::InvalidTopicException,
                Rejection::UnknownTopic,
            ),
        ] {
            let v = verdict(&server_error(code));
            assert_eq!(v, Verdict::Reject(reason), "{code:?}");
            let e = produce_error("t", 0, "User:relay", v, server_error(code));
            assert!(!e.is_retryable());
            assert!(matches!(e, Error::KafkaRejected { reason: r, .. } if r == reason));
        }
    }

    /// An authorization failure is never a rejection of the records: an operator's grant
    /// ends it, so it is retryable (after the caller's backoff, not within the request),
    /// and the error names the failure, the topic, the operation and the principal.
    #[test]
    fn authorization_failures_are_retryable_and_name_the_topic_and_the_principal() {
        for (code, failure) in [
            (
                ProtocolError::TopicAuthorizationFailed,
                AuthorizationFailure::Topic,
            ),
            (
                ProtocolError::ClusterAuthorizationFailed,
                AuthorizationFailure::Cluster,
            ),
            (
                ProtocolError::TransactionalIdAuthorizationFailed,
                AuthorizationFailure::TransactionalId,
            ),
            (
                ProtocolError::GroupAuthorizationFailed,
                AuthorizationFailure::Group,
            ),
            (
                ProtocolError::DelegationTokenAuthorizationFailed,
                AuthorizationFailure::DelegationToken,
            ),
        ] {
            let v = verdict(&server_error(code));
            assert_eq!(v, Verdict::NotAuthorized(failure), "{code:?}");
            let e = produce_error("orders", 3, "User:nogrant", v, server_error(code));
            assert!(e.is_retryable(), "{code:?}");
            assert_eq!(e.error_type(), "Kafka");
            let Error::KafkaNotAuthorized { denied, source } = &e else {
                panic!("{code:?}: {e:?}");
            };
            assert_eq!(
                denied,
                &NotAuthorized {
                    topic: "orders".into(),
                    principal: "User:nogrant".into(),
                    operation: "WRITE",
                    failure,
                }
            );
            assert!(source.is_some(), "the client's error is kept");
            // Retryable when it concerns no one topic as well.
            assert!(client_error("reading topic metadata", server_error(code)).is_retryable());
        }
        let e = produce_error(
            "orders",
            0,
            "User:nogrant",
            Verdict::NotAuthorized(AuthorizationFailure::Topic),
            server_error(ProtocolError::TopicAuthorizationFailed),
        );
        assert!(
            crate::error::chain(&e).starts_with(
                "kafka: TOPIC_AUTHORIZATION_FAILED: User:nogrant may not WRITE topic orders \
                 (grant it"
            ),
            "{}",
            crate::error::chain(&e)
        );
        // A refusal that is not the topic's ACL names no topic operation.
        let e = produce_error(
            "orders",
            0,
            "User:nogrant",
            Verdict::NotAuthorized(AuthorizationFailure::Cluster),
            server_error(ProtocolError::ClusterAuthorizationFailed),
        );
        let text = crate::error::chain(&e);
        assert!(
            text.starts_with(
                "kafka: CLUSTER_AUTHORIZATION_FAILED: User:nogrant was refused by the brokers \
                 while publishing to topic orders"
            ) && !text.contains("may not WRITE"),
            "{text}"
        );
        // Seen through rskafka's retry wrapper too.
        let wrapped = ClientError::RetryFailed(rskafka::BackoffError::DeadlineExceded {
            deadline: Duration::from_secs(5),
            source: Box::new(server_error(ProtocolError::TopicAuthorizationFailed)),
        });
        assert_eq!(
            verdict(&wrapped),
            Verdict::NotAuthorized(AuthorizationFailure::Topic)
        );
    }

    #[test]
    fn leader_and_transient_errors_retry() {
        for code in [
            ProtocolError::NotLeaderOrFollower,
            ProtocolError::LeaderNotAvailable,
            ProtocolError::UnknownTopicOrPartition,
        ] {
            assert_eq!(
                verdict(&server_error(code)),
                Verdict::Retry {
                    refresh_metadata: true
                }
            );
        }
        for code in [
            ProtocolError::RequestTimedOut,
            ProtocolError::NotEnoughReplicas,
            ProtocolError::NotEnoughReplicasAfterAppend,
            ProtocolError::NetworkException,
            ProtocolError::Unknown(999),
        ] {
            let v = verdict(&server_error(code));
            assert_eq!(
                v,
                Verdict::Retry {
                    refresh_metadata: false
                },
                "{code:?}"
            );
            assert!(produce_error("t", 0, "User:relay", v, server_error(code)).is_retryable());
        }
        assert_eq!(
            verdict(&ClientError::Timeout),
            Verdict::Retry {
                refresh_metadata: false
            }
        );
        assert_eq!(
            verdict(&server_error(ProtocolError::SaslAuthenticationFailed)),
            Verdict::Fatal
        );
    }

    #[test]
    fn verdict_looks_through_retry_wrappers() {
        let wrapped = ClientError::RetryFailed(rskafka::BackoffError::DeadlineExceded {
            deadline: Duration::from_secs(5),
            source: Box::new(server_error(ProtocolError::MessageTooLarge)),
        });
        assert_eq!(verdict(&wrapped), Verdict::Reject(Rejection::TooLarge));
    }
}
