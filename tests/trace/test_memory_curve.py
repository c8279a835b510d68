"""The measured memory curve is the allocator's truth: what is resident before a step
(weights, optimizer state) is on it from the step's start under its value's name, it never
falls below the step's resident weights, Reserved is the reserved figure, and the peak the
Memory view shows is the recorded maximum (`max_memory_allocated` on CUDA; the
executor's own count on CPU, checked here on a real tiny run and with a fake allocator).
On CUDA each RL step's curve peaks at that step's own allocator peak, so the steps a trace
exports show theirs even where an earlier step (compiling) peaked higher."""

from __future__ import annotations

import json

import pytest
import torch

from rollplex.runtime import measured_timeline
from rollplex.runtime.accounting import OUTSIDE_STEPS, MemoryLedger
from rollplex.runtime.memory import AllocatorFeed, Env
from rollplex.specs import ScheduleSpec
from rollplex.trace import build_profiler_trace
from tests.runtime.conftest import cached_run

pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler is not installed")
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.run_generator import RunGenerator

pytestmark = pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")
WEIGHTS = ("policy.weights", "ref.weights", "vision.weights")


class FakeAllocator(AllocatorFeed):
    """An allocator whose figures the test sets: a cache above what is allocated, and a
    peak reached inside an op that no value holds afterwards."""

    def __init__(self) -> None:
        self.now, self.cached, self.peak, self.closed = 0, 0, 0, 0

    def set(self, now: int, peak_inside: int = 0) -> None:
        self.now = now
        self.cached = max(self.cached, now, peak_inside) + 4096
        self.peak = max(self.peak, now, peak_inside)

    def allocated(self) -> int:
        return self.now

    def reserved(self) -> int:
        return self.cached

    def max_allocated(self) -> int:
        return self.peak

    def new_window(self) -> None:  # as torch's reset_peak_memory_stats: the peak is now's
        self.closed, self.peak = self.run_peak(), self.now

    def run_peak(self) -> int:
        return max(self.closed, self.peak)


def _profile(timeline):
    trace = json.loads(json.dumps(build_profiler_trace(timeline, 0)))
    data = RunProfileData.from_json("measured0", 1, trace)
    return RunGenerator("measured0", 1, data).generate_run_profile()


@pytest.fixture(scope="module")
def run():
    return cached_run(ScheduleSpec(name="rollplex", overlap="piggyback"))


@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
def test_the_curve_never_drops_below_the_resident_weights(schedule):
    run = cached_run(ScheduleSpec(name=schedule))
    first = run.results[0]
    named = {e.name: e.delta_bytes for e in first.memory[: len(WEIGHTS)]}
    assert named.keys() == set(WEIGHTS) and all(v > 0 for v in named.values())
    assert first.memory[0].t_us <= min(m.start_s for m in first.steps) * 1e6  # before any op
    weights = sum(named.values())
    for r in run.results[1:]:  # still resident from the step before: no drop, no re-report
        assert not [e for e in r.memory if e.name in WEIGHTS]
        assert min(e.total_allocated for e in r.memory) >= weights
    curve = _profile(measured_timeline(run.planned.plan, run.results))
    (points,) = curve.get_memory_curve(memory_metric="B")["rows"].values()
    after = points[2 * len(WEIGHTS) - 1 :]  # the step plot doubles every point but the first
    assert after and min(p[1] for p in after) >= weights


def test_the_shown_peak_is_the_recorded_maximum_and_cpu_runs_say_cpu(run):
    timeline = measured_timeline(run.planned.plan, run.results, device_name="cpu")
    curve = _profile(timeline).get_memory_curve(memory_metric="B")
    recorded = max(max(r.peak_resident_bytes.values()) for r in run.results)
    assert max(p[1] for pts in curve["rows"].values() for p in pts) == recorded
    assert list(curve["rows"]) == ["CPU"]  # no "GPU0" for a CPU run


def _value(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


def test_a_fake_allocator_feeds_the_totals_the_reserved_figure_and_the_peak():
    feed = FakeAllocator()
    ledger = MemoryLedger(1, feed)
    owned = {"w", "adam", "act", "op"}
    env = Env(device={"w": _value(1000), "adam": _value(2000)})
    feed.set(3000, peak_inside=3200)  # loading peaked before the first step
    start = ledger.resident(env, owned, 0, 0.0)
    assert [e.name for e in start[2:]] == [OUTSIDE_STEPS] * 2 and start[2].total_allocated == 3200
    start = start[:2]
    assert [(e.name, e.delta_bytes) for e in start] == [("w", 1000), ("adam", 2000)]
    assert {e.total_allocated for e in start} == {3000}
    assert all(e.total_reserved == feed.reserved() > e.total_allocated for e in start)
    env.device["act"] = _value(500)
    feed.set(3500, peak_inside=9000)  # a workspace no value holds peaked inside the op
    events = ledger.events(env.attribution(owned), 0, 1.0, "op")
    assert [e.delta_bytes for e in events] == [500, 5500, -5500]  # the act, the peak, gone
    assert max(e.total_allocated for e in events) == feed.max_allocated() == 9000
    assert events[-1].total_allocated == 3500
    env.device.pop("act")
    feed.set(3000)
    events = ledger.events(env.attribution(owned), 0, 2.0, "op")
    assert [e.delta_bytes for e in events] == [-500]  # no new peak: no transient
    assert min(e.total_allocated for e in events) >= 3000  # weights and state stay


def test_without_an_allocator_the_totals_are_the_values_count():
    ledger, owned = MemoryLedger(1), {"w", "act"}
    env = Env(device={"w": _value(1000)})
    assert ledger.resident(env, owned, 0, 0.0)[0].total_allocated == 1000
    env.device["act"] = _value(24)
    (e,) = ledger.events(env.attribution(owned), 0, 1.0, "op")
    assert (e.name, e.total_allocated, e.total_reserved) == ("op", 1024, 1024)
    assert ledger.resident(Env(device={"w": env.device["w"]}), owned, 0, 2.0)[0].delta_bytes == -24


def test_host_bytes_follow_every_change_of_the_host_store():
    """The walk of host storages is cached between changes; each change is seen."""
    env = Env(device={"w": _value(1000)})
    assert env.host_bytes() == 0
    env.host["adam"] = _value(2000)
    two = env.host_bytes()
    assert two > 0 and env.host_bytes() == two
    env.host["adam"] = _value(3000)  # the same name, another value
    three = env.host_bytes()
    assert three > two
    env.device["adam"] = env.host.pop("adam")
    assert env.host_bytes() == 0
    # on CPU a host storage is not counted as resident too
    env.host["w"] = env.device["w"]
    assert env.attribution()["w"] == 0


def test_each_step_shows_its_own_peak_and_the_run_keeps_the_highest():
    """Step 1 peaks at 9000 (a compile's workspace); step 2 only at 5000. Step 2's events
    still rise to 5000, the peak the allocator reached in it, and the run's peak stays
    9000: a trace of step 2 alone peaks where the allocator did in step 2."""
    feed = FakeAllocator()
    ledger, owned = MemoryLedger(1, feed), {"w", "op"}
    env = Env(device={"w": _value(3000)})
    feed.set(3000)
    assert [e.name for e in ledger.resident(env, owned, 0, 0.0)] == ["w"]
    feed.set(3000, peak_inside=9000)
    one = ledger.events(env.attribution(owned), 0, 1.0, "op")
    assert max(e.total_allocated for e in one) == 9000 == ledger.step_peak()
    assert ledger.resident(env, owned, 0, 2.0) == []  # nothing changed, no peak outside
    assert ledger.step_peak() == 3000  # step 2's window opened at what is allocated
    feed.set(3000, peak_inside=5000)
    two = ledger.events(env.attribution(owned), 0, 3.0, "op")
    assert [e.delta_bytes for e in two] == [2000, -2000]
    assert max(e.total_allocated for e in two) == 5000 == ledger.step_peak()
    assert ledger.run_peak() == 9000
    feed.set(3000)
    assert ledger.events(env.attribution(owned), 0, 4.0, "op") == []  # no rise: no transient


def test_without_an_allocator_there_is_no_allocator_peak():
    ledger = MemoryLedger(1)
    ledger.resident(Env(device={"w": _value(10)}), {"w"}, 0, 0.0)
    assert ledger.step_peak() is None and ledger.run_peak() is None
