"""An Amazon MSK IAM listener in front of the local Apache Kafka, which has no MSK IAM:
TLS, SASL/OAUTHBEARER with the token's signature checked, and the broker's PLAINTEXT
listener behind it, for the end-to-end run of the relay with KAFKA_AUTH=msk-iam
(e2e/test_kafka_setups.py; mTLS, SCRAM and PLAIN go to the broker's own listeners).

  scripts/kafka_proxy.py [--upstream HOST:PORT] --cert PEM [--key PEM] [--region R]
                         --access-key-id K --secret-access-key S [--session-token T]

Each client connection is TLS (Python's ssl: the server certificate of --cert/--key, one
file when --key is left out, e.g. the stack's OUTBOX_KAFKA_TLS_DIR/broker.pem) and is
relayed frame by frame to one connection to --upstream (default KAFKA_BOOTSTRAP_SERVERS,
a PLAINTEXT listener whose anonymous principal may do everything):

- Metadata responses (v0 to v8, the versions without flexible encoding; rskafka speaks
  v0 to v4) have every broker's host and port replaced by the proxy's own: the broker
  advertises its PLAINTEXT address, and a client must reconnect through the proxy, as it
  would to a TLS listener's advertised address.
- The proxy is the broker's SASL layer: its ApiVersions response announces SaslHandshake
  (key 17) v1 and SaslAuthenticate (key 36) v0 to v1, the versions the proxy answers,
  whatever the broker announced for them (rskafka sends a request only in a version the
  broker announced); the proxy answers those two requests itself and forwards nothing
  else before the exchange succeeded (a client that tries is disconnected, as Kafka
  does). The one mechanism is OAUTHBEARER as Amazon MSK IAM uses it (as
  lib/src/publish/msk_iam.rs sends it): the initial response
  `n,,\\x01auth=Bearer <token>\\x01\\x01`; the token decoded (base64url, no padding) to
  the presigned URL https://kafka.{region}.amazonaws.com/?... with
  Action=kafka-cluster:Connect, X-Amz-Algorithm=AWS4-HMAC-SHA256,
  X-Amz-SignedHeaders=host, a User-Agent, X-Amz-Expires in 1..900 with the signing time
  not in the future and not expired, the credential scope
  {day}/{region}/kafka-cluster/aws4_request of --access-key-id, the session token when
  given, and the SigV4 signature recomputed with --secret-access-key (what
  testkit/src/msk_iam.rs checks in tests/msk_iam.rs).
  A refused token is answered as Kafka answers it: SASL_AUTHENTICATION_FAILED (58) with
  a message; another mechanism with UNSUPPORTED_SASL_MECHANISM (33).

What happened is kept in `Proxy.events` (one dict per handshake, exchange and
connection) and printed on stderr by the command.  Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import calendar
import hashlib
import hmac
import os
import ssl
import struct
import sys
import threading
import time
import urllib.parse

API_VERSIONS = 18
METADATA = 3
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58
MECHANISM = "OAUTHBEARER"


# ------------------------------------------------------------------- encoding

def i16(b: bytes, at: int) -> int:
    return struct.unpack_from(">h", b, at)[0]


def i32(b: bytes, at: int) -> int:
    return struct.unpack_from(">i", b, at)[0]


def string(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_uvarint(b: bytes, at: int) -> tuple[int, int]:
    n, shift = 0, 0
    while True:
        byte = b[at]
        at += 1
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return n, at
        shift += 7


def request_body_at(frame: bytes) -> int:
    """Where the body of a non-flexible request (header v1) starts."""
    client_id = i16(frame, 8)
    return 10 + max(client_id, 0)


# ------------------------------------------------------------------ rewriting

def rewrite_metadata(frame: bytes, version: int, port: int) -> bytes:
    """A Metadata response (v0 to v8) with every broker's address replaced by ours:
    `[throttle_time_ms (v3+)] brokers: [node_id host port rack (v1+)] ...`."""
    if version > 8:
        raise ValueError(f"Metadata v{version} is flexible: not rewritten")
    out = bytearray(frame[:4])  # correlation id
    at = 4
    if version >= 3:
        out += frame[at:at + 4]
        at += 4
    brokers = i32(frame, at)
    out += frame[at:at + 4]
    at += 4
    for _ in range(max(brokers, 0)):
        out += frame[at:at + 4]  # node id
        at += 4
        at += 2 + i16(frame, at)  # the broker's host
        out += string("127.0.0.1")
        at += 4  # the broker's port
        out += struct.pack(">i", port)
        if version >= 1:
            rack = i16(frame, at)
            n = 2 + max(rack, 0)
            out += frame[at:at + n]
            at += n
    out += frame[at:]
    return bytes(out)


SASL_APIS = [(SASL_HANDSHAKE, 1, 1), (SASL_AUTHENTICATE, 0, 1)]


def add_sasl_to_api_versions(frame: bytes, version: int) -> bytes:
    """An ApiVersions response (v0 to v3) that also announces SaslHandshake v1 and
    SaslAuthenticate v0-v1 (an error response is left as it is)."""
    at = 4
    if i16(frame, at) != 0:
        return frame
    head = frame[:at + 2]
    at += 2
    entries: list[tuple[int, int, int]] = []
    if version >= 3:
        n, at = read_uvarint(frame, at)
        for _ in range(n - 1):
            key, lo, hi = struct.unpack_from(">hhh", frame, at)
            at += 6
            tags, at = read_uvarint(frame, at)
            if tags:
                raise ValueError("tagged fields in an ApiVersions entry: not rewritten")
            entries.append((key, lo, hi))
    else:
        n = i32(frame, at)
        at += 4
        for _ in range(n):
            entries.append(struct.unpack_from(">hhh", frame, at))
            at += 6
    rest = frame[at:]
    entries = [e for e in entries if e[0] not in (SASL_HANDSHAKE, SASL_AUTHENTICATE)]
    entries += SASL_APIS
    out = bytearray(head)
    if version >= 3:
        out += uvarint(len(entries) + 1)
        for e in entries:
            out += struct.pack(">hhh", *e) + b"\x00"
    else:
        out += struct.pack(">i", len(entries))
        for e in entries:
            out += struct.pack(">hhh", *e)
    return bytes(out + rest)


# ----------------------------------------------------------------------- SASL

def check_msk_iam_token(token: str, region: str, access_key: str, secret_key: str,
                        session_token: str | None, now: float) -> str | None:
    """Why the MSK IAM token is not valid now, or None (see the module's docstring)."""
    if "=" in token or "+" in token or "/" in token:
        return "the token is not base64url without padding"
    try:
        url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except ValueError:
        return "the token does not decode"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https" or parts.netloc != f"kafka.{region}.amazonaws.com":
        return f"signed for {parts.scheme}://{parts.netloc}, not https://kafka.{region}.amazonaws.com"
    if parts.path != "/":
        return f"path {parts.path!r}, not /"
    params = [(urllib.parse.unquote_plus(k), urllib.parse.unquote_plus(v))
              for k, _, v in (kv.partition("=") for kv in parts.query.split("&"))]
    p = dict(params)
    if len(p) != len(params):
        return "a query parameter given twice"
    want = {"Action": "kafka-cluster:Connect", "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
            "X-Amz-SignedHeaders": "host"}
    for k, v in want.items():
        if p.get(k) != v:
            return f"{k} is {p.get(k)!r}, not {v!r}"
    if not p.get("User-Agent"):
        return "no User-Agent"
    try:
        expires = int(p.get("X-Amz-Expires", ""))
        signed = calendar.timegm(time.strptime(p.get("X-Amz-Date", ""), "%Y%m%dT%H%M%SZ"))
    except ValueError:
        return "X-Amz-Expires or X-Amz-Date missing or malformed"
    if not 0 < expires <= 900:
        return f"X-Amz-Expires {expires} not in 1..900"
    if not signed - 5 <= now < signed + expires:
        return f"signed at {p['X-Amz-Date']}, valid {expires}s: not valid now"
    date = p["X-Amz-Date"]
    scope = f"{date[:8]}/{region}/kafka-cluster/aws4_request"
    if p.get("X-Amz-Credential") != f"{access_key}/{scope}":
        return f"credential {p.get('X-Amz-Credential')!r}, not {access_key}/{scope}"
    if session_token is not None and p.get("X-Amz-Security-Token") != session_token:
        return "the session token is not the caller's"
    enc = lambda s: urllib.parse.quote(s, safe="-_.~")  # noqa: E731 (SigV4's encoding)
    query = "&".join(f"{k}={v}" for k, v in sorted(
        (enc(k), enc(v)) for k, v in params if k not in ("X-Amz-Signature", "User-Agent")))
    empty = hashlib.sha256(b"").hexdigest()
    canonical = f"GET\n/\n{query}\nhost:{parts.netloc}\n\nhost\n{empty}"
    to_sign = (f"AWS4-HMAC-SHA256\n{date}\n{scope}\n"
               f"{hashlib.sha256(canonical.encode()).hexdigest()}")
    key = f"AWS4{secret_key}".encode()
    for part in (date[:8], region, "kafka-cluster", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, p.get("X-Amz-Signature", "")):
        return "the SigV4 signature does not verify"
    return None


# ---------------------------------------------------------------------- proxy

class Proxy:
    """The proxy on 127.0.0.1 (a free port), run by an asyncio loop in a thread."""

    name = "the MSK IAM proxy"

    def __init__(self, upstream: str, cert: str, key: str | None = None, *, region: str,
                 access_key: str, secret_key: str, session_token: str | None = None):
        self.upstream = upstream.rsplit(":", 1)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.region, self.access_key, self.secret_key = region, access_key, secret_key
        self.session_token = session_token
        self.events: list[dict] = []
        # the MSK IAM tokens accepted (kept for the caller's own checks, never printed)
        self.tokens: list[str] = []
        self.port = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def tail(self, n: int = 30) -> str:
        """What it saw, but the frames it forwarded."""
        with self._lock:
            seen = [e for e in self.events if e["kind"] != "forwarded"]
        return "\n".join(str(e) for e in seen[-n:])

    def record(self, **event) -> None:
        event["at"] = time.time()
        with self._lock:
            self.events.append(event)

    def events_of(self, kind: str) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e["kind"] == kind]

    def start(self) -> "Proxy":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        # a failed TLS handshake (a client certificate refused) is an event, not noise
        self._loop.set_exception_handler(
            lambda _loop, ctx: self.record(kind="error", error=str(ctx.get("exception")
                                                                   or ctx.get("message"))))
        # TLS is started on each accepted connection (not by the server), so that a failed
        # handshake is an event with its reason: asyncio logs those only in debug mode.
        server = self._loop.run_until_complete(asyncio.start_server(
            self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter):
        try:
            await client_w.start_tls(self.ctx, ssl_handshake_timeout=10)
        except (OSError, asyncio.TimeoutError) as e:
            self.record(kind="tls-refused", error=f"{type(e).__name__}: {e}")
            client_w.close()
            return
        ssl_obj = client_w.get_extra_info("ssl_object")
        self.record(kind="connection", tls=ssl_obj.version() if ssl_obj else None)
        try:
            broker_r, broker_w = await asyncio.open_connection(self.upstream[0],
                                                               int(self.upstream[1]))
        except OSError as e:
            self.record(kind="upstream-error", error=str(e))
            client_w.close()
            return
        pending: dict[int, tuple[int, int]] = {}
        state = {"authenticated": False}
        write_lock = asyncio.Lock()

        async def send(w: asyncio.StreamWriter, frame: bytes) -> None:
            async with write_lock:
                w.write(struct.pack(">i", len(frame)) + frame)
                await w.drain()

        async def requests() -> None:
            while True:
                frame = await read_frame(client_r)
                key, version, correlation = struct.unpack_from(">hhi", frame, 0)
                if key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
                    body = self._sasl(key, version, frame, state)
                    await send(client_w, struct.pack(">i", correlation) + body)
                    continue
                if not state["authenticated"] and key != API_VERSIONS:
                    self.record(kind="refused-request", api_key=key)
                    return
                self.record(kind="forwarded", api_key=key)
                pending[correlation] = (key, version)
                broker_w.write(struct.pack(">i", len(frame)) + frame)
                await broker_w.drain()

        async def responses() -> None:
            while True:
                frame = await read_frame(broker_r)
                correlation = i32(frame, 0)
                key, version = pending.pop(correlation, (None, None))
                if key == METADATA:
                    frame = rewrite_metadata(frame, version, self.port)
                elif key == API_VERSIONS:
                    frame = add_sasl_to_api_versions(frame, version)
                await send(client_w, frame)

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(responses())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (client_w, broker_w):
                try:
                    w.close()
                except Exception:  # noqa: BLE001 (already closed)
                    pass

    def _sasl(self, key: int, version: int, frame: bytes, state: dict) -> bytes:
        at = request_body_at(frame)
        if key == SASL_HANDSHAKE:
            n = i16(frame, at)
            asked = frame[at + 2:at + 2 + n].decode(errors="replace")
            ok = asked == MECHANISM
            self.record(kind="handshake", mechanism=asked, accepted=ok)
            state["handshake"] = ok
            code = 0 if ok else UNSUPPORTED_SASL_MECHANISM
            return struct.pack(">hi", code, 1) + string(MECHANISM)
        n = i32(frame, at)
        data = frame[at + 4:at + 4 + n]
        why = (self._authenticate(data) if state.get("handshake")
               else "SaslAuthenticate before SaslHandshake")
        state["authenticated"] = why is None
        self.record(kind="sasl", mechanism=MECHANISM, accepted=why is None, why=why or "")
        if why is not None:
            body = struct.pack(">h", SASL_AUTHENTICATION_FAILED) + string(
                f"Authentication failed during authentication due to invalid credentials "
                f"with SASL mechanism {MECHANISM}") + struct.pack(">i", 0)
        else:
            body = struct.pack(">h", 0) + string(None) + struct.pack(">i", 0)
        if version >= 1:
            body += struct.pack(">q", 0)  # session_lifetime_ms: no re-authentication
        return body

    def _authenticate(self, data: bytes) -> str | None:
        """Why the client's initial response is refused, or None."""
        text = data.decode(errors="replace")
        prefix, suffix = "n,,\x01auth=Bearer ", "\x01\x01"
        if not (text.startswith(prefix) and text.endswith(suffix)):
            return "not n,,\\x01auth=Bearer <token>\\x01\\x01"
        token = text[len(prefix):-len(suffix)]
        why = check_msk_iam_token(token, self.region, self.access_key, self.secret_key,
                                  self.session_token, time.time())
        if why is None:
            with self._lock:
                self.tokens.append(token)
        return why


async def read_frame(r: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await r.readexactly(4))[0]
    return await r.readexactly(size)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    p.add_argument("--cert", required=True)
    p.add_argument("--key", help="the server key's PEM file (default: in --cert)")
    p.add_argument("--region", default=os.environ.get("AWS_REGION", ""))
    p.add_argument("--access-key-id", required=True)
    p.add_argument("--secret-access-key", required=True)
    p.add_argument("--session-token")
    a = p.parse_args()
    if not a.upstream:
        p.error("--upstream (or KAFKA_BOOTSTRAP_SERVERS) is required")
    if not a.region:
        p.error("--region (or AWS_REGION) is required")
    proxy = Proxy(a.upstream, a.cert, a.key, region=a.region, access_key=a.access_key_id,
                  secret_key=a.secret_access_key, session_token=a.session_token).start()
    print(proxy.address, flush=True)
    seen = 0
    try:
        while True:
            time.sleep(0.5)
            with proxy._lock:
                new = proxy.events[seen:]
                seen = len(proxy.events)
            for e in new:
                if e["kind"] != "forwarded":
                    print(f"[kafka-proxy] {e}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
