"""The engine's graph capture taken again once when CUDA invalidates it, with the CUDA part
stubbed (CPU): what is retried, what is not, and what the retry leaves noted. (The
collector it pauses during capture: tests/planner/test_gc_paused.py.)"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from rollplex.engine import graph_capture
from rollplex.engine.graph_capture import StepGraphs

INVALIDATED = "CUDA error: operation failed due to a previous error during capture"


def _engine(failures: list[str]) -> tuple[StepGraphs, list[int]]:
    """An engine's captures whose `capture_once` raises the queued errors, then returns a
    graph."""
    calls: list[int] = []

    class Stubbed(StepGraphs):
        def capture_once(self, ws, forward, kv_len):
            calls.append(kv_len)
            if failures:
                raise RuntimeError(failures.pop(0))
            return f"graph at {kv_len}"

    return Stubbed(torch.device("cpu")), calls


@pytest.fixture
def no_cuda_sync(monkeypatch):
    monkeypatch.setattr(graph_capture.torch.cuda, "synchronize", lambda device=None: None)


def test_an_invalidated_capture_is_warmed_up_and_taken_again(no_cuda_sync, caplog):
    engine, calls = _engine([INVALIDATED])
    ws = SimpleNamespace(shape=SimpleNamespace(rows=64))
    with caplog.at_level(logging.WARNING, logger=graph_capture.__name__):
        assert engine.capture(ws, None, 320) == "graph at 320"
    assert calls == [320, 320] and engine.retries == 1
    assert "64 rows, kv_len 320 was invalidated" in caplog.text


def test_a_second_invalidation_and_other_errors_are_raised(no_cuda_sync):
    engine, calls = _engine([INVALIDATED, INVALIDATED])
    ws = SimpleNamespace(shape=SimpleNamespace(rows=8))
    with pytest.raises(RuntimeError, match="during capture"):
        engine.capture(ws, None, 64)
    assert calls == [64, 64] and engine.retries == 1
    # an error that is not the capture's (a bad shape, an OOM) is not retried
    engine, calls = _engine(["CUDA out of memory"])
    with pytest.raises(RuntimeError, match="out of memory"):
        engine.capture(ws, None, 64)
    assert calls == [64] and engine.retries == 0
