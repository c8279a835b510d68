"""The most bytes torch's CPU allocator holds at once while a callable runs, above what was
live before it: read from torch.profiler's memory events (each allocation and free it
reports) as a running sum of their sizes. Their `Total Allocated` is a process-wide count
that a block allocated inside an earlier profile and freed outside it leaves raised, so it
is not read; `cpu_live_at` reads the same running sum at a marked moment. Used by
bench/fused_head.py, bench/backward_memory.py and the CPU memory tests."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch


def _profiled(run: Callable[[], object]) -> list[dict]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:  # fmt: skip
        run()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


def _memory(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])


def cpu_peak_bytes(run: Callable[[], object]) -> int:
    live = peak = 0
    for e in _memory(_profiled(run)):
        live += e["args"]["Bytes"]
        peak = max(peak, live)
    return peak


def cpu_live_at(run: Callable[[], object], mark: str) -> int:
    """The bytes allocated while `run` runs and still held when it first enters a
    `torch.profiler.record_function(mark)`."""
    events = _profiled(run)
    at = min(e["ts"] for e in events if e.get("name") == mark)
    return sum(e["args"]["Bytes"] for e in _memory(events) if e["ts"] < at)
