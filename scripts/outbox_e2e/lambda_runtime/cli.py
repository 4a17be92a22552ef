"""The emulator's command line (scripts/lambda_runtime.py): the options, the async
settings (flags over --template over Lambda's defaults), and the process's life."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading

from . import __doc__ as PACKAGE_DOC
from .client_api import ClientApiHandler
from .common import INVOKE_PREFIX, QuietServer, log
from .service import Invocation, Service

def async_settings(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The EventInvokeConfig: explicit flags over --template over Lambda's defaults."""
    source = {"retries": "flag", "max_age": "flag"}
    config = {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 21600,
              "Source": "Lambda's defaults"}
    if args.template:
        from .. import cfn_template  # needs PyYAML: only with --template
        try:
            tpl = cfn_template.Template(args.template, cfn_template.parse_params(args.param))
            config = tpl.event_invoke_config(args.template_function or args.function_name)
        except cfn_template.TemplateError as e:
            p.error(f"--template: {e}")
        config["Source"] = f"template:{config['Source']}"
    if args.async_retries is None:
        args.async_retries = config["MaximumRetryAttempts"]
        source["retries"] = config["Source"]
    if args.async_max_age is None:
        args.async_max_age = float(config["MaximumEventAgeInSeconds"])
        source["max_age"] = config["Source"]
    args.async_source = source
    if not 0 <= args.async_retries <= 2:
        p.error("--async-retries must be 0, 1 or 2 (Lambda's range)")
    if not 0 < args.async_max_age <= 21600:
        p.error("--async-max-age must be > 0 and at most 21600 (Lambda's maximum)")
    if args.async_retry_delay is not None:
        args.async_retry_delays = [args.async_retry_delay]
    else:
        try:
            args.async_retry_delays = [float(x) for x in args.async_retry_delays.split(",")]
        except ValueError:
            p.error("--async-retry-delays wants seconds separated by commas, e.g. 60,120")
    if any(d < 0 for d in args.async_retry_delays) or args.async_throttle_backoff <= 0 \
            or args.async_throttle_max_backoff < args.async_throttle_backoff:
        p.error("async delays must be >= 0, the throttle back-off > 0 and <= its maximum")


def main() -> int:
    p = argparse.ArgumentParser(
        description=PACKAGE_DOC.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the docstring of scripts/outbox_e2e/lambda_runtime/__init__.py for "
               "the full behaviour.")
    p.add_argument("binary", help="the function's executable (bootstrap)")
    p.add_argument("--prefix", default="",
                   help="command the binary runs under, e.g. 'qemu-aarch64-static -L /'")
    p.add_argument("--function-name", help="default: the binary's name (its directory's "
                   "name for a file called bootstrap)")
    p.add_argument("--memory", type=int, default=128, help="MB (default 128, the template's is 256)")
    p.add_argument("--cpu-share", action="store_true",
                   help="each environment gets --memory/1769 of one CPU, as Lambda gives "
                   "(a cgroup CPU quota; see the docstring)")
    p.add_argument("--timeout", type=float, default=3.0, help="function timeout, seconds (default 3)")
    p.add_argument("--max-concurrency", type=int, default=10,
                   help="most environments at once; beyond it invokes are throttled (default 10)")
    p.add_argument("--init-timeout", type=float, default=10.0,
                   help="seconds from process start to its first /next (default 10, Lambda's)")
    p.add_argument("--reuse-grace-ms", type=float, default=100.0,
                   help="how long an invoke waits for an environment that has answered but "
                        "not yet asked for its next event, before a cold start (default 100)")
    p.add_argument("--idle-expiry", type=float, default=0.0,
                   help="kill environments idle this many seconds (default 0: never)")
    p.add_argument("--no-freeze", dest="freeze", action="store_false",
                   help="do not SIGSTOP idle environments")
    p.add_argument("--no-bill-init", action="store_true",
                   help="leave the init phase out of the billed duration")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="an environment variable of the function (repeatable)")
    p.add_argument("--clean-env", action="store_true",
                   help="do not pass this process's environment on (only PATH, HOME, LANG)")
    p.add_argument("--log-format", choices=["JSON", "Text"],
                   help="sets AWS_LAMBDA_LOG_FORMAT (the template's LoggingConfig is JSON)")
    p.add_argument("--log-level", help="sets AWS_LAMBDA_LOG_LEVEL")
    p.add_argument("--cwd", help="working directory and LAMBDA_TASK_ROOT (default: the binary's)")
    p.add_argument("--sequential-request-ids", action="store_true",
                   help="request ids 00000000-0000-4000-8000-000000000001, ...2, in arrival "
                        "order (default: random UUIDs, as Lambda's)")
    p.add_argument("--account-id", default="123456789012")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="client API port (default: a free one)")
    p.add_argument("--port-file", help="write the client API port to this file once listening")
    p.add_argument("--stats-file", help="write the final stats JSON here on exit")
    p.add_argument("--log-file", help="append the function's logs here instead of stderr")
    p.add_argument("--timed-log-file",
                   help="also append each line of the function's logs here, prefixed with "
                   "the time it arrived (seconds since the epoch, to the millisecond): the "
                   "function's JSON lines carry no time of their own")
    p.add_argument("--schedule", type=float, metavar="SECONDS",
                   help="invoke asynchronously with a scheduled event every SECONDS")
    p.add_argument("--schedule-offset", type=float, metavar="SECONDS",
                   help="first tick after this many seconds (default: SECONDS)")
    p.add_argument("--schedule-payload", metavar="JSON",
                   help="payload of each tick instead of the EventBridge scheduled event")
    p.add_argument("--template", metavar="FILE",
                   help="read the async settings (EventInvokeConfig) from this SAM template")
    p.add_argument("--template-function", metavar="LOGICAL_ID",
                   help="the function of --template (default: --function-name)")
    p.add_argument("--param", action="append", default=[], metavar="K=V",
                   help="a template parameter for --template (repeatable)")
    p.add_argument("--async-max-age", type=float, default=None,
                   help="MaximumEventAgeInSeconds: an async event older than this is "
                        "discarded (default: the template's, else Lambda's 21600)")
    p.add_argument("--async-retries", type=int, default=None,
                   help="MaximumRetryAttempts after function errors, 0-2 (default: the "
                        "template's, else Lambda's 2)")
    p.add_argument("--async-retry-delays", metavar="S1,S2", default="60,120",
                   help="seconds before the first and the second retry (default 60,120, "
                        "Lambda's one and two minutes)")
    p.add_argument("--async-retry-delay", type=float, default=None,
                   help="one delay before every retry (overrides --async-retry-delays)")
    p.add_argument("--async-throttle-backoff", type=float, default=1.0,
                   help="first wait before retrying a throttled async event, doubling "
                        "(default 1, Lambda's)")
    p.add_argument("--async-throttle-max-backoff", type=float, default=300.0,
                   help="longest wait between throttle retries (default 300, Lambda's)")
    args = p.parse_args()

    if not os.path.exists(args.binary):
        p.error(f"no such binary: {args.binary}")
    if args.schedule_payload:
        try:
            json.loads(args.schedule_payload)
        except ValueError as e:
            p.error(f"--schedule-payload is not JSON: {e}")
    for kv in args.env:
        if "=" not in kv:
            p.error(f"--env wants K=V, got {kv!r}")
    if args.max_concurrency < 1 or args.timeout <= 0:
        p.error("--max-concurrency must be >= 1 and --timeout > 0")
    if not args.function_name:
        base = os.path.basename(os.path.abspath(args.binary))
        args.function_name = (os.path.basename(os.path.dirname(os.path.abspath(args.binary)))
                              if base == "bootstrap" else base)
    async_settings(p, args)

    Invocation.sequential = args.sequential_request_ids
    try:
        service = Service(args)
    except OSError as e:
        print(f"lambda_runtime: --cpu-share: cannot create a CPU cgroup: {e}", file=sys.stderr)
        return 2
    server = QuietServer((args.host, args.port), ClientApiHandler)
    server.service = service  # type: ignore[attr-defined]
    port = server.server_address[1]
    service.client_port = port

    def on_signal(signum, _frame):
        service.shutdown()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if args.idle_expiry > 0:
        threading.Thread(target=service.reaper_loop, daemon=True).start()
    if args.schedule:
        threading.Thread(target=service.schedule_loop, daemon=True).start()

    print(port, flush=True)
    if args.port_file:
        tmp = f"{args.port_file}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    log(f"{service.name}: {' '.join(service.command)}; memory {args.memory} MB, timeout "
        f"{args.timeout:g}s, max concurrency {args.max_concurrency}; invoke at "
        f"http://127.0.0.1:{port}{INVOKE_PREFIX}{service.name}/invocations")
    server.serve_forever()
    service.shutdown()
    server.server_close()
    # Let the reapers collect the killed processes.
    for env in service.envs:
        if env.proc is not None:
            try:
                env.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    final = service.stats()
    if args.stats_file:
        with open(args.stats_file, "w") as f:
            json.dump(final, f, indent=1)
    t = final["totals"]
    log(f"stopped: {t['invocations']} invocations, {t['cold_starts']} cold starts, "
        f"{t['errors']} errors ({t['timeouts']} timeouts), {t['throttles']} throttles, "
        f"{t['billed_ms']} billed ms")
    return 0
