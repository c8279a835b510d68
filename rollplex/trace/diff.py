"""Planned vs measured: how long each op took against what the planner predicted.

Spans are matched by (device, name); the k-th planned occurrence (in start order) pairs with
the k-th measured one, so repeated ops (one decode per step) compare step by step. Spans
without a partner are returned, never dropped: a missing op is a finding in itself.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from rollplex.trace.timeline import Span, Timeline


@dataclass(slots=True)
class DiffRow:
    device: int
    name: str
    occurrence: int  # k-th span of this (device, name), 0-based; -1 when aggregated
    planned_us: float
    measured_us: float

    @property
    def ratio(self) -> float:
        """measured / planned; inf when the plan said free but it took time."""
        if self.planned_us > 0:
            return self.measured_us / self.planned_us
        return 1.0 if self.measured_us == 0 else math.inf


@dataclass(slots=True)
class TimelineDiff:
    rows: list[DiffRow]
    unmatched_planned: list[Span] = field(default_factory=list)
    unmatched_measured: list[Span] = field(default_factory=list)

    def markdown(self) -> str:
        """A markdown table of the rows, then the unmatched spans of each side."""
        lines = [
            "| device | op | # | planned (us) | measured (us) | measured/planned |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            k = "all" if r.occurrence < 0 else str(r.occurrence)
            lines.append(
                f"| {r.device} | {_cell(r.name)} | {k} | {r.planned_us:.1f} | "
                f"{r.measured_us:.1f} | {r.ratio:.3f} |"
            )
        for side, spans in (
            ("planned", self.unmatched_planned),
            ("measured", self.unmatched_measured),
        ):
            if spans:
                lines += ["", f"Only {side} ({len(spans)}):", ""]
                lines += [
                    f"- device {s.device} stream {s.stream}: {_cell(s.name)} "
                    f"at {s.start_us:.1f} us for {s.dur_us:.1f} us"
                    for s in spans
                ]
        return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _by_key(timeline: Timeline) -> dict[tuple[int, str], list[Span]]:
    groups: dict[tuple[int, str], list[Span]] = defaultdict(list)
    for s in sorted(timeline.spans, key=lambda s: (s.start_us, s.stream)):
        groups[(s.device, s.name)].append(s)
    return groups


def diff_timelines(
    planned: Timeline, measured: Timeline, *, aggregate: bool = False
) -> TimelineDiff:
    """Pair spans by (device, name) and occurrence; `aggregate` sums the pairs per key."""
    plan, meas = _by_key(planned), _by_key(measured)
    result = TimelineDiff(rows=[])
    for key in sorted(plan.keys() | meas.keys()):
        p, m = plan.get(key, []), meas.get(key, [])
        n = min(len(p), len(m))
        pairs = [DiffRow(key[0], key[1], k, p[k].dur_us, m[k].dur_us) for k in range(n)]
        if aggregate and pairs:
            pairs = [
                DiffRow(
                    key[0],
                    key[1],
                    -1,
                    sum(r.planned_us for r in pairs),
                    sum(r.measured_us for r in pairs),
                )
            ]
        result.rows += pairs
        result.unmatched_planned += p[n:]
        result.unmatched_measured += m[n:]
    return result
