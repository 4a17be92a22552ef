"""Continuity of the serverless relay, end to end under the Lambda emulator with the real
relay binary: what happens to a backlog larger than one invocation, to a drain while
Kafka refuses connections, and to the wake-ups of a commit when an event bus is also
configured, and to a poison head in a quiet period.

The end-to-end suite runs each scenario as a test (e2e/test_continuity.py, with the
settings of scripts/test.sh); scripts/continuity_e2e.py runs one with any options (the
benchmarks of BENCHMARKS.md):

  scripts/continuity_e2e.py --scenario burst|outage|bus|stuck [options]

Inside `scripts/stack.sh run` (DynamoDB Local, Apache Kafka, moto).  The pieces: the
relay binary under the Lambda emulator (scripts/lambda_runtime.py) with the template's
EventInvokeConfig (--template: no retries, events dropped after 60 s), the table's
KEYS_ONLY stream read by the stream mapping (scripts/streams.py poll) with the template's
mapping over --shards (4) virtual shards (DynamoDB Local has one; the model spreads the
records by partition key hash, one invocation at a time per shard), and NO schedule (no
tick at all: only doorbells and successors start relays).  A successor is the template's:
a continuation item the leaving run writes, whose insert the mapping delivers on the
shard its key hashes to (at once beside the leaver, or behind the shard's current
invocation).  The relay's environment is the template's (OUTBOX_MAX_RUN_TIME,
OUTBOX_SHUTDOWN_MARGIN, OUTBOX_IDLE_STOP, OUTBOX_SUCCESSOR as template.yaml resolves them
with its defaults), plus the table, the
key prefix, 8 buckets, the local Kafka (KAFKA_AUTH=none) and DynamoDB; the function's
timeout is --relay-timeout (30 s by default, shorter than the template's 70 s so that a
few minutes show several runs).

A monitor thread reads, every --monitor-interval (0.2 s), the coordination partition
(one strongly consistent Query of {prefix}#COORDINATION, all pages) and each message
partition (a strongly consistent Query with Limit 1 of {prefix}#MESSAGES#{b}), and
records, per bucket, the intervals in which the bucket had a message and no unlapsed
lease named an active relay (lib/src/protocol/coordination.rs: a heartbeat without StoppedAtUtc
whose LastSeenUtc is less than the lease duration old and not more than that in the
future; a lease is unlapsed while ExpiresAtUtc is after now, both in .NET ticks).  The
"owner gap" figures: every such interval, the longest, a histogram; those before the
bucket's first owner (the wake-up of an idle fleet) apart from the later ones (handovers
between relays).  An interval's length is measured between samples, so it is known to
about one sampling period.  The idle fleet's first owner is timed more closely by a
thread that reads only the coordination partition, one read after another, until
every bucket has had an owner ("first_owner"): a claim landed after the start of the
last read that did not show it and before the end of the first that did, and a bucket's
first message between the first commit's request leaving the client and the commit's
return.

Scenarios:

burst  A burst of --messages (3000) messages of --value-bytes (1000) over --keys (64)
       keys, written by --writers (8) threads of boto3 TransactWriteItems (99 messages
       and a business item each, sequences reserved per bucket with ADD just before, as
       the library's writer does), as fast as they go (the first commit alone, the other
       threads from its return: see burst()), into a fresh table; then nothing.
       Checks: every id in Kafka (at least once), no id nobody wrote, per-key order (of
       each id's first copy), the table without message items and without owned leases,
       0 refused writes in every relay summary, no invocation other than doorbells and
       successors (no tick), every invocation answered without a function error.
       Measures: drain time (the first commit's start to the last record's publish
       timestamp in Kafka), relay invocations by trigger and by what they did,
       successors started (summary.successor_started), the owner gaps.  Checked as
       well: no owner gap, before the first owner or after it, longer than
       OWNER_GAP_BOUND_S (10 s: a doorbell's delivery plus a cold start, and a handover's
       poll interval plus a cold start, with room for a loaded two-core machine and the
       monitor's sampling period, which such a machine stretched to 3.7 s; a relay that
       dropped its buckets mid-drain, or a backlog left to a tick, shows minutes), and no
       first owner later than WAKE_BOUND_S (6 s) after a bucket's first message: a
       commit wakes a relay within a few seconds (docs/design.md).  Then (unless
       --no-compare) the same burst into another fresh table with ONE always-on relay
       (`outboxctl relay` with the same table settings and its defaults, started and
       holding every bucket before the burst; SIGTERM once drained), its table's stream
       read by the same mapping model into a function that does nothing (so that its
       writers share DynamoDB Local with the same reader as the Lambda run's): its drain
       time, its owner gaps, and the ratio of the two drain times.  The goals (the longest owner
       gap after the first owner and, at most, before it <= 2 s; with the comparison,
       ratio <= 1.1) are reported under "goals"; they fail the run only with
       --enforce-goals.

outage A burst of --messages (1000) into a relay whose Kafka is the stack's broker
       through a proxy slot (OUTBOX_KAFKA_PROXY_SLOTS): a TCP proxy (fault_proxy.py) binds
       the slot's advertised port and forwards to the broker's listener of the slot,
       which advertises the proxy's address, so every connection of the relay (and of
       the scenario's topic creation and read-back) goes through it; the proxy's "refuse"
       closes every open connection and closes each new one as soon as it is accepted,
       as the harness's TcpFaultProxy refuse() does; "pass" forwards again.  Once the
       monitor has seen the first message leave the table, the proxy refuses for
       --outage-seconds (60), then passes.
       With --cut-before Kafka refuses from just before the burst instead (the relays
       start with Kafka down; nothing races a fast drain), for --outage-seconds.
       Checks as for burst (at-least-once: duplicates are counted, not failed).
       Measures: the time from Kafka's return to the first message leaving the table
       after it (a publish is acknowledged before its delete; checked against the first
       publish timestamp in Kafka after the return), messages deleted during the outage
       (must be 0), relay invocations that started during the outage by trigger and per
       minute, relay runs that overlapped the outage and the bound the design states (a
       run starts at most one successor: about outage / run length chained runs per
       relay; goal_met when the invocations that ran a relay during the outage are at
       most outage / (run length - 10 s) + 1 per relay, and resume <= 60 s).

bus    WakeOn=stream with an event bus configured (EventBusName=--bus): the enqueue
       function (outbox-enqueue-function under the emulator) gets the environment the
       template gives it under WakeOn=stream,EventBusName=BUS (its NotifyOnCommit
       condition), and moto's EventBridge gets the template's CommitNotificationRule
       when the template enables it under those parameters (a rule with the template's
       pattern targeting an SQS queue that the scenario forwards to the relay as an
       asynchronous invocation, as EventBridge invokes a Lambda target).  --commits (5)
       enqueue calls of one message each, --spacing (10) seconds apart (longer than the
       idle stop, so that each finds no relay running).  Checks: per commit exactly one
       invocation of the relay (trigger doorbell) and no notification, every message
       in Kafka, 0 refused writes.  --notify-anyway gives the enqueue function the bus
       and creates the rule whatever the template says (the wiring before the
       condition), which must fail the check (2 wake-ups per commit).

stuck  A poison head in a quiet period: the relay allows only the scenario's topic
       (OUTBOX_ALLOWED_TOPICS); one message on another topic is committed at the head of
       a bucket, one behind it, and one healthy message in another bucket; the doorbell
       and a schedule every --tick-seconds (30) wake the relay.  Every 5 s the template's
       alarms (with StuckMessageAgeSeconds=--stuck-age, 60) are evaluated by the alarm
       evaluator (outbox_e2e.alarms) over the EMF documents of the relay's log and the
       invocations' AWS/Lambda datapoints, until OutboxStuckAlarm (which a poison head
       raises with PoisonPolicy block) is in ALARM.  Checks: in ALARM within stuck age +
       tick + 90 s (the relay reports
       the head's age each run; an alarm is evaluated at whole minutes), the healthy
       message in Kafka, the poison and the message behind it still in the table (never
       published), every relay run stopped idle (a parked bucket is no reason to run
       on), 0 refused writes.  The burst scenario evaluates the same alarms and
       fails when OutboxStuckAlarm, RefusedWritesAlarm or SuccessorFailuresAlarm goes
       into ALARM during its healthy drain.

Each scenario returns its figures (scripts/continuity_e2e.py prints them as one JSON
document after the line "RESULT"); a failed check raises, naming it.  The goals are
figures too (under "goals"); the test of a scenario fails on a missed goal where
scripts/test.sh enforced it.

Layout: options.py (the scenarios' settings), monitor.py (the owner and head sampling),
rig.py (the relay, the poller, the burst writer, the checks, the alarms), fault_proxy.py
(Kafka refusing through a proxy slot), scenarios.py (burst, outage, stuck, bus).
"""
