"""docs/item-schema.md and section 2 of docs/protocol.md: ticks, murmur2, the bucket, the
Kafka partition, the header blob; and the constants of protocol.md section 3."""
from __future__ import annotations

import logging
import re
import struct
import time
import uuid

UNIX_EPOCH_TICKS = 621355968000000000
TICKS_PER_SECOND = 10_000_000
JOIN_DELAY = 0.3
HANDOVER_STEP = 0.3
HANDOVER_WATCH = 5.0
MAX_GAP_PROBES = 8
MAX_REFETCHES = 3
DELETES_PER_REQUEST = 25
STOP_RELEASE_PASSES = 5
SILENT_HEARTBEAT_STALE_LEASES = 10
BATCH_BYTES = 4 * 1024 * 1024
TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
log = logging.getLogger("independent-relay")


def now_ticks() -> int:
    return UNIX_EPOCH_TICKS + time.time_ns() // 100


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*", text)
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


# ------------------------------------------------------------------ item schema

def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (item-schema.md, Bucket), as a signed 32-bit integer."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    rest = data[whole:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h ^= rest[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(h: int) -> int:
    return h & 0x7FFFFFFF


def bucket_of(message_id: str, key: bytes | None, partition: int | None, count: int) -> int:
    if partition is not None:
        return partition % count
    data = key if key is not None else uuid.UUID(message_id).bytes_le
    return to_positive(murmur2(data)) % count


def kafka_partition(key: bytes | None, partition: int | None, partition_count: int,
                    sticky: int) -> int | None:
    """Section 2, the Kafka partition; None when an explicit partition is out of range."""
    if partition is not None:
        return partition if partition < partition_count else None
    if key is not None:
        return to_positive(murmur2(key)) % partition_count
    return sticky % partition_count


class BadItem(Exception):
    """An item that cannot be published (its bucket stops there)."""


def decode_headers(blob: bytes) -> list[tuple[str, bytes | None]]:
    """The header blob, format version 1, with every check of protocol.md section 2
    (BadItem names the reason in the words of its examples)."""
    if not blob:
        raise BadItem("empty")
    if blob[0] != 1:
        raise BadItem("unknown version")
    pos = 1

    def i32() -> int:
        nonlocal pos
        if len(blob) - pos < 4:
            raise BadItem("truncated")
        (v,) = struct.unpack_from("<i", blob, pos)
        pos += 4
        return v

    count = i32()
    if count < 0:
        raise BadItem("negative count")
    if count > (len(blob) - pos) // 8:
        raise BadItem("count too large")
    out = []
    for _ in range(count):
        parts = []
        for what in ("key", "value"):
            n = i32()
            if n < -1 or (what == "key" and n < 0):
                raise BadItem("bad length")
            if n == -1:
                parts.append(None)
                continue
            if len(blob) - pos < n:
                raise BadItem("truncated")
            parts.append(blob[pos:pos + n])
            pos += n
        try:
            key = parts[0].decode("utf-8")
        except UnicodeDecodeError:
            raise BadItem("invalid key") from None
        out.append((key, parts[1]))
    if pos != len(blob):
        raise BadItem("trailing bytes")
    return out


def encode_headers(headers: list[tuple[str, bytes | None]]) -> bytes | None:
    if not headers:
        return None
    out = bytearray(b"\x01") + struct.pack("<i", len(headers))
    for k, v in headers:
        kb = k.encode("utf-8")
        out += struct.pack("<i", len(kb)) + kb
        out += struct.pack("<i", -1) if v is None else struct.pack("<i", len(v)) + v
    return bytes(out)
