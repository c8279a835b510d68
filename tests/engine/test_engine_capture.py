"""The engine's graph capture taken again once when CUDA invalidates it, with the CUDA part
stubbed (CPU): what is retried, what is not, and what the retry leaves noted. (The
collector it pauses during capture: tests/planner/test_gc_paused.py.)"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from rollplex.engine import session
from rollplex.engine.session import DecodeEngine

INVALIDATED = "CUDA error: operation failed due to a previous error during capture"


def _engine(model, failures: list[str]) -> tuple[DecodeEngine, list[int]]:
    """An engine whose `_capture_once` raises the queued errors, then returns a graph."""
    engine = DecodeEngine(model)
    calls: list[int] = []

    def capture_once(ws, kv_len):
        calls.append(kv_len)
        if failures:
            raise RuntimeError(failures.pop(0))
        return f"graph at {kv_len}"

    engine._capture_once = capture_once
    return engine, calls


@pytest.fixture
def no_cuda_sync(monkeypatch):
    monkeypatch.setattr(session.torch.cuda, "synchronize", lambda device=None: None)


def test_an_invalidated_capture_is_warmed_up_and_taken_again(model, no_cuda_sync, caplog):
    engine, calls = _engine(model, [INVALIDATED])
    ws = SimpleNamespace(shape=SimpleNamespace(rows=64))
    with caplog.at_level(logging.WARNING, logger=session.__name__):
        assert engine._capture(ws, 320) == "graph at 320"
    assert calls == [320, 320] and engine.capture_retries == 1
    assert "64 rows, kv_len 320 was invalidated" in caplog.text


def test_a_second_invalidation_and_other_errors_are_raised(model, no_cuda_sync):
    engine, calls = _engine(model, [INVALIDATED, INVALIDATED])
    ws = SimpleNamespace(shape=SimpleNamespace(rows=8))
    with pytest.raises(RuntimeError, match="during capture"):
        engine._capture(ws, 64)
    assert calls == [64, 64] and engine.capture_retries == 1
    # an error that is not the capture's (a bad shape, an OOM) is not retried
    engine, calls = _engine(model, ["CUDA out of memory"])
    with pytest.raises(RuntimeError, match="out of memory"):
        engine._capture(ws, 64)
    assert calls == [64] and engine.capture_retries == 0
