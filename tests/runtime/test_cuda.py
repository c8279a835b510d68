"""The CUDA path: each plan stream a torch.cuda.Stream, each plan event a CUDA event.
Skipped without CUDA (CI has none); run on a GPU machine with `pytest -m gpu`."""

from __future__ import annotations

import os

# cuBLAS needs this before its first use for deterministic algorithms.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch

from rollplex.backends.torch.data import TaskData
from rollplex.runtime.plan_tables import initial_host, persistent_values
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import MODEL, WORKLOAD, run_schedule
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
        # the rollout's logprobs (the old ones) come from decode GEMMs whose shapes differ
        # by plan (riding rows, a second stream), which round differently on CUDA: the
        # metrics read from them agree to that rounding (measured on an H100: 1.2e-4)
        for got, want in zip(rp.results, serial.results, strict=True):
            assert got.metrics.keys() == want.metrics.keys()
            for k, v in want.metrics.items():
                assert got.metrics[k] == pytest.approx(v, rel=1e-3, abs=1e-3), (overlap, k)
        for r in rp.results:  # times come from CUDA events, in step order per stream
            for m in r.steps:
                assert r.start_s <= m.start_s <= m.end_s <= r.end_s


def test_offloads_on_cuda_copy_to_host_and_back():
    serial = run_schedule(ScheduleSpec(name="serial"), device="cuda")
    tight = run_schedule(ScheduleSpec(name="serial"), hardware=_tight_cpu(), device="cuda")
    assert max(m.host_bytes for m in tight.results[-1].steps) > 0
    # What the plan keeps on host between steps (today the tower, the reference and AdamW's
    # state; once the policy weights) is there at the step's end, the rest on the GPU.
    ex = tight.executor
    persistent = persistent_values(ex.graph)
    on_host = initial_host(ex.graph, ex.order) & persistent
    assert on_host
    inputs = TaskData(MODEL, WORKLOAD, seed=0).step(0)
    handles = tight.backend.begin_step(len(tight.results), inputs)  # the roles' handles
    shares = {s.op: s.share for s in ex.order if s.kind == "offload"}
    for name in persistent:
        tensors = _tensors(handles[name])
        total = sum(t.nbytes for t in tensors)
        host = sum(t.nbytes for t in tensors if not t.is_cuda)
        if name in on_host:  # AdamW's state may move in part: its plan's share at least
            assert host >= 0.99 * shares[name] * total > 0, name
        else:
            assert host == 0, name
    assert _equal(serial, tight)


def _tensors(handle) -> list[torch.Tensor]:
    """A weights or optimizer-state handle's tensors."""
    if hasattr(handle, "params"):
        return list(handle.params)
    return [t for t in handle.tensors() if t.numel() > 1]  # AdamW's step counts stay put


def test_profiled_cuda_steps_hold_kernels_and_memory_named_by_plan_step(tmp_path):

    from rollplex.backends.step import StepConfig
    from rollplex.backends.torch.data import TaskData
    from rollplex.jobs.pipeline import plan_step
    from rollplex.runtime import Executor
    from rollplex.runtime.compose import compose
    from rollplex.runtime.profile import export_run, load_trace, step_profiler
    from rollplex.trace.torch_trace import PLAN_TID
    from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD

    planned = plan_step(
        MODEL,
        WORKLOAD,
        ALGO,
        CPU,
        ScheduleSpec(name="rollplex", overlap="streams", chunk_tokens=40),
    )
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4, device="cuda"))
    ex = Executor(planned.plan, planned.graph, backend, device="cuda")
    data = TaskData(MODEL, WORKLOAD, seed=0)
    ex.run_step(0, data.step(0))
    prof = step_profiler("cuda")
    with prof:
        results = [ex.run_step(k, data.step(k)) for k in (1, 2)]
    paths = export_run(tmp_path, planned.plan, results, prof)
    trace = load_trace(next(p for p in paths if p.name.startswith("measured0")))
    events = trace["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
    names = {s.name for s in planned.plan.all_steps()}
    assert names <= {e["name"] for e in events if e.get("cat") == "cpu_op"}
    allocs = [
        e
        for e in events
        if e.get("name") == "[memory]"
        and e["args"].get("Device Type") == 1
        and e["args"]["Bytes"] > 0
    ]
    total = sum(e["args"]["Bytes"] for e in allocs)
    assert total > 0
    assert sum(e["args"]["Bytes"] for e in allocs if e["tid"] == PLAN_TID) >= 0.9 * total


def test_each_step_records_its_allocator_peak_and_its_curve_reaches_it():
    """The allocator's window opens at each RL step's start: a step's memory events rise
    to that step's own `max_memory_allocated` (a later step's curve is not capped by an
    earlier step's compile peak), and the run's peak is the highest window's."""
    run = run_schedule(ScheduleSpec(name="serial"), device="cuda")
    peaks = [r.allocator_step_peak for r in run.results]
    assert all(p is not None and p > 0 for p in peaks)
    for r in run.results:
        assert max(e.total_allocated for e in r.memory) == r.allocator_step_peak
    runs = [r.allocator_run_peak for r in run.results]
    assert runs == sorted(runs) and runs[-1] == max(peaks)
