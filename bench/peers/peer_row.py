"""One framework's measured row for bench/results/peers/peers.json, shared by the runners.

A row has the keys the peers issue names: framework, schedule, shape, workload,
device_name, step_time_s (median of steps 2+), tokens_per_s, peak_bytes (torch's
max_memory_allocated), peak_device_bytes (what the device reports in use: vLLM allocates
outside torch's allocator), phases (the framework's own timings, median per step), and
error where the run failed.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch


def steady(values: list[float]) -> float | None:
    """Median of steps 2+ (the first step compiles, captures and warms up)."""
    rest = values[1:] if len(values) > 1 else values
    return statistics.median(rest) if rest else None


class DevicePeak:
    """The most device memory in use (total - free, as nvidia-smi counts it), sampled every
    `every_s` on a thread; on CPU it records nothing."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.every_s = every_s

    def __enter__(self) -> DevicePeak:
        if torch.cuda.is_available():
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            time.sleep(self.every_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def row(
    framework: str,
    schedule: str,
    shape: str,
    workload: str,
    step_times: list[float],
    tokens_per_step: int,
    *,
    peak_device_bytes: int = 0,
    phases: dict[str, list[float]] | None = None,
    error: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    step = steady(step_times)
    return {
        "framework": framework,
        "schedule": schedule,
        "shape": shape,
        "workload": workload,
        "device_name": device_name(),
        "step_time_s": step,
        "tokens_per_s": tokens_per_step / step if step else None,
        "peak_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
        "peak_device_bytes": peak_device_bytes or None,
        "step_times_s": step_times,
        "tokens_per_step": tokens_per_step,
        "phases": {k: steady(v) for k, v in (phases or {}).items()},
        "error": error,
        **extra,
    }


def write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
