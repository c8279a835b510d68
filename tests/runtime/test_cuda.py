"""The CUDA path: each plan stream a torch.cuda.Stream, each plan event a CUDA event.
Skipped without CUDA (CI has none); run on a GPU machine with `pytest -m gpu`."""

from __future__ import annotations

import os

# cuBLAS needs this before its first use for deterministic algorithms.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch

from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import run_schedule
from tests.runtime.test_memory import _tight_cpu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _equal(a, b) -> bool:
    pa, pb = a.params(), b.params()
    return all(torch.equal(pa[n].cpu(), pb[n].cpu()) for n in pa)


def test_streams_and_events_train_what_serial_trains():
    serial = run_schedule(ScheduleSpec(name="serial"), device="cuda")
    assert all(p.is_cuda for p in serial.backend.trainer.params)
    for overlap in ("piggyback", "streams"):
        rp = run_schedule(ScheduleSpec(name="rollplex", overlap=overlap), device="cuda")
        assert _equal(serial, rp), overlap
        assert [r.metrics for r in rp.results] == [r.metrics for r in serial.results]
        for r in rp.results:  # times come from CUDA events, in step order per stream
            for m in r.steps:
                assert r.start_s <= m.start_s <= m.end_s <= r.end_s


def test_offloads_on_cuda_copy_to_host_and_back():
    serial = run_schedule(ScheduleSpec(name="serial"), device="cuda")
    tight = run_schedule(ScheduleSpec(name="serial"), hardware=_tight_cpu(), device="cuda")
    assert max(m.host_bytes for m in tight.results[-1].steps) > 0
    # The plan keeps the policy weights on host between steps: that is where they end.
    assert not any(p.is_cuda for p in tight.backend.trainer.params)
    assert _equal(serial, tight)
