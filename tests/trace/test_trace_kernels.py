"""bench/trace_kernels.py: the kernels inside a plan step's host window, clipped to it and
summed by name, and the window's idle share."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from trace_kernels import markdown, step_kernels


def _ev(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur}


EVENTS = [
    _ev("user_annotation", "train.backward", 100, 100),  # the window read
    # its own thread's kernels only: autograd's thread launched the rest
    _ev("gpu_user_annotation", "train.backward", 100, 5),
    _ev("user_annotation", "update.optimizer_step", 200, 20),
    _ev("kernel", "gemm", 90, 20),  # straddles the start: 10 us inside
    _ev("kernel", "gemm", 120, 30),
    _ev("kernel", "flash_bwd", 140, 20),  # overlaps the gemm: busy counts it once
    _ev("kernel", "adam", 205, 10),  # the next step's
]


def test_kernels_are_clipped_to_the_host_window_and_summed_by_name():
    s = step_kernels(EVENTS, "train.backward")
    assert s.window_ms == pytest.approx(0.1) and s.gpu_window_ms == pytest.approx(0.005)
    assert [(r.name, r.count, round(r.ms * 1e3)) for r in s.kernels] == [
        ("gemm", 2, 40),
        ("flash_bwd", 1, 20),
    ]
    assert s.busy_ms == pytest.approx(0.05)  # [100,110) + [120,160)
    assert s.idle_share == pytest.approx(0.5)
    assert "| gemm | 2 | 0.0 | 40% |" in markdown([s])


def test_a_step_without_kernels_or_gpu_annotation_and_a_missing_op():
    s = step_kernels(EVENTS, "update.optimizer_step")
    assert s.gpu_window_ms == 0 and [r.name for r in s.kernels] == ["adam"]
    assert s.idle_share == pytest.approx(0.5)
    with pytest.raises(KeyError, match=r"train\.logprob_response"):
        step_kernels(EVENTS, "train.logprob_response")
