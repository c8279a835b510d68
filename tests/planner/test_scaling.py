"""What keeps planning fast on long graphs must not change a plan: each shortcut against the
straightforward version it replaces."""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

import networkx as nx
import pytest

from rollplex.graph.ir import Graph, Op
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.api import _sizers
from rollplex.planner.cost_model import CostModel
from rollplex.planner.interference import InterferenceModel
from rollplex.planner.order import PHASE_RANK, priority_order
from rollplex.planner.plan import Plan
from rollplex.planner.residency import Memory, settle_memory, settled_time
from rollplex.planner.schedules import PlanningContext
from rollplex.planner.schedules import rollplex as rollplex_schedule
from rollplex.planner.schedules.trials import TrialPlans
from rollplex.planner.simulate import _EPS, _rates, replay
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, AlgoSpec, ScheduleSpec

from .conftest import VIDEO_16, plan_7b, replicated

MODEL = MODEL_PRESETS["qwen2_5_vl_7b"]
ROOMY = HARDWARE_PRESETS["h200x8"].model_copy(update={"hbm_gib": 1e6})


def context(graph: Graph) -> PlanningContext:
    return PlanningContext(
        graph,
        MODEL,
        VIDEO_16,
        ROOMY,
        ScheduleSpec(name="serial", parallel={"rollout_tp": 1}),
        CostModel(ROOMY),
        InterferenceModel(),
    )


def as_networkx(graph: Graph) -> nx.DiGraph:
    """The op graph in networkx: an independent reference for the hand-written orders."""
    g = nx.DiGraph()
    for i, name in enumerate(graph.ops):
        g.add_node(name, index=i)
    made = graph.producers()
    for op in graph.ops.values():
        for v in op.inputs.values():
            if v in made:
                g.add_edge(made[v].name, op.name)
    return g


def reversed_program(graph: Graph) -> Graph:
    """The same ops in reverse program order: producers now come after their consumers."""
    return Graph(graph.values.values(), reversed(list(graph.ops.values())))


@pytest.mark.parametrize("graph", [replicated(3), reversed_program(replicated(3))])
def test_topo_order_is_the_lexicographic_one(graph: Graph) -> None:
    g = as_networkx(graph)
    expected = nx.lexicographical_topological_sort(g, key=lambda n: g.nodes[n]["index"])
    assert [op.name for op in graph.topo_order()] == list(expected)


@pytest.mark.parametrize("graph", [replicated(3), reversed_program(replicated(3))])
def test_priority_order_is_unchanged(graph: Graph) -> None:
    timer = context(graph).timer(8, 8)

    def seconds(op: Op) -> float:
        return timer(op).seconds

    g, rank = as_networkx(graph), {}
    for name in reversed(list(nx.topological_sort(g))):
        rank[name] = seconds(graph.ops[name]) + max(
            (rank[s] for s in g.successors(name)), default=0.0
        )
    index = {name: i for i, name in enumerate(graph.ops)}
    indeg = {n: g.in_degree(n) for n in g.nodes}

    def key(n: str) -> tuple:
        return (PHASE_RANK[graph.ops[n].phase], -rank[n], index[n])

    ready = [(*key(n), n) for n, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    expected = []
    while ready:
        *_, n = heapq.heappop(ready)
        expected.append(n)
        for s in g.successors(n):
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (*key(s), s))
    assert [op.name for op in priority_order(graph, seconds)] == expected


@pytest.mark.parametrize("algo", ["grpo", "ppo", "rloo"])
def test_copies_share_one_pricing_that_matches_the_uncached_one(algo: str) -> None:
    priced = []
    for k in (1, 4):
        graph = replicated(k, algo)
        timer = context(graph).timer(8, 4)
        for op in graph:
            assert timer(op) == timer.inner.time(op), op.name
            assert timer(op, 3) == timer.inner.time(op, 3), op.name
        priced.append(len(timer._by_key))
    assert priced[0] == priced[1]  # copies add no pricing


def reference_replay(plan: Plan, model: InterferenceModel) -> float:
    """The straightforward replay: rescan every stream and every running step each round."""
    fired, event_of = set(), {e.step: e.id for e in plan.events}
    queues = {(d.name, st.stream): deque(st.steps) for d in plan.devices for st in d.streams}
    steps = {s.index: s for d in plan.devices for s in d.steps}
    device = {s.index: d for d in plan.devices for s in d.steps}
    remaining: dict[int, float] = {}
    t = 0.0
    while True:
        for q in queues.values():
            if q and q[0] not in remaining and all(e in fired for e in steps[q[0]].waits):
                steps[q[0]].start_s = t
                remaining[q[0]] = max(steps[q[0]].solo_s, 0.0)
        if not remaining:
            return t
        rates: dict[int, float] = {}
        for d in plan.devices:
            running = [steps[i] for i in remaining if device[i] is d]
            if running:
                partition = {s.stream: s.partition for s in d.streams}
                rates.update(_rates(running, partition, model))
        dt = min(remaining[i] / max(rates[i], _EPS) for i in remaining)
        t += dt
        for i in list(remaining):
            remaining[i] -= dt * rates[i]
            if remaining[i] <= 1e-9 * max(1.0, steps[i].solo_s):
                steps[i].end_s = t
                del remaining[i]
                queues[(device[i].name, steps[i].stream)].popleft()
                if i in event_of:
                    fired.add(event_of[i])


@pytest.mark.parametrize(
    "schedule, overlap",
    [("serial", "auto"), ("disaggregated", "auto"), ("rollplex", "auto")]
    + [("rollplex", mode) for mode in ("streams", "sm_partition", "piggyback")],
)
def test_replay_matches_the_straightforward_one(schedule: str, overlap: str) -> None:
    plan, model = plan_7b(schedule, overlap=overlap).plan, InterferenceModel()
    t = replay(plan, model)
    times = [(s.start_s, s.end_s) for s in plan.all_steps()]
    assert reference_replay(plan, model) == t
    assert [(s.start_s, s.end_s) for s in plan.all_steps()] == times


@pytest.mark.parametrize("hbm_gib", [1e6, 60])
def test_settled_time_is_what_settling_predicts(hbm_gib: float) -> None:
    r = plan_7b("serial", dedup=False)
    hw = HARDWARE_PRESETS["h200x8"].model_copy(update={"hbm_gib": hbm_gib})
    ctx = context(r.graph)

    def fresh() -> tuple[Plan, Memory]:
        plan = rollplex_schedule._build(ctx, ctx.timer(8, 8), list(r.graph), None, {})
        return plan, Memory(
            r.graph, _sizers(plan, ctx), hw.host_link_gbps, "greedy_by_size", hw.hbm_bytes
        )

    plan, mem = fresh()
    quick = settled_time(plan, mem)
    plan, mem = fresh()
    settle_memory(plan, mem)
    assert quick == (plan.step_time_s, plan.fits_budget)


def test_rollplex_trials_stay_bounded_and_never_lose_to_serial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph = replicated(6)
    trials = []
    real = TrialPlans.plan

    def counted(*args: Any, **kwargs: Any) -> Plan | None:
        trials.append(1)
        return real(*args, **kwargs)

    # every attempt (the plan without overlap, then each trial) starts with a trial plan
    monkeypatch.setattr(TrialPlans, "plan", counted)

    def plan(schedule: str) -> PlanResult:
        sched = ScheduleSpec(name=schedule, parallel={"rollout_tp": 1})
        return plan_step(MODEL, VIDEO_16, AlgoSpec(), ROOMY, sched, graph=graph, passes=())

    serial = plan("serial").plan.step_time_s
    full = plan("rollplex").plan
    # The serial plan, then the first reference prefix tries its two placements and the first
    # training prefix its three; each twin after them tries only the placement its first kept.
    assert len(trials) == 1 + (2 + 5) + (3 + 5)
    assert full.step_time_s <= serial
    trials.clear()
    monkeypatch.setattr(rollplex_schedule, "TRIAL_OPS", 4 * len(graph))
    bounded = plan("rollplex").plan
    assert len(trials) == 1 + 4  # the serial plan, then the budget
    assert any("trial budget spent" in note for note in bounded.notes)
    assert full.step_time_s <= bounded.step_time_s <= serial
