"""The disaggregated plan says rank to rank what its cross-pool steps move
(planner/transfers.py): the weights from the layout algebra, the outputs by rows."""

from __future__ import annotations

import pytest

from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.cost_model import CostModel
from rollplex.planner.plan import Plan, Route, Step, Transfer, dump_plan
from rollplex.planner.transfers import busiest_bytes, output_routes, weight_bytes
from rollplex.planner.validate import PlanError, load_plan, validate_plan
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)
from rollplex.weights.layouts import rollout_blocks
from rollplex.weights.params import Split, rollout_tensors

H8 = HARDWARE_PRESETS["h200x8"]


def _plan(model: str, rollout_gpus: int, tp: int, train_tp: int = 1) -> PlanResult:
    sched = ScheduleSpec(
        name="disaggregated",
        rollout_gpus=rollout_gpus,
        parallel={"rollout_tp": tp, "train_tp": train_tp},
    )
    spec, work = MODEL_PRESETS[model], WORKLOAD_PRESETS["video"]
    return plan_step(spec, work, AlgoSpec(), H8, sched, enforce_budget=False)


def _step(plan: Plan, index: int) -> Step:
    return next(s for s in plan.all_steps() if s.index == index)


def _shard_bytes(model: str, tp: int, rank: int) -> int:
    """Rollout rank `rank`'s LLM shard less vLLM's vocab padding, from the full model."""
    spec = MODEL_PRESETS[model]
    total = 0
    for t in rollout_tensors(spec, vision_tp=False):
        if t.tower != "llm":
            continue
        blocks = rollout_blocks(t, rank, 1 if t.split is Split.REPLICATED else tp, t.name)
        total += sum(b.numel for b in blocks if b.param is not None)
    return total * spec.dtype_bytes


@pytest.mark.parametrize("rollout_gpus, tp, train_tp", [(4, 4, 1), (4, 2, 1), (2, 2, 2)])
def test_every_rollout_rank_receives_exactly_its_shard(rollout_gpus, tp, train_tp) -> None:
    plan = _plan("qwen2_5_vl_7b", rollout_gpus, tp, train_tp).plan
    roll, train = plan.devices
    (weights,) = [t for t in plan.transfers if t.what == "weights"]
    step = _step(plan, weights.step)
    assert step.kind == "weight_sync" and step in roll.steps
    got: dict[int, int] = {}
    for r in weights.routes:
        assert r.src in train.ranks and r.dst in roll.ranks and r.nbytes > 0
        got[r.dst] = got.get(r.dst, 0) + r.nbytes
    want = {g: _shard_bytes("qwen2_5_vl_7b", tp, i % tp) for i, g in enumerate(roll.ranks)}
    assert got == want
    cm = CostModel(H8)
    assert step.solo_s == pytest.approx(
        cm.transfer_s(busiest_bytes(weights.routes), H8.internode_gbps)
    )


def test_fsdp_rows_go_to_the_rank_that_decodes_them() -> None:
    """7B, FSDP 4 -> TP 4: each training GPU's chunk of a column-parallel weight is exactly
    one rollout rank's rows, so the biggest route from each trainer goes to 'its' rank."""
    mats = weight_bytes(MODEL_PRESETS["qwen2_5_vl_7b"], ("llm",), 4, 1, 4)
    assert mats is not None
    (m,) = mats
    for g, row in enumerate(m):
        assert max(range(4), key=row.__getitem__) == g
        assert all(b > 0 for b in row)  # row-parallel o/down: every trainer feeds every rank


def test_handover_routes_split_the_rows() -> None:
    routes = output_routes(1200, [0, 1, 2, 3], 2, [4, 5, 6])  # 2 replicas -> 3 trainers
    assert sum(r.nbytes for r in routes) == 1200
    recv = {d: sum(r.nbytes for r in routes if r.dst == d) for d in (4, 5, 6)}
    assert recv == {4: 400, 5: 400, 6: 400}
    assert {r.src for r in routes} <= {0, 1, 2, 3}
    assert Route(0, 4, 400) in routes  # replica 0 holds the first third whole
    # trainer 5 takes half from each replica, from TP rank 1 of each: sends are spread
    assert {r.src for r in routes if r.dst == 5} == {1, 3}
    assert busiest_bytes(routes) == 400


def test_transfers_round_trip_and_name_their_steps() -> None:
    plan = _plan("qwen2_5_vl_7b", 4, 4).plan
    assert {t.what for t in plan.transfers} == {"weights", "rollout outputs"}
    hand = next(t for t in plan.transfers if t.what == "rollout outputs")
    assert _step(plan, hand.step).kind == "transfer"
    back = load_plan(dump_plan(plan))
    assert back == plan
    assert all(isinstance(t, Transfer) and isinstance(t.routes[0], Route) for t in back.transfers)


def test_a_route_inside_one_group_is_a_plan_error() -> None:
    r = _plan("qwen2_5_vl_7b", 4, 4)
    weights = next(t for t in r.plan.transfers if t.what == "weights")
    weights.routes.append(Route(0, 1, 10))  # rollout rank to rollout rank
    with pytest.raises(PlanError, match=r"update.weight_sync.*route 0 -> 1"):
        validate_plan(r.plan, r.graph, budget=False)


def test_colocated_plans_move_nothing_between_groups() -> None:
    r = plan_step(
        MODEL_PRESETS["qwen2_5_vl_7b"],
        WORKLOAD_PRESETS["video"],
        AlgoSpec(),
        H8,
        ScheduleSpec(name="serial"),
    )
    assert r.plan.transfers == []
