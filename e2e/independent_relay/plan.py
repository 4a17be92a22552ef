"""The lease plan of docs/protocol.md section 4.3."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Plan:
    share: int
    range: tuple[int, int]  # [start, end)
    keep: list[int]
    release: list[int]
    claim: list[int]
    standby: int | None


def rank_order(ids) -> list[str]:
    return sorted(set(ids), key=lambda s: s.encode("utf-8"))


def compute_plan(n: int, active, leases: dict, me: str) -> Plan:
    """Section 4.3.  leases: bucket -> (owner or None, lapsed) for buckets < n."""
    ranked = rank_order(list(active) + [me])
    held_by: dict[int, str] = {}
    for b, (owner, lapsed) in leases.items():
        if b < n and owner is not None and (not lapsed or owner == me):
            held_by[b] = owner
    free = [b not in held_by for b in range(n)]
    held = {r: 0 for r in ranked}
    for owner in held_by.values():
        held[owner] = held.get(owner, 0) + 1
    r_count = len(ranked)
    floor, rem = divmod(n, r_count)
    share = {r: floor for r in ranked}
    for r in ranked:
        if rem and held[r] > floor:
            share[r] += 1
            rem -= 1
    for r in ranked:
        if rem and share[r] == floor:
            share[r] += 1
            rem -= 1
    ranges, start = {}, 0
    for r in ranked:
        ranges[r] = (start, start + share[r])
        start += share[r]
    lo, hi = ranges[me]
    mine = sorted(b for b, o in held_by.items() if o == me)
    ordered = [b for b in mine if lo <= b < hi] + [b for b in mine if not lo <= b < hi]
    keep = sorted(ordered[:share[me]])
    release = sorted(ordered[share[me]:])
    claim: list[int] = []
    if len(keep) < share[me] and any(free):
        deficit = {r: max(0, share[r] - held[r]) for r in ranked}
        scratch = list(free)
        given: dict[str, list[int]] = {r: [] for r in ranked}
        for r in ranked:
            for b in range(*ranges[r]):
                if deficit[r] == 0:
                    break
                if scratch[b]:
                    scratch[b] = False
                    given[r].append(b)
                    deficit[r] -= 1
        cursor = 0
        for r in ranked:
            while deficit[r] > 0:
                while cursor < n and not scratch[cursor]:
                    cursor += 1
                if cursor >= n:
                    break
                scratch[cursor] = False
                given[r].append(cursor)
                deficit[r] -= 1
                cursor += 1
        claim = sorted(given[me])
    standby = None
    if share[me] == 0 and not mine:
        standby = sum(1 for r in ranked[:ranked.index(me)] if share[r] == 0)
    return Plan(share[me], (lo, hi), keep, release, claim, standby)
