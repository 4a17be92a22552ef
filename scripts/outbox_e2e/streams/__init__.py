"""DynamoDB Streams helpers for the local stack: enable a table's stream, print its
records as the Lambda event the event source mapping would deliver, and a poller
standing in for that event source mapping.  Built on boto3 against DynamoDB Local
(endpoint $AWS_ENDPOINT_URL_DYNAMODB_STREAMS, else $AWS_ENDPOINT_URL_DYNAMODB, as
exported by scripts/stack.sh; DynamoDB Local serves the streams API on the same
port).  Run it with the stack's venv python ($OUTBOX_STACK_PYTHON).

Subcommands:
  enable TABLE [--view-type KEYS_ONLY]
        UpdateTable with StreamSpecification (StreamEnabled, KEYS_ONLY); waits until
        the stream is ENABLED; prints its ARN.  A table whose stream is already on
        with that view type is left as it is.
  records TABLE [--after SEQ] [--filter-prefix PREFIX] [--pretty]
        prints every record of the stream (every shard from TRIM_HORIZON; with
        --after only those whose sequence number is greater than SEQ; with
        --filter-prefix only those the poller's filter keeps) as ONE Lambda
        DynamoDB stream event: {"Records":[{"eventID", "eventName", "eventVersion",
        "eventSource", "awsRegion", "dynamodb": {"ApproximateCreationDateTime"
        (Unix seconds, a number), "Keys", "SequenceNumber", "SizeBytes",
        "StreamViewType"}, "eventSourceARN"}]}, ordered by sequence number: the
        shape aws_lambda_events::event::dynamodb::Event deserializes.
  poll TABLE --invoke URL [--template template.yaml [--function RelayFunction]
             [--param K=V ...]] [--filter-prefix PREFIX] [--key-attribute PK]
             [--batch-size N] [--window SECONDS] [--starting-position LATEST]
             [--max-retries N] [--max-record-age SECONDS] [--[no-]bisect]
             [--shards N] [--backoff S] [--max-backoff S]
             [--ready-file F] [--stats-file F] [--batch-log F]
        the event source mapping, POSTing each batch as one event to URL (the Invoke
        URL of scripts/lambda_runtime.py,
        http://127.0.0.1:PORT/2015-03-31/functions/NAME/invocations) and waiting for
        the answer (RequestResponse).  Described below.

The command is scripts/streams.py (run with the stack's venv python).

The event source mapping (poll)
-------------------------------
Settings.  --template reads the function's DynamoDB stream mapping from the SAM
template (outbox_e2e.cfn_template: the AWS::Lambda::EventSourceMapping whose
FunctionName is the function, parameters at their defaults or --param K=V,
conditions evaluated): BatchSize, MaximumBatchingWindowInSeconds,
MaximumRecordAgeInSeconds, MaximumRetryAttempts, BisectBatchOnFunctionError,
StartingPosition and FilterCriteria's patterns.  A flag given explicitly overrides
the template (--filter-prefix replaces the patterns); what neither sets takes
Lambda's default (BatchSize 100, window 0, record age -1, retries -1, no bisect; the
table in "Lambda parameters for Amazon DynamoDB event source mappings",
https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-params.html) and
StartingPosition LATEST (required in AWS, no default).  A mapping whose Condition
is false under the parameters (e.g. --param WakeOn=schedule) is an error.  The
effective settings and where each came from ("flag", "template:RelayDoorbell",
"default") are in the --ready-file JSON and under "settings" in the stats.
Values below AWS's minimums (record age 60 s) are accepted, for tests.

Reading.  Every shard of the stream is read (the shards open at start from
StartingPosition; shards created later from TRIM_HORIZON once their parent is read
to its end; discovered every --discover-interval seconds; each polled every
--poll-interval seconds, 0.25, while it has nothing new), independently of the
invocations, so reading never waits for the function.  The filter patterns are
Lambda's event filtering ("Control which events Lambda sends to your function",
https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventfiltering.html):
a record is kept when one pattern matches it; a pattern's lists match when one
value matches (exact values, prefix, suffix, equals-ignore-case, anything-but,
numeric, exists); filtered records are never sent and never counted against
anything.  Without a pattern every record is kept.

Shards.  Lambda reads the stream's records in batches and invokes the function
synchronously with each ("Using AWS Lambda with Amazon DynamoDB",
https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html); a stream mapping
retries the entire batch and repeated errors block processing of the affected
shard ("Understanding retry behavior in Lambda",
https://docs.aws.amazon.com/lambda/latest/dg/invocation-retries.html); with
ParallelizationFactor at its default of 1 (the parameters page below; a larger one
"processes multiple batches from each shard concurrently") a shard has one batch in
flight at a time, in order, while different shards are processed independently.
(The one-batch-at-a-time-per-shard wording is the Kinesis page's, "Using Lambda to
process records from Amazon Kinesis Data Streams",
https://docs.aws.amazon.com/lambda/latest/dg/with-kinesis.html; the DynamoDB page
was only found here in a translation, so this module relies on the retry and
parameter pages for DynamoDB.)  DynamoDB Local gives one open shard, so
--shards N splits the kept records into N virtual shards by a hash (MD5) of the
partition key's value (--key-attribute, default the table's hash key), as DynamoDB
keeps the items of one partition key in one shard.  Each virtual shard is one
pipeline: its records in the order they were read, one invocation at a time, the
next batch only after the previous one is done with (succeeded, dropped or
expired).  The real shards feed the virtual ones in their order (a child after its
parent), so a key's records stay in order across shard rollovers.
ParallelizationFactor is not modelled (1, the default).

Batching ("How Lambda processes records from stream and queue-based event sources",
section "Batching behavior",
https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventsourcemapping.html):
a pipeline invokes when BatchSize records wait, when the next record would take the
event past 6 MB, or when the batching window has passed and a record waits.  The
page says that the next batching window begins as soon as the previous invocation
completes; so the first window begins when the poller starts, and after an idle
spell longer than the window the first records are sent as soon as they are read
(with window 0, everything read so far, up to BatchSize).

Record age.  MaximumRecordAgeInSeconds discards records older than the age, before
they are sent or between retries; -1 means until the record expires, the stream's
24 h retention ("Retain discarded records for a DynamoDB event source in Lambda",
https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html; the
parameters page above).  DynamoDB Local's ApproximateCreationDateTime is whole
minutes, so a record's age is measured from the moment the poller first read it
(within --poll-interval of its write while the reader keeps up, which it does since
it never waits for the function).  Expired records waiting in a pipeline are
discarded unsent; those of a failing batch are removed before its next attempt,
the rest of the batch retried.  AWS sends discarded records to an on-failure
destination; here they are counted (expired_records) and logged.

Errors (the error-handling page above).  Before invocation: a throttle (HTTP 429
from the emulator), another HTTP error or no answer is retried until the records
expire, never counted against MaximumRetryAttempts.  During invocation: a function
error (X-Amz-Function-Error, timeouts included) is retried up to
MaximumRetryAttempts times (-1: until the records expire), then the batch is
dropped and the shard moves on.  With BisectBatchOnFunctionError a failing batch of
more than one record is split in two halves (the first half gets the odd record
out), each processed in turn, in order, as a batch of its own; "splitting batches
doesn't consume the retry quota".  Where AWS is silent, chosen here: a half starts
with a fresh retry count; a batch is bisected at each function error until it is a
single record, whose function errors then count against MaximumRetryAttempts; the
wait before a retry is --backoff seconds (0.5) doubling up to --max-backoff (10),
or until the oldest record expires if sooner; a bisect retries at once.

Stopping.  SIGTERM or SIGINT stops the poller (an invocation in flight is waited for
up to --stop-grace seconds); its counters go to stdout as JSON (and to
--stats-file): batches and records (delivered in successful invocations),
records_read, records_filtered_out, invoke_errors (every failed attempt),
function_errors, throttles (HTTP 429), retries (after function errors, counted
against MaximumRetryAttempts), throttle_retries (after throttles or failed
requests), bisects, expired_records (discarded for their age, sent or not),
dropped_batches and dropped_records (out of retries), buffered_unsent (read, not
yet done with at the stop), in_flight_batches, peak_in_flight_batches (the most
invocations at once, across virtual shards), get_records_calls, shards_seen,
shards_finished, virtual_shards, stream_arn, settings.  --batch-log appends one
JSON line per invocation attempt: shard (the virtual shard, "shard-0"...),
records, first_seq, last_seq, oldest_age_s, sent, done, attempt (1 for a batch's
or a half's first attempt), status, function_error, the response's first 1,000
characters.  --ready-file is written (and "ready" said on stderr) once every
starting shard has its iterator, so writes after that are seen.

Differences from the real service worth knowing: DynamoDB Local puts its own
region ("ddblocal") and account (000000000000) in the stream ARN and awsRegion,
and its ApproximateCreationDateTime is whole minutes; records are passed through
as DynamoDB Local returns them.  ReportBatchItemFailures, on-failure destinations,
ParallelizationFactor and tumbling windows are not modelled.

Exit codes: 0 ok, 1 failure (a message goes to stderr), 2 usage.

Layout: records.py (the clients, a stream's shards and records, the Lambda event's
record), filters.py (Lambda's event filtering), settings.py (the mapping's settings:
flags over the template over Lambda's defaults), poller.py (the event source mapping),
cli.py (the subcommands).
"""
