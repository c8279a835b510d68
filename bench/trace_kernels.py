"""Where a plan step's GPU time goes, from a `train.profile=true` run's measured trace: for
each named step, the kernels that ran inside its host `user_annotation` window, summed by
name, and the window's idle share (time no kernel ran: launch- or host-bound work, which
the profiler's own per-op cost inflates). The host window, not the `gpu_user_annotation`
one, bounds the kernels: a backward launches its kernels from autograd's device thread,
which the GPU annotation (kernels correlated with the step's own thread) leaves out.

    python bench/trace_kernels.py RUN/tb/measured0.*.pt.trace.json.gz --ops train.backward
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rollplex.planner.simulate import union_length
from rollplex.runtime.profile import load_trace


@dataclass(slots=True, frozen=True)
class KernelRow:
    name: str
    count: int
    ms: float


@dataclass(slots=True, frozen=True)
class StepKernels:
    op: str
    window_ms: float  # the step's host span(s), summed
    gpu_window_ms: float  # its GPU annotation's span(s) (its own thread's kernels); 0: none
    busy_ms: float  # the union of kernel time inside it
    kernels: tuple[KernelRow, ...]  # by total time, longest first

    @property
    def idle_share(self) -> float:
        return 1.0 - self.busy_ms / self.window_ms if self.window_ms else 0.0


def load(path: str | Path) -> list[dict]:
    """The trace's events (`load_trace` reads .json and .json.gz)."""
    return load_trace(path)["traceEvents"]


def _windows(events: list[dict], op: str, cat: str) -> list[tuple[float, float]]:
    return [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == cat and e.get("name") == op and "dur" in e
    ]


def step_kernels(events: list[dict], op: str, top: int = 15) -> StepKernels:
    """Kernels inside `op`'s host windows, clipped to them, summed by name."""
    windows = _windows(events, op, "user_annotation")
    if not windows:
        raise KeyError(f"no annotation named {op!r} in the trace")
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    clipped: list[tuple[float, float]] = []
    for e in events:
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        a, b = e["ts"], e["ts"] + e["dur"]
        for lo, hi in windows:
            x, y = max(a, lo), min(b, hi)
            if y > x:
                row = by_name[e["name"]]
                row[0] += 1
                row[1] += y - x
                clipped.append((x, y))
    rows = sorted(
        (KernelRow(n, int(c), us / 1e3) for n, (c, us) in by_name.items()), key=lambda r: -r.ms
    )
    window_us = sum(hi - lo for lo, hi in windows)
    gpu_us = sum(hi - lo for lo, hi in _windows(events, op, "gpu_user_annotation"))
    busy_us = union_length(clipped)
    return StepKernels(op, window_us / 1e3, gpu_us / 1e3, busy_us / 1e3, tuple(rows[:top]))


def markdown(steps: list[StepKernels]) -> str:
    lines = []
    for s in steps:
        lines += [
            f"### {s.op}: {s.window_ms:.1f} ms on the host (GPU annotation "
            f"{s.gpu_window_ms:.1f} ms), kernels busy {s.busy_ms:.1f} ms (idle {s.idle_share:.0%})",
            "| kernel | count | ms | share of window |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r.name[:90]} | {r.count} | {r.ms:.1f} | {r.ms / s.window_ms:.0%} |"
            for r in s.kernels
        ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--ops", default="train.backward", help="comma-separated plan step names")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    events = load(args.trace)
    print(markdown([step_kernels(events, op, args.top) for op in args.ops.split(",")]))


if __name__ == "__main__":
    main()
