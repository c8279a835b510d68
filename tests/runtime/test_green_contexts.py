"""SM partitions on green contexts, the parts that need no GPU: the planned fractions of a
device group become SM counts the driver can split; invalid fractions are refused by
stream name; where green contexts cannot be made the reason reaches the executor's
deviations and run log; a partitioned plan runs on CPU as before."""

from __future__ import annotations

import logging
import math
import sys
import types

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.engine import green_contexts as gc
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.runtime.plan_effects import (
    partition_notes,
    partition_starts,
    unpartitioned_streams,
)
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD, run_schedule

PARTITIONED = ScheduleSpec(name="rollplex", overlap="sm_partition")
FRACTIONS = [(0.5, 0.5), (0.25, 0.75), (0.3, 0.3), (0.1,), (1.0,), (0.05, 0.95), (0.5, 0.25, 0.25)]


@pytest.mark.parametrize("total", [132, 114, 78])
@pytest.mark.parametrize("granularity", [8, 4, 2])
@pytest.mark.parametrize("shares", FRACTIONS, ids=str)
def test_sm_counts_are_whole_groups_within_the_device(total, granularity, shares):
    fractions = {f"gpu0:s{i}": f for i, f in enumerate(shares)}
    sms = gc.sm_counts(fractions, total, granularity)
    assert list(sms) == list(fractions)  # the plan's order
    full = math.isclose(sum(shares), 1)
    assert sum(sms.values()) == total if full else sum(sms.values()) <= total
    for i, (name, n) in enumerate(sms.items()):
        assert n >= granularity, (name, n)  # at least one group
        if full and i == len(sms) - 1:  # the last takes what the others left
            assert n >= round(fractions[name] * total) - granularity
            continue
        assert n % granularity == 0, (name, n)
        assert abs(n - fractions[name] * total) <= granularity, (name, n)  # nearest, +-1 group


@pytest.mark.parametrize(
    ("total", "shares", "expected"),
    [
        (132, (0.5, 0.5), [64, 68]),  # FACTS.md's H200 split
        (114, (0.5, 0.5), [56, 58]),
        (78, (0.5, 0.5), [40, 38]),  # 2 x 5 groups do not fit 9: the later one gives back
        (132, (0.25, 0.75), [32, 100]),
        (132, (0.3, 0.3), [40, 40]),
        (132, (0.01,), [8]),  # at least one group
    ],
)
def test_sm_counts_examples(total, shares, expected):
    fractions = {f"gpu0:s{i}": f for i, f in enumerate(shares)}
    assert list(gc.sm_counts(fractions, total, 8).values()) == expected


@pytest.mark.parametrize(
    ("fractions", "named"),
    [
        ({"gpu0:decode": 0.6, "gpu0:prefix": 0.5}, ["'gpu0:decode' 60%", "'gpu0:prefix' 50%"]),
        ({"gpu0:decode": 0.5, "gpu0:prefix": 0.0}, ["stream 'gpu0:prefix'"]),
        ({"gpu0:decode": 1.5}, ["stream 'gpu0:decode'"]),
        ({"gpu0:decode": float("nan")}, ["stream 'gpu0:decode'"]),
    ],
)
def test_invalid_fractions_are_refused_by_stream_name(fractions, named):
    with pytest.raises(gc.PartitionError) as err:
        gc.sm_counts(fractions, 132, 8)
    assert isinstance(err.value, ValueError)
    for name in named:
        assert name in str(err.value)


def test_more_partitions_than_groups_is_refused():
    fractions = {f"gpu0:s{i}": 0.1 for i in range(5)}
    with pytest.raises(gc.PartitionError, match=r"5 SM partitions .* 16 SMs"):
        gc.sm_counts(fractions, 16, 8)


def _install(monkeypatch, driver, major: int = 9) -> None:
    """`driver` as cuda.bindings.driver, on a GPU of compute capability `major`.0."""
    package = types.ModuleType("cuda.bindings")
    package.driver = driver
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", package)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (major, 0))


def _no_bindings(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda", None)  # `import cuda.bindings` fails
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)


def test_without_cuda_bindings_the_reason_is_returned(monkeypatch):
    _no_bindings(monkeypatch)
    why = gc.make_green_streams(torch.device("cuda", 0), {"gpu0:decode": 0.5})
    assert isinstance(why, str) and "cuda.bindings is not importable" in why
    with pytest.raises(gc.PartitionError, match="gpu0:decode"):  # a plan defect still raises
        gc.make_green_streams(torch.device("cuda", 0), {"gpu0:decode": 2.0})


class _Driver:
    """A fake cuda.bindings.driver: records calls, refuses the split like a driver would."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUdevResourceType:
        CU_DEV_RESOURCE_TYPE_SM = 1

    def __init__(self, sm: object) -> None:
        self.sm, self.calls = sm, []

    def cuGetErrorName(self, err):
        return 0, b"CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGet(self, index):
        return 0, index

    def cuDeviceGetDevResource(self, dev, kind):
        return 0, types.SimpleNamespace(sm=self.sm)

    def cuDevSmResourceSplitByCount(self, groups, resource, flags, minimum):
        self.calls.append((groups, minimum))
        return (914, [], 0, None)


@pytest.mark.parametrize(
    ("sm", "major", "split"),
    [
        # cuda-bindings 13: the resource states its minimum partition and alignment
        (types.SimpleNamespace(smCount=132, minSmPartitionSize=8, smCoscheduledAlignment=8), 9,
         (16, 8)),
        # older bindings: the documented minimum for the architecture (2 before Hopper)
        (types.SimpleNamespace(smCount=108), 8, (54, 2)),
    ],
)  # fmt: skip
def test_a_refused_split_is_a_reason_not_an_error(monkeypatch, sm, major, split):
    driver = _Driver(sm)
    _install(monkeypatch, driver, major)
    why = gc.make_green_streams(torch.device("cuda", 0), {"gpu0:decode": 0.5, "gpu0:prefix": 0.5})
    assert why == "cuDevSmResourceSplitByCount failed: CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"
    assert driver.calls == [split]  # one split into groups of the granularity


def test_bindings_of_another_shape_are_a_reason_not_an_error(monkeypatch):
    driver = _Driver(types.SimpleNamespace(smCount=132))
    driver.cuDevSmResourceSplitByCount = lambda *args: (0, [])  # not the 4-tuple expected
    _install(monkeypatch, driver)
    why = gc.make_green_streams(torch.device("cuda", 0), {"gpu0:decode": 0.5})
    assert isinstance(why, str) and why.startswith("setting up green contexts failed: ValueError")


class _SplittingDriver(_Driver):
    """A fake driver whose split succeeds: `made` groups of 8 SMs and the rest; a green
    context holds the SMs of the resources its descriptor was made from."""

    class CUgreenCtxCreate_flags:
        CU_GREEN_CTX_DEFAULT_STREAM = 1

    class CUstream_flags:
        CU_STREAM_NON_BLOCKING = 1

    def __init__(self, sm: object, made: int) -> None:
        super().__init__(sm)
        self.made, self.descs, self.destroyed = made, [], []

    def _res(self, sms: int, tag: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(sm=types.SimpleNamespace(smCount=sms), tag=tag)

    def cuDevSmResourceSplitByCount(self, groups, resource, flags, minimum):
        self.calls.append((groups, minimum))
        out = [self._res(minimum, i) for i in range(self.made)]
        return 0, out, self.made, self._res(self.sm.smCount - self.made * minimum, "rest")

    def cuDevResourceGenerateDesc(self, parts, count):
        assert count == len(parts)
        self.descs.append([p.tag for p in parts])
        return 0, sum(p.sm.smCount for p in parts)

    def cuGreenCtxCreate(self, desc, dev, flags):
        return 0, ("green", desc, len(self.descs))

    def cuGreenCtxGetDevResource(self, green, kind):
        return 0, self._res(green[1], None)

    def cuGreenCtxStreamCreate(self, green, flags, priority):
        return 0, 1000 + green[2]

    def cuStreamDestroy(self, handle):
        self.destroyed.append(handle)
        return (0,)

    def cuGreenCtxDestroy(self, green):
        self.destroyed.append(green)
        return (0,)


@pytest.mark.parametrize("made", [16, 15])  # 15: the driver may leave more SMs in the rest
def test_partitions_are_disjoint_unions_of_one_split(monkeypatch, made):
    driver = _SplittingDriver(
        types.SimpleNamespace(smCount=132, minSmPartitionSize=8, smCoscheduledAlignment=8), made
    )
    _install(monkeypatch, driver)
    monkeypatch.setattr(torch.cuda, "ExternalStream", _FakeCuda.External)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(gc, "_probe", lambda stream, device: None)
    monkeypatch.setattr(gc, "_REGISTRY", {})  # nothing leaks into other tests
    fractions = {"gpu0:decode": 0.5, "gpu0:prefix": 0.5}
    green = gc.make_green_streams(torch.device("cuda", 0), fractions)
    assert isinstance(green, gc.GreenContexts), green
    assert {n: s.sms for n, s in green.streams.items()} == {"gpu0:decode": 64, "gpu0:prefix": 68}
    decode, prefix = driver.descs
    assert decode == list(range(8))  # whole groups; the rest goes to the last stream
    assert prefix == [*range(8, made), "rest"]
    handle = next(iter(green.streams.values())).stream.cuda_stream
    assert gc.green_stream(_FakeCuda.External(handle)) is green.streams["gpu0:decode"]
    assert green.streams["gpu0:decode"].describe() == (
        "stream 'gpu0:decode' runs on a green context of 64 of 132 SMs (planned 50%)"
    )
    green.close()
    # retired, not destroyed: a block used on a green stream may be freed after the close
    assert not driver.destroyed and gc.green_stream(_FakeCuda.External(handle)) is None
    assert all(s.closed for s in gc._RETIRED if isinstance(s, gc.GreenStream))


class _FakeCuda:
    """torch.cuda's streams and events as inert objects: a CUDA executor built on CPU."""

    class Stream:
        def __init__(self, device=None) -> None:
            self.cuda_stream = id(self)

    class Event:
        def __init__(self, **kwargs) -> None:
            pass

    class External:
        def __init__(self, handle, device=None) -> None:
            self.cuda_stream = handle

        def synchronize(self) -> None:
            pass


def test_without_green_contexts_the_executor_reports_the_reason(monkeypatch, caplog):
    _no_bindings(monkeypatch)
    monkeypatch.setattr(torch.cuda, "Stream", _FakeCuda.Stream)
    monkeypatch.setattr(torch.cuda, "Event", _FakeCuda.Event)
    r = plan_step(MODEL, WORKLOAD, ALGO, CPU, PARTITIONED)
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    with caplog.at_level(logging.WARNING, logger="rollplex.runtime.executor"):
        ex = Executor(r.plan, r.graph, backend, device="cuda")
    pos = {s.index: k for k, s in enumerate(ex.order)}
    starts = partition_starts(r.plan, pos)
    assert len(starts) == 2  # decode and prefix
    assert ex.cuda is not None and not ex.cuda.green
    for name, (first, _) in starts.items():
        (msg,) = [m for m in ex.deviations[first] if f"stream '{name}'" in m]
        assert "runs as a plain CUDA stream: cuda.bindings is not importable" in msg
        assert any(msg in rec.getMessage() for rec in caplog.records)  # the run log
    ex.close()
    with pytest.raises(RuntimeError, match="closed"):
        ex.run_step(0, None)


def test_streams_on_their_green_context_are_not_reported():
    r = plan_step(MODEL, WORKLOAD, ALGO, CPU, PARTITIONED)
    pos = {s.index: k for k, s in enumerate(r.plan.all_steps())}
    names = sorted(partition_starts(r.plan, pos))
    plain = {names[0]: "split refused"}  # the other one got its green context
    (moved,) = unpartitioned_streams(r.plan, pos, plain)
    assert f"stream '{names[0]}'" in moved[1] and moved[1].endswith(": split refused")
    assert unpartitioned_streams(r.plan, pos, {}) == []
    # the one on its green context: what it got is the note of its first step
    first = partition_starts(r.plan, pos)[names[1]][0]
    assert partition_notes(r.plan, pos, {names[1]: "64 of 132 SMs"}) == {first: "64 of 132 SMs"}


def test_a_partitioned_plan_runs_on_cpu():
    run = run_schedule(PARTITIONED, steps=1)
    assert any(st.partition for d in run.planned.plan.devices for st in d.streams)
    (result,) = run.results
    assert {m.step.index for m in result.steps} == {s.index for s in run.planned.plan.all_steps()}
    assert not any("SM partition" in d for m in result.steps for d in m.deviations)


def test_green_stream_lookup_is_empty_without_green_contexts():
    assert gc.green_stream() is None  # no CUDA call when none were made


def test_a_graph_captured_on_a_retired_green_context_refuses_to_replay():
    stream = types.SimpleNamespace(cuda_stream=7)
    green = gc.GreenStream("gpu0:decode", stream, 64, 132, 0.5, closed=True)
    graph = types.SimpleNamespace(captured_on=green)  # PartitionGraph needs CUDA to exist
    with pytest.raises(RuntimeError, match="'gpu0:decode', whose green context was retired"):
        gc.PartitionGraph.replay(graph)
