//! What a failed Kafka request means for the publisher: retry it (after a metadata
//! refresh when the leader or the topic may have moved), set the records aside (the
//! brokers will never accept them), or give up (authentication, versions). The verdict
//! comes from the first broker error code or SASL failure in rskafka's error chain.

use rskafka::client::error::{Error as ClientError, ProtocolError};

use crate::error::{BoxError, Error, Rejection};

/// What to do about a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Transient; `refresh_metadata` when the leader or the topic may have moved.
    Retry { refresh_metadata: bool },
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
        P::TopicAuthorizationFailed => Verdict::Reject(Rejection::NotAuthorized),
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
        P::ClusterAuthorizationFailed
        | P::SaslAuthenticationFailed
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

pub(super) fn produce_error(
    topic: &str,
    partition: i32,
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
        Verdict::Fatal | Verdict::Retry { .. } => Error::Kafka {
            message: format!("producing to {topic}/{partition}"),
            retryable: matches!(verdict, Verdict::Retry { .. }),
            source: Some(source),
        },
    }
}

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
            (
                ProtocolError::TopicAuthorizationFailed,
                Rejection::NotAuthorized,
            ),
            (ProtocolError::InvalidRecord, Rejection::InvalidRecord),
        ] {
            let v = verdict(&server_error(code));
            assert_eq!(v, Verdict::Reject(reason), "{code:?}");
            let e = produce_error("t", 0, v, server_error(code));
            assert!(!e.is_retryable());
            assert!(matches!(e, Error::KafkaRejected { reason: r, .. } if r == reason));
        }
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
            assert!(produce_error("t", 0, v, server_error(code)).is_retryable());
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
