"""The most bytes torch's CPU allocator holds at once while a callable runs, above what was
live before it: read from torch.profiler's memory events (each allocation and free it
reports) as a running sum of their sizes. Their `Total Allocated` is a process-wide count
that a block allocated inside an earlier profile and freed outside it leaves raised, so it
is not read. Used by bench/fused_head.py and the CPU memory tests."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch


def cpu_peak_bytes(run: Callable[[], object]) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:  # fmt: skip
        run()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    live = peak = 0
    for e in memory:
        live += e["args"]["Bytes"]
        peak = max(peak, live)
    return peak
