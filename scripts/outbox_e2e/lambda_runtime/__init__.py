"""A small Lambda service emulator for ONE function binary: the local model of a
deployed function (cold starts, warm reuse, real deadlines, timeouts, throttling,
billed duration), for the tests and benchmarks of the local stack.

  scripts/lambda_runtime.py [options] BINARY

BINARY is the function's executable (a cargo-lambda `bootstrap`, or
`target/debug/outbox-relay-function`); `--prefix` runs it through a command such
as `qemu-aarch64-static -L /` (an arm64 bootstrap on x86_64).

Execution environments.  Each environment is one process of BINARY with its own
Runtime API on its own loopback port (AWS_LAMBDA_RUNTIME_API=127.0.0.1:PORT), the
2018-06-01 API that aws-lambda-rust-runtime speaks: `GET
/runtime/invocation/next` (long poll; answers with the event and the headers
Lambda-Runtime-Aws-Request-Id, Lambda-Runtime-Deadline-Ms (now + the function's
timeout, Unix ms), Lambda-Runtime-Invoked-Function-Arn, Lambda-Runtime-Trace-Id),
`POST /runtime/invocation/ID/response`, `POST /runtime/invocation/ID/error`,
`POST /runtime/init/error`.  An invoke goes to an idle environment (the one idle
most recently); when every environment is busy a new process is started (a cold
start), up to --max-concurrency; beyond it the invoke is throttled (HTTP 429
TooManyRequestsException, as Lambda answers).  An environment that has just
posted a response but not yet asked for the next event is waited for up to
--reuse-grace-ms before a cold start is chosen (the runtime asks within
microseconds; without the grace a back-to-back caller would see spurious cold
starts).  Between invocations an environment is frozen (SIGSTOP of its process
group once it waits in /next, SIGCONT when an event is handed to it), as Lambda
freezes it; --no-freeze keeps it running.  An invocation that passes its
timeout kills its environment (SIGKILL of the process group) and answers
`Sandbox.Timedout`; a process that exits during an invocation answers
`Runtime.ExitError`; an environment that does not ask for its first event within
--init-timeout is killed and its invocation fails.

The process environment: the emulator's own environment (so the stack's
AWS_ENDPOINT_URL_DYNAMODB, KAFKA_BOOTSTRAP_SERVERS, ... pass through; --clean-env
passes only PATH, HOME, LANG and the --env values), then every --env K=V, then
what Lambda sets and reserves: AWS_LAMBDA_RUNTIME_API, AWS_LAMBDA_FUNCTION_NAME,
AWS_LAMBDA_FUNCTION_MEMORY_SIZE, AWS_LAMBDA_FUNCTION_VERSION ($LATEST),
AWS_LAMBDA_LOG_GROUP_NAME, AWS_LAMBDA_LOG_STREAM_NAME,
AWS_LAMBDA_INITIALIZATION_TYPE (on-demand), LAMBDA_TASK_ROOT and
LAMBDA_RUNTIME_DIR (the binary's directory, also the working directory),
_HANDLER (bootstrap), TZ (:UTC), AWS_REGION and AWS_DEFAULT_REGION (kept when set,
else us-east-1), and with --log-format/--log-level AWS_LAMBDA_LOG_FORMAT and
AWS_LAMBDA_LOG_LEVEL (the template's LoggingConfig), and AWS_ENDPOINT_URL_LAMBDA
pointing at the emulator's own client API (a function that calls Lambda's Invoke on
itself, the relay starting its successor, reaches this emulator as it would reach
Lambda; an --env value wins).

Measured per invocation: request id, source (invoke, event, schedule), received,
start, end (Unix s), duration_ms, billed_ms, init_ms (cold starts: process start
to its first /next), cold, environment, status (ok, error, timeout, throttled),
error_type, max_memory_mb (the process's VmHWM), the response or error body.
billed_ms = ceil(duration_ms + init_ms) for a cold start (Lambda bills the init
phase of provided.al2023 functions, and of every on-demand function since August
2025), ceil(duration_ms) for a warm one, the timeout for a timed-out one;
--no-bill-init leaves the init phase out.  Totals: invocations (those that
reached an environment), cold and warm starts, errors, timeouts, throttles,
billed ms, GB-seconds, environments started, peak concurrency.

The client API, on 127.0.0.1 (--port, default a free one; printed on stdout as
the first line, and written to --port-file):
  POST /2015-03-31/functions/NAME/invocations   Lambda's Invoke API: the function
        name or its ARN; X-Amz-Invocation-Type RequestResponse (default: waits,
        200 with the function's response, X-Amz-Function-Error: Unhandled on a
        function error), Event (202 at once, x-amzn-RequestId the event's id; then
        Lambda's asynchronous queue, below) or DryRun (204); X-Amz-Log-Type: Tail returns the invocation's last 4 KB of
        log in X-Amz-Log-Result; X-Amz-Client-Context (base64 JSON) reaches the
        function as Lambda-Runtime-Client-Context.  Callable with `aws lambda invoke
        --endpoint-url http://127.0.0.1:PORT` or boto3's lambda client.
  GET  /stats[?since=N][&invocations=0]   JSON: the totals, the environments and
        the per-invocation list (from index N; none with invocations=0)
  POST /shutdown   answers the final stats, kills every environment, exits
SIGTERM and SIGINT shut down the same way.  --stats-file writes the final stats
there on exit.

--schedule SECONDS starts a timer standing in for the template's schedule: every
SECONDS (fixed rate; first tick after --schedule-offset, default SECONDS) an
asynchronous invocation (source "schedule") with an EventBridge scheduled-event
payload ({"version":"0","id":...,"detail-type":"Scheduled Event","source":
"aws.events","account":...,"time":...,"region":...,"resources":[rule ARN],
"detail":{}}), or the JSON of --schedule-payload (the template's ScheduleV2
delivers its Input, {"source":"dynamo-outbox.schedule"}).  A tick never waits for
the invocation it starts.

Asynchronous invocations (Event invokes and --schedule ticks), as "How Lambda
handles errors and retries with asynchronous invocation"
(https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html)
and "Configuring error handling settings for Lambda asynchronous invocations"
(https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-configuring.html)
describe them.  The settings are the function's EventInvokeConfig:
MaximumRetryAttempts (--async-retries, 0-2) and MaximumEventAgeInSeconds
(--async-max-age, at most 21600; values below Lambda's minimum of 60 are accepted,
for tests).  An explicit flag wins; else --template FILE reads them from the SAM
template (the EventInvokeConfig of --template-function, default --function-name,
through outbox_e2e.cfn_template; template.yaml's RelayFunction has 0 and 60); else
Lambda's defaults, 2 and 21600 (6 hours).  A function error (the function's or the
runtime's, timeouts included) is retried MaximumRetryAttempts times, the first
retry after --async-retry-delays' first value and the second after its second
(default 60,120: Lambda's "one-minute wait between the first two attempts, and two
minutes between the second and third"; --async-retry-delay S sets one delay for
both).  A throttle (no environment free under --max-concurrency) is retried with a
wait of --async-throttle-backoff seconds doubling up to
--async-throttle-max-backoff (default 1 and 300: "from 1 second after the first
attempt to a maximum of 5 minutes"), never counted against the retries.  An event
older than MaximumEventAgeInSeconds is discarded: it is not attempted again, and a
retry that would come after that age is not made (the event is counted discarded
when it reaches the age).  The age counts from the 202.  Not modelled: the queue's
own delays and duplicates, on-failure destinations and dead-letter queues, the
slower reading of a long queue.  Every attempt of one event carries the same
request id (Lambda-Runtime-Aws-Request-Id), as Lambda's retries do, which a function
can key its idempotency on.  Each attempt is one record of /stats with its
event_id and attempt (1, 2, ...; throttled attempts included, status
"throttled"); totals async_invocations, async_succeeded, async_retries (after
function errors), async_throttle_retries, async_expired (discarded for their age),
async_exhausted (out of retries), async_dropped (both); /stats' async_config says
the settings in force and where each came from.

CPU.  With --cpu-share each environment's process runs in a CPU cgroup of its own
whose quota is the function's share of one CPU: --memory / 1769 (CFS quota over a
100 ms period: 7.2 ms at 128 MB, 14.5 ms at 256 MB), as "Configure Lambda function
memory" (https://docs.aws.amazon.com/lambda/latest/dg/configuration-memory.html) says
Lambda allocates it: "CPU power in proportion to the amount of memory configured ...
At 1,769 MB, a function has the equivalent of one vCPU (one vCPU-second of credits per
second)".  Without it a function gets whatever the host gives (the default).  Needs a
writable cgroup CPU controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max); the emulator
exits with status 2 when it cannot create one.  Not modelled: Lambda's burst credits
and the speed of its CPUs against this host's.

The function's stdout and stderr go to our stderr (or --log-file), each line
prefixed with "[NAME:ENV]", with Lambda's START / END / REPORT lines; with
--timed-log-file also to that file, each line prefixed with its arrival time as well.

Standard library only (--template needs PyYAML, in the stack's venv).  Exit codes: 0 after a shutdown, 2 usage.

Layout: common.py (constants, the HTTP server, CPU cgroups), service.py (environments,
invocations, the asynchronous queue, the schedule, the stats), runtime_api.py (the
Runtime API of one environment), client_api.py (Invoke, /stats, /shutdown), cli.py (the
options and the process's life).
"""
