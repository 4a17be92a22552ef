"""An independent relay for the dynamo-outbox table, written from docs/protocol.md and
docs/item-schema.md alone (not from lib/src), so that a mixed fleet (this relay next to
`outboxctl relay`) tests what the documents promise: that relays of other
implementations share one table without a refused conditional write.

  PYTHONPATH=e2e python -m independent_relay [--relay-id ID] [--for DURATION] [--grace D]

(The package: schema.py the item schema, plan.py the lease plan, relay.py the relay,
__main__.py the command.)

Configuration from the environment, with the names of docs/configuration.md:
OUTBOX_TABLE_NAME (required), OUTBOX_BUCKET_COUNT (8), OUTBOX_KEY_PREFIX (OUTBOX),
OUTBOX_PARTITION_KEY_ATTRIBUTE / OUTBOX_SORT_KEY_ATTRIBUTE (PK / SK), OUTBOX_RELAY_ID,
OUTBOX_LEASE_DURATION (30s), OUTBOX_LEASE_RENEW_INTERVAL (10s), OUTBOX_POLL_INTERVAL (1s),
OUTBOX_ERROR_BACKOFF (1s), OUTBOX_BATCH_SIZE (500), OUTBOX_MESSAGE_ID_HEADER,
KAFKA_BOOTSTRAP_SERVERS (PLAINTEXT, no authentication), KAFKA_PUBLISH_TIMEOUT (20s); the
DynamoDB endpoint, region and credentials from boto3's usual chain.  SIGTERM or SIGINT
(or the end of --for) stops it gracefully.  Its last two stdout lines are
  relay ID stopped (REASON): published N, refused writes R, leases released: true|false
  report: {JSON: published, refused by kind, lost leases, ...}

What it implements (section numbers of docs/protocol.md): rounds (4.1: heartbeat,
JOIN_DELAY on the first round, one strongly consistent read of the coordination
partition, the plan, renew / release / claim in that order, the stale-heartbeat chore of
the first-ranked active relay); who is active (4.2, future heartbeats included); the plan
(4.3, standby rank computed but not used to skip rounds); every conditional write of 4.5
with ReturnValuesOnConditionCheckFailure, a refusal that shows this very write counted
as a success; no renewal that moves an expiry back; the two claim hold-backs of 4.6 and
the HANDOVER_STEP re-reads while a stamped peer still holds unlapsed leases (section 6);
moving messages (5: probe, strongly consistent fetch, gap probes and refetches, publish
in sequence order with the documented partitioner and headers, delete the acknowledged
prefix in chunks of 25, all inside the lease's validity on both clocks; the head alone
after a failure); the graceful stop of section 6 (stamp, release, up to five re-reads).
Not implemented (this project's optional extensions, or not protocol): announcing
StopsAtUtc and the early rounds at a peer's announced stop, standby round skipping,
idle stop, commit notifications, the dead-letter partition, the topic allow-list,
backlog samples, metrics and traces; a run with --for does not keep the stop reserve.

What the docs left open (how this relay reads each point):

 1. 4.5, renewal condition "and, when the read lease had not lapsed, ExpiresAtUtc > now",
    with "`Now` is the relay's clock when the round read": read that way the clause is
    implied by "ExpiresAtUtc = the value read" (a value that had not lapsed at `now`).
    Its stated purpose (a renewal must not revive a lease that lapsed while the request
    was in flight) needs the clock when the request is sent; this relay uses that.
 2. 1.4 / 4.5: a round has two clocks.  The heartbeat (step 1) is written before the read
    that defines `now`; 1.4 says LastSeenUtc is "when the relay's latest round began", so
    the heartbeat uses the round's start, the lease writes the read's time.
 3. 5.5: message deletes are BatchWriteItem, which carries no condition; the docs give
    none (the delete is safe because a sort key is never reused, 1.3).
 4. 5.2: "a byte budget" per fetch has no size in protocol.md (configuration.md:
    OUTBOX_MAX_IN_FLIGHT_BYTES split over OUTBOX_MAX_CONCURRENCY) nor a rule for
    measuring an item's bytes.  Here: 4 MiB of attribute bytes, at least one item.
 5. 5 / 1.5: what makes an item "unreadable" is not listed (MessageId not a v4 UUID?
    CreatedAtUtc missing?).  Here: a missing or mistyped MessageId or Topic, a topic
    name outside Kafka's rules, a bad header blob, a bad Partition, or an explicit
    partition the topic lacks.  How often a blocked bucket retries its head is not said
    (here: every OUTBOX_ERROR_BACKOFF, from configuration.md).
 6. 4.2: a heartbeat record without a numeric LastSeenUtc "never counts as active", but
    whether it is stale (deleted) is not said.  Here it is left alone.
 7. 4.3 step 2: "byte-wise (ordinal) comparison": .NET's ordinal compare is by UTF-16
    code unit, Rust's byte-wise by UTF-8 byte; they differ for ids mixing characters
    above U+FFFF with U+E000..U+FFFF.  Here: UTF-8 bytes.
 8. 4.3 step 3: "relays that currently hold more than floor" counts what the reader's
    read says each relay holds, and 4.3 step 1 makes that reader-dependent (the reader's
    own lapsed lease is held by the reader, free for everybody else), so two relays with
    the same read can compute different shares when lapsed leases exist.
 9. 4.6 / 6: "stamped stopped (within HANDOVER_WATCH)" is read as: now - StoppedAtUtc <
    HANDOVER_WATCH by the reader's clock.  "Reads again one HANDOVER_STEP later": here a
    whole round (heartbeat included, so that rule 1 of 4.6 holds for its claims).
10. 5: "valid for more than one renew interval ... on the monotonic clock": the instant
    the monotonic validity starts from is not stated; here the monotonic time just
    before the read whose `now` went into the expiry.
11. 2, Kafka partition: which partition a batch's keyless records share is not stated
    (here: a random one per topic and batch).  The record timestamp is not stated in
    protocol.md (item-schema.md: not CreatedAtUtc); here the producer's create time.
12. 4.5: a refused release "already shows exactly this write" is read as: no Owner and
    the expiry read.  A refused stop-release as: no Owner.
13. 6: the stop's time budget for a signal is not in protocol.md (outboxctl: --grace 10s).
    Whether the stop's re-reads release leases at or beyond the bucket count that name
    the relay is not said ("ignored" in 1.4 vs "whatever still names it"); here no.
14. 5.3: a fetched message numbered at or below the last one removed (a reservation
    that committed after the relay passed its empty gap) is not discussed; here it is
    published in fetch order with no gap before it.
15. 4.6: the rule "no claims while a stopped peer is still releasing" is listed as this
    project's, so a reference relay may claim mid-handover; the docs do not say what a
    mixed fleet then sees (refused claims, presumably, as 4.6's example shows).
16. 4.1: "a round is bounded in time by the lease duration minus one renew interval":
    how (abandon the round? its in-flight writes?) is not said; here only the SDK's
    timeouts bound it (2 s connect, 5 s read, 3 attempts per request).
17. 1.2 / item-schema.md: BucketCount is "recommended"; that a relay publishes an item
    without it is implied, not stated (here it does).
18. 2, Kafka partition (a pitfall more than a gap): "as Kafka's Java client does" is not
    what librdkafka-based clients do by default (consistent_random, CRC32), so a relay
    built on confluent-kafka must choose partitions itself, as this one does; the docs
    could name librdkafka's murmur2_random as the equivalent for keyed records.
19. 5.4: "records of one Kafka partition go out in order" does not say how retries must
    keep that order; here the idempotent producer (enable.idempotence).
"""

from .plan import Plan, compute_plan, rank_order
from .schema import (BadItem, bucket_of, decode_headers, encode_headers, kafka_partition,
                     murmur2, now_ticks, to_positive)

__all__ = ["Plan", "compute_plan", "rank_order", "BadItem", "bucket_of", "decode_headers",
           "encode_headers", "kafka_partition", "murmur2", "now_ticks", "to_positive"]
