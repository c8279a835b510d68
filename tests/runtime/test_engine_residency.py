"""The plan's residency of an engine-held rollout becomes sleep and wake calls, in order.

With a rollout that can sleep (vLLM's level 2), the planner frees the engine's weight
copies and its KV pool after the rollout and allocates them again at the weight sync and
the next rollout (planner/lifetimes.py); the executor turns those effects into `sleep(2)`
after the rollout, a weights wake-up before the sync and a KV wake-up before the next
rollout (runtime/engine_residency.py). An engine that cannot sleep gets no calls, and the
plan holds its copy and its pool all step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rollplex.backends.base import Backend, OpResult
from rollplex.jobs.pipeline import plan_step
from rollplex.ops import formulas as F
from rollplex.runtime import Executor
from rollplex.runtime.engine_residency import engine_kv_budget, engine_schedule
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.roles import VLLM_ROLLOUT

AWAKE_ENGINE = replace(VLLM_ROLLOUT, sleep_levels=())  # an engine without sleep mode


class Recorder(Backend):
    """Runs nothing: records op kinds and engine actions in the order the executor issues."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def bind(self, graph) -> None:
        self.graph = graph

    def begin_step(self, step: int, inputs: Any) -> dict[str, Any]:
        return {v.name: object() for v in self.graph.values.values() if v.external}

    def run_op(self, op, inputs, chunk, carry) -> OpResult:
        self.log.append(op.kind)
        return OpResult({p: object() for p in op.outputs})

    def end_step(self) -> dict[str, float]:
        return {}

    def move(self, value: Any, to_host: bool, share: float = 1.0) -> Any:
        return value

    def residency(self, action) -> None:
        self.log.append(str(action))


# 3B images at 32 prompts on 111 GiB (the preset's 256 need ~420 GiB on one GPU: every
# training micro-batch's saved inputs wait for the backward). The backward now sets the
# peak, with room for the engine's no-preemption pool beside the rollout (grown over
# rounds, `api.POOL_ROUNDS`); an engine held all step still fits (110.7 GiB since scoring
# ops' scratch is priced at their padded width: 110 GiB no longer held it).
IMAGE_32 = WORKLOAD_PRESETS["image"].model_copy(update={"prompts_per_step": 32})
H200_111 = HARDWARE_PRESETS["h200"].model_copy(update={"hbm_gib": 111.0, "hbm_reserve": 0.0})


def _workload(workload):
    return WORKLOAD_PRESETS[workload] if isinstance(workload, str) else workload


def _plan(caps, schedule: str, model="tiny", workload="tiny", hardware="cpu", sleep=True):
    hw = HARDWARE_PRESETS[hardware] if isinstance(hardware, str) else hardware
    return plan_step(
        MODEL_PRESETS[model],
        _workload(workload),
        AlgoSpec(),
        hw,
        ScheduleSpec(name=schedule),
        rollout=caps,
        engine_sleep=sleep,
    )


def _actions(planned) -> int:
    order = Executor(planned.plan, planned.graph, Recorder()).order
    sched = engine_schedule(planned.plan, order)
    return sum(len(v) for v in (*sched.before.values(), *sched.after.values()))


@pytest.mark.parametrize(
    ("model", "workload"), [("tiny", "tiny"), ("qwen2_5_vl_3b", IMAGE_32)], ids=["tiny", "3b"]
)
def test_the_planner_sleeps_the_engine_only_when_awake_does_not_fit(model, workload):
    hw = HARDWARE_PRESETS["cpu" if model == "tiny" else "h200"]
    awake = _plan(VLLM_ROLLOUT, "serial", model, workload, hw, sleep=False)
    asleep = _plan(VLLM_ROLLOUT, "serial", model, workload, hw, sleep=True)
    need_awake, need_asleep = awake.plan.devices[0].peak_bytes, asleep.plan.devices[0].peak_bytes
    # roomy: the planner keeps it awake (no sleep/wake to pay)
    roomy = hw.model_copy(update={"hbm_gib": hw.hbm_gib * 4})
    chosen = _plan(VLLM_ROLLOUT, "serial", model, workload, roomy, sleep=None)
    assert _actions(chosen) == 0 and "stays awake" in chosen.plan.notes[0]
    # a budget the sleeping plan fits and the awake one does not: it sleeps
    if model == "tiny":  # (the 3B image plan fills any budget with its KV pool)
        tight_gib = (need_asleep + (need_awake - need_asleep) / 2) / 2**30
        tight = hw.model_copy(update={"hbm_gib": tight_gib})
        chosen = _plan(VLLM_ROLLOUT, "serial", model, workload, tight, sleep=None)
        assert _actions(chosen) == 3 and "sleeps" in chosen.plan.notes[0]
        assert chosen.plan.devices[0].peak_bytes <= tight_gib * 2**30
    assert need_awake >= need_asleep


@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
def test_executor_sleeps_after_rollout_and_wakes_for_sync_and_next_rollout(schedule):
    planned = _plan(VLLM_ROLLOUT, schedule)
    backend = Recorder()
    executor = Executor(planned.plan, planned.graph, backend)
    for k in range(2):
        executor.run_step(k, None)
    log = backend.log
    actions = [e for e in log if "(" in e]
    assert actions == ["wake(kv_cache)", "sleep(level=2)", "wake(weights)"] * 2
    for k in (0, len(log) // 2):  # each RL step
        step = log[k : k + len(log) // 2]
        assert step.index("wake(kv_cache)") == step.index("generate") - 1
        assert step.index("sleep(level=2)") > step.index("generate")
        # nothing reads the engine between its sleep and the weights wake-up
        between = step[step.index("sleep(level=2)") + 1 : step.index("wake(weights)")]
        assert "generate" not in between and "weight_sync" not in between
        assert step.index("wake(weights)") == step.index("weight_sync") - 1


@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
def test_an_engine_that_cannot_sleep_is_held_all_step(schedule):
    planned = _plan(AWAKE_ENGINE, schedule)
    order = Executor(planned.plan, planned.graph, Recorder()).order
    sched = engine_schedule(planned.plan, order)
    assert not sched.before and not sched.after
    dev = planned.plan.devices[0]
    last = max(s.index for s in dev.steps)
    held = {sl.value: sl for sl in dev.slots}
    pool = next(sl for name, sl in held.items() if name.endswith(".kv_pool"))
    assert pool.last == last and pool.size == engine_kv_budget(planned.plan)
    for name, sl in held.items():
        if name.endswith("@rollout"):
            assert sl.last == last  # no copy is dropped: nothing could free it


@pytest.mark.parametrize(
    ("model", "workload", "hardware"),
    [
        ("tiny", "tiny", "cpu"),
        ("qwen2_5_vl_3b", "tiny", "h200"),  # the no-preemption pool fits: it gets it
        ("qwen2_5_vl_3b", IMAGE_32, H200_111),  # the headroom sits off the pool's step
        ("qwen2_5_vl_7b", "video", "h200x8"),
    ],
)
def test_the_plan_sizes_and_counts_the_engine_pool(model, workload, hardware):
    sleeping = _plan(VLLM_ROLLOUT, "serial", model, workload, hardware)
    awake = _plan(AWAKE_ENGINE, "serial", model, workload, hardware, sleep=None)
    m, w = MODEL_PRESETS[model], _workload(workload)
    dev = sleeping.plan.devices[0]
    gen = next(s for s in dev.steps if s.kind == "generate")
    rows = sleeping.graph.values[sleeping.graph.ops[gen.op].inputs["text"]].shape[0]
    prompts = -(-rows // dev.dp)
    expected = F.engine_kv_pool(m, w, prompts, w.group_size, dev.tp)
    cap = F.engine_kv_pool(m, w, prompts, w.group_size, dev.tp, at_cap=True)
    assert engine_kv_budget(sleeping.plan) == gen.pool_bytes
    assert int(expected) <= gen.pool_bytes <= int(cap)
    # below the no-preemption size only when the plan has no memory left for more
    assert gen.pool_bytes == int(cap) or dev.peak_bytes >= dev.budget_bytes - 1
    assert dev.peak_bytes <= dev.budget_bytes
    # the pool is inside the rollout's scratch; at the cap every response fits
    assert gen.scratch_bytes >= gen.pool_bytes
    per_token = F.kv_bytes_per_token(m, dev.tp)
    assert cap >= prompts * w.group_size * w.response_length.max * per_token
    # an engine held all step keeps its copies and pool: never cheaper
    awake_gen = next(s for s in awake.plan.devices[0].steps if s.kind == "generate")
    assert awake.plan.devices[0].peak_bytes >= dev.peak_bytes
    assert awake_gen.pool_bytes <= gen.pool_bytes
