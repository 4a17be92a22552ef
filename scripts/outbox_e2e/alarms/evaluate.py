"""Statistics, CloudWatch's M-of-N and missing-data rules, and the replay of an alarm's
evaluations in simulated time."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Iterable

from .emf import Sample, iso, parse_time
from .template import COMPARISONS, Alarm, AlarmError, percentile_of

OK = "OK"
ALARM = "ALARM"
INSUFFICIENT_DATA = "INSUFFICIENT_DATA"


def statistic(name: str, values: list) -> float | None:
    """CloudWatch's statistic `name` (SampleCount, Sum, Average, Minimum, Maximum, pNN)
    over one period's sample values; None for no sample."""
    if not values:
        return None
    if name == "SampleCount":
        return float(len(values))
    if name == "Sum":
        return float(sum(values))
    if name == "Average":
        return float(sum(values)) / len(values)
    if name == "Minimum":
        return float(min(values))
    if name == "Maximum":
        return float(max(values))
    p = percentile_of(name)
    if p is None:
        raise AlarmError(f"statistic {name} is not modeled")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return float(ordered[rank - 1])


def decide(points: list, n: int, m: int, treat: str, current: str) -> tuple[str, str]:
    """The state an evaluation sets from the evaluation range `points` (oldest first; each
    True for breaching, False for not breaching, None for missing), with N = `n`
    evaluation periods, M = `m` datapoints to alarm, TreatMissingData `treat` and the
    `current` state. Returns (state, reason). See the module docstring for the rules."""
    real = [(len(points) - i, b) for i, b in enumerate(points) if b is not None]  # (age, breaching)
    if len(real) >= n:
        recent = real[-n:]
        breaching = sum(1 for _, b in recent if b)
        state = ALARM if breaching >= m else OK
        return state, f"{breaching} of the {n} most recent datapoints breaching (M = {m})"
    if treat in ("breaching", "notBreaching"):
        fill = n - len(real)
        breaching = sum(1 for _, b in real if b) + (fill if treat == "breaching" else 0)
        state = ALARM if breaching >= m else OK
        return state, (
            f"{len(real)} real datapoints and {fill} filled as {treat}: "
            f"{breaching} breaching (M = {m})"
        )
    if not real:
        if treat == "missing":
            return INSUFFICIENT_DATA, "no datapoint in the evaluation range"
        return current, "no datapoint in the evaluation range: state kept (ignore)"
    breaching = [age for age, b in real if b]
    if len(breaching) >= m:
        return ALARM, f"{len(breaching)} real datapoints breaching (M = {m})"
    if len(breaching) < len(real):
        return OK, f"{len(real)} real datapoints, {len(breaching)} breaching (M = {m})"
    if treat == "missing":
        oldest = max(breaching)
        if oldest >= m:
            return ALARM, (
                f"only breaching datapoints, the oldest {oldest} periods old (>= M = {m})"
            )
        return INSUFFICIENT_DATA, (
            f"only breaching datapoints, the oldest {oldest} periods old (< M = {m})"
        )
    return current, "only breaching datapoints, fewer than M: state kept (ignore)"


@dataclass
class Evaluation:
    """One alarm's replay: every evaluation, the transitions, the final state."""

    alarm: Alarm
    start_ms: int
    end_ms: int
    evaluation_range: int
    evaluations: list = field(default_factory=list)  # dicts: time_ms, values, state, reason
    transitions: list = field(default_factory=list)
    final_state: str = INSUFFICIENT_DATA

    def states(self) -> list:
        return [e["state"] for e in self.evaluations]

    def to_json(self, verbose=False) -> dict:
        out = {
            "config": self.alarm.config(),
            "from": iso(self.start_ms),
            "to": iso(self.end_ms),
            "evaluation_range": self.evaluation_range,
            "transitions": self.transitions,
            "final_state": self.final_state,
        }
        if verbose:
            out["evaluations"] = [
                {"time": iso(e["time_ms"]), **{k: v for k, v in e.items() if k != "time_ms"}}
                for e in self.evaluations
            ]
        return out


def matching_samples(alarm: Alarm, samples: Iterable[Sample]) -> list:
    """The samples of the alarm's metric: namespace, name, the exact dimension set, and
    the alarm's Unit if it names one."""
    dims = tuple(sorted(alarm.dimensions.items()))
    return [
        s
        for s in samples
        if s.namespace == alarm.namespace
        and s.metric == alarm.metric_name
        and s.dimensions == dims
        and (alarm.unit is None or s.unit == alarm.unit)
    ]


def evaluation_step_ms(alarm: Alarm) -> int:
    return 10_000 if alarm.period < 60 else 60_000


def evaluate(
    alarm: Alarm,
    samples: Iterable[Sample],
    start: int | str | None = None,
    end: int | str | None = None,
    evaluation_range: int | None = None,
) -> Evaluation:
    """Replays the alarm over `samples` (all metrics; the alarm picks its own) from `start`
    (default: the whole minute, or 10 s, of the first matching sample) to `end` (default:
    the evaluation just after the last matching sample), evaluating as CloudWatch does."""
    step = evaluation_step_ms(alarm)
    mine = matching_samples(alarm, samples)
    stored = sorted(
        ((s.timestamp_ms - s.timestamp_ms % 60_000 if s.storage_resolution >= 60 else s.timestamp_ms), s.value)
        for s in mine
    )
    times = [t for t, _ in stored]
    if start is None:
        if not stored:
            raise AlarmError(f"{alarm.logical_id}: no datapoint of its metric and no start given")
        start_ms = times[0] - times[0] % step
    else:
        start_ms = parse_time(start)
    if end is None:
        if not stored:
            raise AlarmError(f"{alarm.logical_id}: no datapoint of its metric and no end given")
        end_ms = times[-1] - times[-1] % step + step
    else:
        end_ms = parse_time(end)
    n, m = alarm.evaluation_periods, alarm.datapoints_to_alarm
    size = evaluation_range if evaluation_range is not None else n + 2
    if size < n:
        raise AlarmError(f"evaluation range {size} is shorter than EvaluationPeriods {n}")
    treat = "ignore" if alarm.namespace == "AWS/DynamoDB" else alarm.treat_missing_data
    stat = alarm.statistic or alarm.extended_statistic
    compare = COMPARISONS[alarm.comparison]
    period_ms = alarm.period * 1000
    result = Evaluation(alarm, start_ms, end_ms, size)
    state = INSUFFICIENT_DATA
    # The first evaluation is the first whole step after the alarm exists.
    t = start_ms - start_ms % step + step
    while t <= end_ms:
        values = []
        for k in range(size, 0, -1):
            lo, hi = t - k * period_ms, t - (k - 1) * period_ms
            i, j = bisect.bisect_left(times, lo), bisect.bisect_left(times, hi)
            values.append(statistic(stat, [v for _, v in stored[i:j]]))
        points = [None if v is None else compare(v, alarm.threshold) for v in values]
        new, reason = decide(points, n, m, treat, state)
        result.evaluations.append({"time_ms": t, "values": values, "state": new, "reason": reason})
        if new != state:
            result.transitions.append(
                {"time": iso(t), "time_ms": t, "from": state, "to": new, "reason": reason, "values": values}
            )
            state = new
        t += step
    result.final_state = state
    return result


def evaluate_all(
    alarms: dict,
    samples: list,
    start=None,
    end=None,
    evaluation_range: int | None = None,
) -> dict:
    """evaluate() for each alarm over one timeline (default: the first to the last sample
    of any alarm's metric). An alarm that cannot be evaluated reports its error."""
    if start is None or end is None:
        times = [s.timestamp_ms for a in alarms.values() for s in matching_samples(a, samples)]
        if times:
            step = 60_000
            start = start if start is not None else min(times) - min(times) % step
            end = end if end is not None else max(times) - max(times) % step + step
    out = {}
    for logical, alarm in alarms.items():
        if start is None or end is None:
            out[logical] = {"config": alarm.config(), "error": "no datapoint of any alarm's metric and no --from/--to"}
            continue
        out[logical] = evaluate(alarm, samples, start, end, evaluation_range)
    return out
