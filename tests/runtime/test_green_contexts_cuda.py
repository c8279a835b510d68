"""Green contexts on a GPU: each partition's stream gets the SMs planned (queried back from
the driver), computes right, runs compute-bound work at its share of the SMs, confines a
CUDA graph captured on it (and reports one captured elsewhere), and a partitioned plan runs
through the executor on them. Skipped without CUDA or cuda.bindings; `pytest -m gpu`."""

from __future__ import annotations

import os

# cuBLAS needs this before its first use for deterministic algorithms (conftest's fixture).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch

from rollplex.engine import green_contexts as gc
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import run_schedule


def _bindings() -> bool:
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return False
    return True


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(not _bindings(), reason="needs cuda.bindings (pip install cuda-bindings)"),
]
HALVES = {"gpu0:decode": 0.5, "gpu0:prefix": 0.5}


def _make(fractions: dict[str, float]) -> gc.GreenContexts:
    made = gc.make_green_streams(torch.device("cuda", 0), fractions)
    if isinstance(made, str):
        pytest.fail(f"green contexts were not made: {made}")
    return made


@pytest.fixture
def halves():
    made = _make(HALVES)
    yield made
    made.close()


def _driver_sms(stream: torch.cuda.Stream) -> int:
    """The SMs of the green context `stream` belongs to, asked of the driver directly."""
    from cuda.bindings import driver

    err, green = driver.cuStreamGetGreenCtx(stream.cuda_stream)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    sm = driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
    err, resource = driver.cuGreenCtxGetDevResource(green, sm)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return int(resource.sm.smCount)


def test_each_partition_gets_its_planned_sms(halves):
    total = torch.cuda.get_device_properties(0).multi_processor_count
    major = torch.cuda.get_device_capability(0)[0]
    expected = gc.sm_counts(HALVES, total, gc.default_granularity(major))  # 64 + 68 on an H200
    got = {name: _driver_sms(g.stream) for name, g in halves.streams.items()}
    assert got == expected == {name: g.sms for name, g in halves.streams.items()}
    assert sum(got.values()) == total
    assert all(g.total == total for g in halves.streams.values())
    for g in halves.streams.values():
        assert gc.green_stream(g.stream) is g


def test_a_matmul_on_each_partition_is_right(halves):
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    ref = a @ b
    outs = {}
    current = torch.cuda.current_stream()
    for name, g in halves.streams.items():
        g.stream.wait_stream(current)
        with torch.cuda.stream(g.stream):
            outs[name] = a @ b
        current.wait_stream(g.stream)
    for out in outs.values():
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)


def _ms(fn, stream: torch.cuda.Stream, reps: int = 5) -> float:
    """Milliseconds per call of `fn` issued on `stream` (CUDA events on that stream)."""
    stream.wait_stream(torch.cuda.current_stream())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        fn()  # warm-up
        start.record(stream)
        for _ in range(reps):
            fn()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / reps


def test_work_and_graphs_captured_on_a_partition_run_on_its_sms():
    made = _make({"gpu0:small": 0.125})  # 16 of 132 SMs on an H200
    try:
        g = made.streams["gpu0:small"]
        total = g.total
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)

        def body() -> None:
            torch.matmul(x, x, out=out)

        full = _ms(body, torch.cuda.Stream())
        small = _ms(body, g.stream)
        # compute-bound: a partition of 1/8 of the SMs is several times slower
        assert small > 0.4 * full * total / g.sms, (small, full, g.sms)

        g.stream.wait_stream(torch.cuda.current_stream())
        confined = gc.PartitionGraph()
        with torch.cuda.stream(g.stream):
            confined.captured_on = gc.green_stream()
            assert confined.captured_on is g
            with torch.cuda.graph(confined, stream=g.stream):
                body()
        out.zero_()
        graphed = _ms(confined.replay, g.stream)
        torch.testing.assert_close(out, x @ x, rtol=2e-2, atol=1.0)
        assert graphed > 0.4 * full * total / g.sms, (graphed, full)
        assert g.take_notes() == []  # replayed where it was captured

        elsewhere = gc.PartitionGraph()  # captured on torch's own side stream
        with torch.cuda.graph(elsewhere):
            body()
        unconfined = _ms(elsewhere.replay, g.stream)
        (note,) = g.take_notes()
        assert "captured outside any green context" in note and "'gpu0:small'" in note
        print(
            f"\n{g.sms} of {total} SMs: matmul {small:.2f} ms (whole GPU {full:.2f} ms); graph "
            f"captured there {graphed:.2f} ms, captured elsewhere {unconfined:.2f} ms"
        )
    finally:
        made.close()
    assert gc.green_stream(torch.cuda.current_stream()) is None  # unregistered on close
    with pytest.raises(RuntimeError, match="green context was retired"):
        confined.replay()  # not a launch into a retired context


def test_a_partitioned_plan_runs_on_green_contexts_and_trains_what_serial_trains():
    serial = run_schedule(ScheduleSpec(name="serial"), device="cuda")
    run = run_schedule(ScheduleSpec(name="rollplex", overlap="sm_partition"), device="cuda")
    ex = run.executor
    try:
        assert ex.cuda is not None and not ex.cuda.unpartitioned, ex.cuda.unpartitioned
        planned = {
            f"{d.name}:{st.name}" for d in run.planned.plan.devices for st in d.streams
            if st.partition
        }  # fmt: skip
        assert set(ex.cuda.green) == planned and len(planned) == 2
        notes = run.results[0].notes
        assert sum("runs on a green context of" in n for n in notes) == 2, notes
        first = [m.note for m in run.results[0].steps if "green context" in m.note]
        assert len(first) == 2  # on each partitioned stream's first step
        devs = {d for r in run.results for m in r.steps for d in m.deviations}
        assert not any("SM partition" in d or "not confined" in d for d in devs), devs
        for r in run.results:
            for m in r.steps:
                assert r.start_s <= m.start_s <= m.end_s <= r.end_s
        # other SM counts may pick other kernels: close, not bit-equal
        a, b = serial.params(), run.params()
        for name in a:
            torch.testing.assert_close(b[name].cpu(), a[name].cpu(), rtol=1e-4, atol=1e-5)
    finally:
        ex.close()
