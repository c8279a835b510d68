"""The forwards outside the trainer's (vision, prefix forwards, no-grad scoring) run in the
plan's micro-batches (`Plan.meta["op_micro_batches"]`, ops/micro_batches.py): each over
whole-unit row ranges, merged in row order to what the unsplit op gives (CPU fp32), over
exactly the ranges the plan priced, and with the largest live allocation inside the op
shrinking with the count (torch's CPU allocator, as torch.profiler records it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.activations import SavedActivations
from rollplex.backends.torch.data import TaskData
from rollplex.backends.torch.values import Features, TokenLogprobs
from rollplex.engine.prefix import PrefixState, cache_kv
from rollplex.graph.ir import Phase
from rollplex.jobs.pipeline import plan_step
from rollplex.ops import micro_batches as mb
from rollplex.runtime import Executor, forward_ops
from rollplex.runtime.compose import compose
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from cpu_memory import cpu_peak_bytes

# 3 prompts x G=2: 3 prompt rows, 6 sample rows; counts that divide neither, 2 that
# divides the samples, and one above every op's rows
SHAPE = WORKLOAD.model_copy(update={"prompts_per_step": 3, "group_size": 2})
COUNTS = [2, 4, 7]
VERL_LIKE = ScheduleSpec(name="serial", dedup=False, train_micro_fused=True)
SCHEDULES = {"verl-like": VERL_LIKE, "serial+dedup": ScheduleSpec(name="serial")}
EXPECTED = {
    "verl-like": {"vision_encode", "prefix_prefill", "logprob"},
    "serial+dedup": {"vision_encode", "prefix_prefill", "logprob_prefix", "logprob_response"},
}


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, Features):
        return [value.values, torch.tensor(value.tokens)]
    if isinstance(value, TokenLogprobs):
        return [value.values, value.mask]
    if isinstance(value, PrefixState):
        kv = [t for pair in cache_kv(value.cache) for t in pair]
        fields = (value.attention_mask, value.next_positions, value.rope_deltas, value.lengths)
        return [*kv, value.last_logits, *fields]
    raise AssertionError(f"no comparison for {type(value).__name__}")


def _assert_same(whole: dict[str, Any], split: dict[str, Any], what: str) -> None:
    assert set(split) == set(whole), what
    for port, value in whole.items():
        if isinstance(value, SavedActivations):
            continue  # what autograd keeps: per range by design; the gradients are tested
        a, b = _tensors(value), _tensors(split[port])
        assert len(a) == len(b), f"{what}.{port}"
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(y, x, atol=1e-6, rtol=0, msg=f"{what}.{port}")


@pytest.mark.parametrize("algo", ["grpo", "ppo"])  # PPO: the critic's and old policy's too
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_each_forward_in_micro_batches_equals_it_whole(name, algo):
    spec = ALGO.model_copy(update={"name": algo})
    planned = plan_step(MODEL, SHAPE, spec, CPU, SCHEDULES[name])
    planned.plan.meta["op_micro_batches"] = {}  # the step itself runs every op whole
    backend = compose(StepConfig(MODEL, spec, seed=0, max_new_tokens=4))
    inner, graph, checked = backend.run_op, planned.graph, set()

    def run_op(op, inputs, chunk, carry):
        whole = inner(op, inputs, chunk, carry)
        if chunk.count == 1 and mb.op_units(graph, op, 1.0) is not None:
            for count in COUNTS:  # the same inputs again, cut into `count` micro-batches
                backend.op_micro_batches({op.name: count})
                split = inner(op, inputs, chunk, {})
                backend.op_micro_batches({})
                _assert_same(whole.outputs, split.outputs, f"{op.name} in {count}")
            checked.add((op.name, op.kind))
        return whole

    backend.run_op = run_op
    Executor(planned.plan, graph, backend).run_step(0, TaskData(MODEL, SHAPE, seed=0).step(0))
    assert {kind for _, kind in checked} == EXPECTED[name]
    critic = {n for n, _ in checked if "critic" in n}  # its old values and training prefix
    assert bool(critic) == (algo == "ppo")


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_runtime_cuts_the_ranges_the_plan_priced(monkeypatch, name):
    # one token a micro-batch: every forward the runtime cuts, at one unit each
    schedule = SCHEDULES[name].model_copy(update={"train_micro_tokens": 1})
    planned = plan_step(MODEL, SHAPE, ALGO, CPU, schedule)
    counts = planned.plan.meta["op_micro_batches"]
    graph = planned.graph
    priced = {}
    for op_name, count in counts.items():
        units, _ = mb.op_units(graph, graph.ops[op_name], 1.0)
        priced[op_name] = mb.micro_ranges(units, count)  # one GPU: all its rows
    assert {graph.ops[n].kind for n in priced} == EXPECTED[name]
    assert all(len(r) > 1 for r in priced.values())

    cut: dict[str, list[tuple[int, int]]] = {}
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    inner = backend.run_op

    def run_op(op, inputs, chunk, carry):
        def ranges(units: int, count: int) -> list[tuple[int, int]]:
            cut[op.name] = mb.micro_ranges(units, count)
            return cut[op.name]

        monkeypatch.setattr(forward_ops, "micro_ranges", ranges)
        return inner(op, inputs, chunk, carry)

    backend.run_op = run_op
    Executor(planned.plan, graph, backend).run_step(0, TaskData(MODEL, SHAPE, seed=0).step(0))
    assert cut == priced
    # and only those: the trainer's forwards keep their own count (train_micro_batches)
    assert not any(
        graph.ops[n].phase is Phase.TRAIN and graph.ops[n].kind == "logprob" for n in cut
    )


def test_the_largest_live_allocation_shrinks_with_the_count():
    # verl-like: 8 samples' images (112x112) through the reference's tower and forward
    shape = WORKLOAD.model_copy(
        update={"prompts_per_step": 2, "group_size": 4, "height": 112, "width": 112}
    )
    planned = plan_step(MODEL, shape, ALGO, CPU, VERL_LIKE)
    planned.plan.meta["op_micro_batches"] = {}
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    inner, peaks = backend.run_op, {}

    def run_op(op, inputs, chunk, carry):
        if op.name in ("reference.vision_encode", "reference.logprob"):
            for count in (1, 2, 4):
                backend.op_micro_batches({op.name: count})
                peaks[op.name, count] = cpu_peak_bytes(lambda: inner(op, inputs, chunk, {}))
            backend.op_micro_batches({})
        return inner(op, inputs, chunk, carry)

    backend.run_op = run_op
    Executor(planned.plan, planned.graph, backend).run_step(
        0, TaskData(MODEL, shape, seed=0).step(0)
    )
    for name in ("reference.vision_encode", "reference.logprob"):
        one, two, four = (peaks[name, n] for n in (1, 2, 4))
        # about the largest range's share of the whole op's, plus the merged outputs
        assert four < two < one and two < 0.7 * one and four < 0.45 * one, (name, peaks)
