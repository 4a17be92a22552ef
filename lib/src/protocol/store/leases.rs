//! Heartbeats, the coordination read (into a [`Coordination`] snapshot), and the three
//! lease writes (renew, release, claim).
//!
//! Every write here is one conditional `UpdateItem` (or `DeleteItem`); a refusal is not an
//! error of the call: it returns `Ok(false)`, is counted by [`WriteKind`] and logged with
//! its most likely cause.

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_smithy_runtime_api::http::Response as HttpResponse;
use tracing::{debug, instrument, warn};

use super::{DynamoDbOutboxStore, WriteKind};

use crate::attr;
use crate::error::{from_sdk, Error, Result};
use crate::options::RelayOptions;
use crate::protocol::clock::duration_to_ticks;
use crate::protocol::coordination::{
    self, Coordination, LeaseRecord, ReadExpiry, RelayRecord, DELIVERY_EXACTLY_ONCE as EXACTLY_ONCE,
};
use crate::protocol::schema::{self, get_n, get_s};

/// What one read of the coordination partition says of notified buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// The buckets no live relay holds or is about to claim.
    pub uncovered: Vec<u32>,
    /// How long until live relays will have taken the uncovered buckets over, if every
    /// one of them has a taker.
    pub settles_in: Option<std::time::Duration>,
    /// How many relays the read found live (a heartbeat within the lease duration and no
    /// stop stamped; leavers included).
    pub live_relays: usize,
}

// The protocol's steps, for the relay and for tools and tests that drive them: hidden
// from the docs of the type an embedder passes to `Relay::new`.
#[doc(hidden)]
impl DynamoDbOutboxStore {
    fn refused(&self, kind: WriteKind, relay_id: &str, bucket: Option<u32>) {
        self.refused.add(kind);
        warn!(
            kind = kind.as_str(),
            relay_id,
            bucket,
            likely_cause = kind.likely_cause(),
            "conditional write refused"
        );
    }

    fn outcome<T, E>(
        &self,
        kind: WriteKind,
        operation: &'static str,
        relay_id: &str,
        bucket: Option<u32>,
        result: std::result::Result<T, aws_sdk_dynamodb::error::SdkError<E, HttpResponse>>,
    ) -> Result<bool>
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
    {
        match result {
            Ok(_) => Ok(true),
            Err(e) => match from_sdk(operation, e) {
                Error::ConditionFailed { .. } => {
                    self.refused(kind, relay_id, bucket);
                    Ok(false)
                }
                other => Err(other),
            },
        }
    }

    /// Like `outcome`, for an `UpdateItem` sent with `ReturnValuesOnConditionCheckFailure =
    /// ALL_OLD`: a refusal whose old item already shows this very write (`applied`) is the
    /// SDK's retry of a request whose first attempt landed, so it is a success, not a
    /// refusal.
    fn update_outcome(
        &self,
        kind: WriteKind,
        relay_id: &str,
        bucket: Option<u32>,
        result: std::result::Result<
            aws_sdk_dynamodb::operation::update_item::UpdateItemOutput,
            aws_sdk_dynamodb::error::SdkError<UpdateItemError, HttpResponse>,
        >,
        applied: impl Fn(&crate::protocol::schema::Item) -> bool,
    ) -> Result<bool> {
        if let Err(e) = &result {
            if let Some(UpdateItemError::ConditionalCheckFailedException(c)) = e.as_service_error()
            {
                if c.item().is_some_and(&applied) {
                    debug!(
                        kind = kind.as_str(),
                        relay_id, bucket, "write already applied by an earlier attempt"
                    );
                    return Ok(true);
                }
            }
        }
        self.outcome(kind, "UpdateItem", relay_id, bucket, result)
    }

    /// Writes the relay's heartbeat at `now`, conditional on `LastSeenUtc` moving forward;
    /// clears a stop stamp (a relay restarted under the same id) and records when the
    /// relay plans to stop, if it has a deadline. `Ok(false)` when refused.
    #[instrument(skip(self), level = "debug")]
    pub async fn heartbeat(&self, relay_id: &str, now: i64, stops_at: Option<i64>) -> Result<bool> {
        let mut request = self
            .client
            .update_item()
            .table_name(&self.options.table_name)
            .set_key(Some(
                self.keys
                    .key(self.keys.coordination_pk(), schema::relay_sk(relay_id)),
            ))
            .condition_expression("attribute_not_exists(#seen) OR #seen < :now")
            .expression_attribute_names("#seen", attr::LAST_SEEN)
            .expression_attribute_names("#stopped", attr::STOPPED_AT)
            .expression_attribute_names("#stops", attr::STOPS_AT)
            .expression_attribute_values(":now", schema::n(now))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        // This project's attribute: a relay in exactly-once mode says so; any other
        // heartbeat has none (section 8.5 of protocol.md).
        let (set_delivery, remove_delivery) = if self.exactly_once {
            request = request
                .expression_attribute_names("#delivery", attr::DELIVERY)
                .expression_attribute_values(":delivery", AttributeValue::S(EXACTLY_ONCE.into()));
            (", #delivery = :delivery", "")
        } else {
            request = request.expression_attribute_names("#delivery", attr::DELIVERY);
            ("", ", #delivery")
        };
        request = match stops_at {
            Some(at) => request
                .update_expression(format!(
                    "SET #seen = :now, #stops = :stops{set_delivery} REMOVE #stopped{remove_delivery}"
                ))
                .expression_attribute_values(":stops", schema::n(at)),
            None => request.update_expression(format!(
                "SET #seen = :now{set_delivery} REMOVE #stopped, #stops{remove_delivery}"
            )),
        };
        let result = request.send().await;
        self.update_outcome(WriteKind::Heartbeat, relay_id, None, result, |old| {
            get_n::<i64>(old, attr::LAST_SEEN) == Some(now) && !old.contains_key(attr::STOPPED_AT)
        })
    }

    /// Stamps the relay's record as stopped at `now` (peers stop counting it at once), also
    /// moving `LastSeenUtc` forward so that an abandoned heartbeat cannot land after it.
    #[instrument(skip(self), level = "debug")]
    pub async fn stamp_stopped(&self, relay_id: &str, now: i64) -> Result<bool> {
        let result = self
            .client
            .update_item()
            .table_name(&self.options.table_name)
            .set_key(Some(
                self.keys
                    .key(self.keys.coordination_pk(), schema::relay_sk(relay_id)),
            ))
            .update_expression("SET #seen = :now, #stopped = :now")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .condition_expression("attribute_not_exists(#seen) OR #seen < :now")
            .expression_attribute_names("#seen", attr::LAST_SEEN)
            .expression_attribute_names("#stopped", attr::STOPPED_AT)
            .expression_attribute_values(":now", schema::n(now))
            .send()
            .await;
        self.update_outcome(WriteKind::Heartbeat, relay_id, None, result, |old| {
            get_n::<i64>(old, attr::STOPPED_AT) == Some(now)
        })
    }

    /// Which of `buckets` no live relay holds or is about to claim
    /// ([`Coordination::uncovered`]), and when the relays of the read will have taken them
    /// over ([`Coordination::taken_over_at`]), from one strongly consistent read of the
    /// coordination partition and no write: what a relay started by a commit notification
    /// checks before it joins the fleet. `options` gives the lease duration (who is
    /// active) and the poll interval (a relay announcing its stop within it does not
    /// count).
    pub async fn coverage(&self, buckets: &[u32], options: &RelayOptions) -> Result<Coverage> {
        let coordination = self.read_coordination().await?;
        let now = self.clock().now_ticks();
        let lease = duration_to_ticks(options.lease_duration);
        let soon = duration_to_ticks(options.poll_interval);
        let uncovered = coordination.uncovered(
            buckets,
            self.options().bucket_count,
            now,
            &coordination::CoverageTicks {
                lease,
                soon,
                round: duration_to_ticks(coordination::ROUND_WINDOW),
                takeover: duration_to_ticks(coordination::HANDOVER_STEP * 2),
            },
        );
        let takeover = coordination::TakeoverTicks {
            lease,
            soon,
            renew: duration_to_ticks(options.lease_renew_interval),
            step: duration_to_ticks(coordination::HANDOVER_STEP),
            watch: duration_to_ticks(coordination::HANDOVER_WATCH),
        };
        let settles_in = if uncovered.is_empty() {
            None
        } else {
            coordination
                .taken_over_at(&uncovered, self.options().bucket_count, now, &takeover)
                .map(|at| crate::protocol::clock::ticks_to_duration(at.saturating_sub(now)))
        };
        Ok(Coverage {
            uncovered,
            settles_in,
            live_relays: coordination.active_relays(now, lease).len(),
        })
    }

    /// The uncovered buckets of [`Self::coverage`].
    pub async fn uncovered(&self, buckets: &[u32], options: &RelayOptions) -> Result<Vec<u32>> {
        Ok(self.coverage(buckets, options).await?.uncovered)
    }

    /// Reads every lease and heartbeat with one strongly consistent query (following pages).
    #[instrument(skip(self), level = "debug")]
    pub async fn read_coordination(&self) -> Result<Coordination> {
        let mut coordination = Coordination::default();
        let mut start = None;
        loop {
            let out = self
                .query_partition(self.keys.coordination_pk())
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| from_sdk("Query", e))?;
            for item in out.items() {
                let (_, sk) = self.keys.key_of(item);
                let number = |name: &str| item.get(name).and_then(|v| v.as_n().ok());
                if let Some(bucket) = schema::parse_lease_sk(sk) {
                    let (expires_at, expiry_exact) =
                        coordination::read_ticks(number(attr::EXPIRES_AT).map(String::as_str));
                    coordination.leases.push(LeaseRecord {
                        bucket,
                        owner: get_s(item, attr::OWNER).map(str::to_string),
                        expires_at,
                        expiry_exact,
                    });
                } else if let Some(relay_id) = sk.strip_prefix(schema::RELAY_SK_PREFIX) {
                    coordination.relays.push(RelayRecord {
                        relay_id: relay_id.to_string(),
                        last_seen: coordination::read_ticks(
                            number(attr::LAST_SEEN).map(String::as_str),
                        )
                        .0,
                        stopped_at: get_n(item, attr::STOPPED_AT),
                        stops_at: get_n(item, attr::STOPS_AT),
                        delivery: get_s(item, attr::DELIVERY).map(str::to_string),
                    });
                }
            }
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        coordination.leases.sort_by_key(|l| l.bucket);
        Ok(coordination)
    }

    /// Renews a held lease to `new_expires`, conditional on the owner and on the expiry
    /// this round read ([`ReadExpiry`]; an `i64` is an exact read). With `unlapsed_at`,
    /// also only while the lease has not lapsed at that time (an in-flight renewal never
    /// revives a lapsed lease); without it, this retakes the relay's own lapsed lease under
    /// the owner condition, also one left without a usable expiry.
    pub async fn renew(
        &self,
        bucket: u32,
        relay_id: &str,
        read_expires: impl Into<ReadExpiry>,
        new_expires: i64,
        unlapsed_at: Option<i64>,
    ) -> Result<bool> {
        let read = read_expires.into();
        debug_assert!(
            new_expires > read.ticks,
            "a renewal never moves an expiry backwards"
        );
        let mut values = vec![
            (":me".to_string(), schema::s(relay_id)),
            (":new".to_string(), schema::n(new_expires)),
        ];
        let mut condition = format!("#owner = :me AND {}", expiry_as_read(read, &mut values));
        if let Some(now) = unlapsed_at {
            condition.push_str(" AND #exp > :now");
            values.push((":now".to_string(), schema::n(now)));
        }
        let result = self
            .client
            .update_item()
            .table_name(&self.options.table_name)
            .set_key(Some(
                self.keys
                    .key(self.keys.coordination_pk(), schema::lease_sk(bucket)),
            ))
            .update_expression("SET #exp = :new")
            .condition_expression(condition)
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#exp", attr::EXPIRES_AT)
            .set_expression_attribute_values(Some(values.into_iter().collect()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        self.update_outcome(WriteKind::Renew, relay_id, Some(bucket), result, |old| {
            get_s(old, attr::OWNER) == Some(relay_id)
                && get_n::<i64>(old, attr::EXPIRES_AT) == Some(new_expires)
        })
    }

    /// Hands a lease back: removes the owner, conditional on the owner and, when given,
    /// on the expiry this round read ([`ReadExpiry`]; an `i64` is an exact read). A
    /// stopping relay releases guarded by owner alone.
    pub async fn release(
        &self,
        bucket: u32,
        relay_id: &str,
        read_expires: Option<impl Into<ReadExpiry>>,
    ) -> Result<bool> {
        let read_expires: Option<ReadExpiry> = read_expires.map(Into::into);
        let mut values = vec![(":me".to_string(), schema::s(relay_id))];
        let mut condition = "#owner = :me".to_string();
        if let Some(read) = read_expires {
            condition.push_str(" AND ");
            condition.push_str(expiry_as_read(read, &mut values));
        }
        let mut request = self
            .client
            .update_item()
            .table_name(&self.options.table_name)
            .set_key(Some(
                self.keys
                    .key(self.keys.coordination_pk(), schema::lease_sk(bucket)),
            ))
            .update_expression("REMOVE #owner")
            .condition_expression(condition)
            .expression_attribute_names("#owner", attr::OWNER)
            .set_expression_attribute_values(Some(values.into_iter().collect()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if read_expires.is_some() {
            request = request.expression_attribute_names("#exp", attr::EXPIRES_AT);
        }
        let result = request.send().await;
        // Only the owner releases: no owner left, at the expiry it released, is this release.
        self.update_outcome(WriteKind::Release, relay_id, Some(bucket), result, |old| {
            !old.contains_key(attr::OWNER)
                && read_expires.is_none_or(|r| {
                    !r.exact || get_n::<i64>(old, attr::EXPIRES_AT) == Some(r.ticks)
                })
        })
    }

    /// Claims a lease read as free (absent, no owner, or lapsed at `now`) until `new_expires`.
    /// As in the reference implementation, a lease whose item has no `ExpiresAtUtc` is
    /// claimable, and so is one whose `ExpiresAtUtc` is not a number: the read takes both
    /// as lapsed ([`coordination::read_ticks`]), and the condition agrees.
    pub async fn claim(
        &self,
        bucket: u32,
        relay_id: &str,
        now: i64,
        new_expires: i64,
    ) -> Result<bool> {
        let result = self
            .client
            .update_item()
            .table_name(&self.options.table_name)
            .set_key(Some(
                self.keys
                    .key(self.keys.coordination_pk(), schema::lease_sk(bucket)),
            ))
            .update_expression("SET #owner = :me, #exp = :new")
            .condition_expression(
                "attribute_not_exists(#owner) OR attribute_not_exists(#exp) \
                 OR NOT attribute_type(#exp, :number) OR #exp <= :now",
            )
            .expression_attribute_names("#owner", attr::OWNER)
            .expression_attribute_names("#exp", attr::EXPIRES_AT)
            .expression_attribute_values(":number", schema::s("N"))
            .expression_attribute_values(":me", schema::s(relay_id))
            .expression_attribute_values(":now", schema::n(now))
            .expression_attribute_values(":new", schema::n(new_expires))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        self.update_outcome(WriteKind::Claim, relay_id, Some(bucket), result, |old| {
            get_s(old, attr::OWNER) == Some(relay_id)
                && get_n::<i64>(old, attr::EXPIRES_AT) == Some(new_expires)
        })
    }

    /// Deletes a stopped or dead relay's heartbeat record unless it moved forward since it
    /// was read (`read_last_seen`, as [`RelayRecord::last_seen`] reads it): a relay that
    /// came back has written a later `LastSeenUtc`, and only that refuses the delete.
    ///
    /// Retry-safe: a record that is gone already (an SDK retry of a delete whose first
    /// attempt landed, another cleaner) satisfies `attribute_not_exists` on the key, so the
    /// delete of nothing succeeds, refused nowhere. A record without a numeric
    /// `LastSeenUtc` (another implementation's stop stamp before its first heartbeat, a
    /// hand edit) is deleted on purpose once stale ([`RelayRecord::is_stale`]), instead of
    /// being compared with a value it does not have and refused every round.
    pub async fn delete_relay_record(
        &self,
        cleaner: &str,
        relay_id: &str,
        read_last_seen: i64,
    ) -> Result<bool> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.options.table_name)
            .set_key(Some(
                self.keys
                    .key(self.keys.coordination_pk(), schema::relay_sk(relay_id)),
            ))
            .condition_expression(
                "attribute_not_exists(#pk) OR attribute_not_exists(#seen) \
                 OR NOT attribute_type(#seen, :number) OR #seen <= :read",
            )
            .expression_attribute_names("#pk", &self.keys.pk)
            .expression_attribute_names("#seen", attr::LAST_SEEN)
            .expression_attribute_values(":number", schema::s("N"))
            .expression_attribute_values(":read", schema::n(read_last_seen))
            .send()
            .await;
        self.outcome(WriteKind::Cleanup, "DeleteItem", cleaner, None, result)
    }
}

/// The condition "`#exp` is as this round read it" (adds its values): equal to the ticks
/// read, or, for an expiry read inexactly ([`ReadExpiry`]), missing, not a number, or at
/// most the ticks read.
fn expiry_as_read(
    read: ReadExpiry,
    values: &mut Vec<(String, aws_sdk_dynamodb::types::AttributeValue)>,
) -> &'static str {
    values.push((":read".to_string(), schema::n(read.ticks)));
    if read.exact {
        "#exp = :read"
    } else {
        values.push((":number".to_string(), schema::s("N")));
        "(attribute_not_exists(#exp) OR NOT attribute_type(#exp, :number) OR #exp <= :read)"
    }
}
