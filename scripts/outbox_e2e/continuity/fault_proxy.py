"""Kafka refusing on purpose: the stack's broker behind a TCP proxy on one of its proxy
slots (OUTBOX_KAFKA_PROXY_SLOTS), which passes or refuses every connection."""

from __future__ import annotations

import collections
import os
import socket
import threading
import time

from .. import kafka
from ..report import Failed, check


class FaultProxy:
    """A TCP proxy on 127.0.0.1 that passes or refuses (closes every open connection, and
    each new one as soon as it is accepted)."""

    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.port = self.listener.getsockname()[1]
        self.upstream: tuple[str, int] | None = None
        self.refusing = False
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.stats = collections.Counter()
        self.closed = False

    def start(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                if self.refusing:
                    self.stats["refused_connections"] += 1
                    client.close()
                    continue
                self.stats["connections"] += 1
            try:
                up = socket.create_connection(self.upstream, timeout=5)
                up.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, up]
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self.lock:
            self.conns = [c for c in self.conns if c not in (src, dst)]

    def refuse(self) -> None:
        with self.lock:
            self.refusing = True
            conns, self.conns = self.conns, []
            self.stats["cut_connections"] += len(conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def pass_(self) -> None:
        with self.lock:
            self.refusing = False

    def close(self) -> None:
        self.closed = True
        self.refuse()
        try:  # wakes the accept loop: a socket closed under a blocked accept stays bound
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


def take_proxy_slot(wait: float = 120.0) -> tuple[socket.socket, tuple[str, int]]:
    """A proxy slot of the stack's broker (OUTBOX_KAFKA_PROXY_SLOTS, "UPSTREAM:ADVERTISED
    ..."): a listening socket on the first ADVERTISED port that binds, and the broker's
    listener of that slot (UPSTREAM).  The slot is this process's while the socket stays
    bound; when every slot is held (other tests' proxies), waits up to `wait` seconds."""
    text = os.environ.get("OUTBOX_KAFKA_PROXY_SLOTS", "")
    slots = []
    for pair in text.split():
        upstream, sep, advertised = pair.partition(":")
        check(sep and upstream.isdigit() and advertised.isdigit(),
              f"OUTBOX_KAFKA_PROXY_SLOTS: {pair!r} is not UPSTREAM:ADVERTISED")
        slots.append((int(upstream), int(advertised)))
    check(slots, "OUTBOX_KAFKA_PROXY_SLOTS is not set: run inside scripts/stack.sh run")
    deadline = time.time() + wait
    while True:
        for upstream, advertised in slots:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", advertised))
                s.listen(64)
            except OSError:
                s.close()
                continue
            return s, ("127.0.0.1", upstream)
        check(time.time() < deadline, f"every Kafka proxy slot of the stack ({len(slots)}) "
                                      f"stayed bound for {wait:g}s")
        time.sleep(0.2)


class SlotKafka:
    """The stack's broker behind a FaultProxy, on a proxy slot: the broker
    advertises the slot's port, where the proxy listens, so a client bootstrapped there
    reaches the broker only through the proxy (as harness/src/broker.rs's proxied broker
    does with testkit's ProxySlot)."""

    name = "kafka-proxy-slot"

    def __init__(self):
        listener, upstream = take_proxy_slot()
        self.proxy = FaultProxy(listener)
        self.proxy.start(upstream)
        self.upstream = f"{upstream[0]}:{upstream[1]}"
        self.bootstrap = f"127.0.0.1:{self.proxy.port}"
        try:
            kafka.ping(self.bootstrap, 30)
        except kafka.KafkaToolError as e:
            self.stop()
            raise Failed(f"the broker through the proxy slot: {e}") from e

    def tail(self, n: int = 30) -> str:
        return f"proxy {self.bootstrap} -> {self.upstream}: {dict(self.proxy.stats)}"

    def stop(self) -> None:
        self.proxy.close()
