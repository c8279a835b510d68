"""A training forward's `saved` value: what the plan prices is what the torch trainer holds.

The trainer runs every micro-batch's forward before any backward (the graph's forward,
loss and backward are separate steps), so its `saved` value holds every micro-batch's
checkpointed layer inputs until the backward. Over schedules (prefix-shared, verl's
per-sample forward, prefix work in the decode window) x micro-batch counts x float32 and
bfloat16, on the tiny model with every response at the generation cap (the padded width
the runtime holds):
- the runtime's own accounting of each `saved` value (`Env.attribution`, inputs stored
  first as in the executor) equals `saved_activation_bytes` at the shapes the step ran,
  within 2% (0.5% seen; the formula leaves out small index tensors), and does not depend on
  the micro-batch count (a prefix that rode the decode steps holds less: see below);
- the plan's slot for it is that formula at the graph's shapes, whole for any count;
- the executor's resident bytes stay under the planned peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.models import io as models_io
from rollplex.ops.formulas import saved_activation_bytes
from rollplex.planner.residency import PlanOverBudget
from rollplex.planner.sizing import SAVED_PARTS
from rollplex.runtime import Executor, StepResult
from rollplex.runtime.compose import compose
from rollplex.runtime.memory import Env
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ResponseLengthSpec,
    ScheduleSpec,
)

MODEL, CPU, ALGO = MODEL_PRESETS["tiny"], HARDWARE_PRESETS["cpu"], AlgoSpec(lr=1e-3)
# bf16, as on GPUs (the CPU runtime runs float32 unless told): the final norm keeps an
# fp32 copy of its input (under float32, the input itself)
BF16 = MODEL.model_copy(update={"dtype": "bfloat16"})
WORKLOAD = WORKLOAD_PRESETS["tiny"]  # 4 prompts x G=4, responses up to 16 tokens
CAP = WORKLOAD.response_length.max
AT_CAP = ResponseLengthSpec(distribution="fixed", mean=CAP, max=CAP)
TOLERANCE = 0.02

SERIAL = ScheduleSpec(name="serial")
VERL = ScheduleSpec(name="serial", dedup=False)
PIGGYBACK = ScheduleSpec(name="rollplex", overlap="piggyback")
# (schedule, train_micro_tokens, micro-batches the trainer runs); the step has 16 samples
# of 20 prefix + 8 mean response tokens = 448 tokens, 4 prompts' groups.
CASES = [
    (SERIAL, 16384, 1, MODEL),
    (SERIAL, 224, 2, MODEL),
    (SERIAL, 112, 4, MODEL),
    (VERL, 16384, 1, MODEL),
    (VERL, 150, 3, MODEL),
    (VERL, 56, 8, MODEL),
    (PIGGYBACK, 16384, 1, MODEL),
    (PIGGYBACK, 112, 4, MODEL),
    (SERIAL, 16384, 1, BF16),
    (SERIAL, 224, 2, BF16),
    (VERL, 16384, 1, BF16),
    (VERL, 150, 3, BF16),
]
IDS = [f"{s.name}-{'dedup' if s.dedup else 'verl'}-{m}-{k.dtype}" for s, _, m, k in CASES]


@dataclass
class Held:
    """The `saved` values one step's forwards returned: bytes by the runtime's accounting,
    and the formula at the shapes they ran."""

    measured: dict[str, int] = field(default_factory=dict)
    formula: dict[str, float] = field(default_factory=dict)
    ridden: dict[str, float] = field(default_factory=dict)  # rode decode: layers' inputs


@dataclass
class SavedRun:
    planned: PlanResult
    result: StepResult
    held: Held


_RUNS: dict[tuple, SavedRun] = {}


def _ran_formula(model, op, inputs: dict, outputs: dict, packed: bool) -> float:
    """`saved_activation_bytes` at the widths the op ran: the prefix runs whole over the
    prompts' padded ids; responses at their padded width (every row at the cap here, so
    packed or not); verl's per-sample forward per micro-batch over its longest prompt plus
    the padded response width, or packed (schedule.pack_responses) its rows' own prompt +
    response tokens through the decoder, the head still at the padded response width."""
    part = SAVED_PARTS[op.kind]
    if part == "prefix":
        ids = inputs["text"].input_ids
        return saved_activation_bytes(model, ids.shape[0], ids.shape[1], 0, part)
    rows, width = inputs["responses"].tokens.shape
    if part == "response":
        return saved_activation_bytes(model, rows, 0, width, part)
    prompts, lengths = inputs["text"].lengths, inputs["responses"].lengths
    total = 0.0
    for lo, hi in outputs["logprobs"].micro.rows:
        prefix = int(prompts[lo:hi].max())
        if packed:  # the formula is linear in the decoder's tokens: their mean per row
            prefix = float((prompts[lo:hi] + lengths[lo:hi]).sum()) / (hi - lo) - width
        total += saved_activation_bytes(model, hi - lo, prefix, width, part)
    return total


def run_saved(schedule: ScheduleSpec, micro_tokens: int, model=MODEL) -> SavedRun:
    key = (schedule, micro_tokens, model)
    if key in _RUNS:
        return _RUNS[key]
    schedule = schedule.model_copy(update={"train_micro_tokens": micro_tokens})
    planned = plan_step(model, WORKLOAD, ALGO, CPU, schedule)
    with pytest.MonkeyPatch.context() as mp:  # the runtime's dtype follows its device
        mp.setattr(models_io, "default_dtype", lambda _device: getattr(torch, model.dtype))
        config = StepConfig(model, ALGO, seed=0, max_new_tokens=CAP, forced_lengths=AT_CAP)
        backend = compose(config)
    assert backend.trainer.model.dtype == getattr(torch, model.dtype)
    held = Held()
    run_op = backend.run_op
    rides: dict[str, bool] = {}

    def watch(op, inputs, chunk, carry):
        out = run_op(op, inputs, chunk, carry)
        if chunk.rides and not out.deviation:  # its rows rode a decode step
            rides[op.name] = True
        saved = out.outputs.get("saved")
        if saved is not None and chunk.last:
            name = op.outputs["saved"]
            # the executor stores an op's inputs before its outputs: first holder wins
            env = Env(device={**{f"in.{p}": v for p, v in inputs.items()}, **out.outputs})
            held.measured[name] = env.attribution()["saved"]
            held.formula[name] = _ran_formula(
                model, op, inputs, out.outputs, schedule.pack_responses
            )
            if rides.get(op.name):
                ids = inputs["text"].input_ids
                per_token = model.num_layers * model.hidden_size * model.dtype_bytes
                held.ridden[name] = ids.numel() * per_token
        return out

    backend.run_op = watch
    executor = Executor(planned.plan, planned.graph, backend)
    result = executor.run_step(0, TaskData(model, WORKLOAD, seed=0).step(0))
    _RUNS[key] = SavedRun(planned, result, held)
    return _RUNS[key]


@pytest.mark.parametrize(("schedule", "micro_tokens", "count", "model"), CASES, ids=IDS)
def test_planned_saved_bytes_are_what_the_trainer_holds(schedule, micro_tokens, count, model):
    run = run_saved(schedule, micro_tokens, model)
    assert run.result.metrics["train_micro_batches"] == count
    held = run.held
    parts = {SAVED_PARTS[run.planned.graph.producers()[n].kind] for n in held.measured}
    assert parts == ({"full"} if not schedule.dedup else {"prefix", "response"})
    for name, measured in held.measured.items():
        if name in held.ridden:
            # A prefix that rode the decode steps (engine/riders.py) norms only its last
            # rows, and its layer inputs are views of the ride's wider buffers: between its
            # layers' inputs and what the separate forward keeps, which the plan prices
            # (a ride the roles cannot host runs as that forward).
            assert held.ridden[name] <= measured <= held.formula[name], name
            continue
        assert measured == pytest.approx(held.formula[name], rel=TOLERANCE), name
    # Every micro-batch's, not one's: about what a single micro-batch holds, whatever the
    # count (verl's micro-batches pad only to their own longest prompt: a little less).
    # The prefix forward runs in the trainer's micro-batches of prompts (its backward does:
    # backends/torch/prefix_pieces.py), each padded to its own longest prompt, as verl's
    # are: at most what one run over every prompt holds. A ride's (its chunks follow the
    # same count) is bounded above, by its own buffers and the formula.
    whole = run_saved(schedule, 16384, model).held.measured
    for name, measured in held.measured.items():
        if name in held.ridden:
            continue
        prefix = SAVED_PARTS[run.planned.graph.producers()[name].kind] == "prefix"
        low = 0.0 if prefix else 0.95 * whole[name]
        assert low <= measured <= whole[name], name
    # The plan's slot is the formula at the graph's shapes, at least what the step held.
    graph, dev = run.planned.graph, run.planned.plan.devices[0]
    slots = {s.value: s.size for s in dev.slots}
    for name, measured in held.measured.items():
        op = graph.producers()[name]
        ins = graph.inputs_of(op)
        prefix = ins["features"].shape[1] + ins["text"].shape[1] if "text" in ins else 0
        width = ins["responses"].shape[1] if "responses" in ins else 0
        rows = graph.values[name].shape[1]
        planned = saved_activation_bytes(model, rows, prefix, width, SAVED_PARTS[op.kind])
        assert slots[name] == pytest.approx(planned, abs=1), name
        assert slots[name] >= measured, name


@pytest.mark.parametrize(("schedule", "micro_tokens", "count", "model"), CASES, ids=IDS)
def test_resident_bytes_stay_under_the_planned_peak_at_any_count(
    schedule, micro_tokens, count, model
):
    run = run_saved(schedule, micro_tokens, model)
    measured = max(m.resident_bytes for m in run.result.steps)
    assert 0 < measured <= run.planned.plan.devices[0].peak_bytes


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("micro_tokens", [16384, 1024])
def test_a_step_whose_saved_inputs_exceed_the_budget_is_refused_at_any_count(micro_tokens):
    # 3B, the video preset (128 prompts x G=8) on one H200: planned at 70 GiB while the
    # plan sized one micro-batch's saved inputs, though the trainer holds all of them
    # (~200 GiB) until the backward; more micro-batches do not shrink them.
    schedule = ScheduleSpec(name="serial", train_micro_tokens=micro_tokens)
    with pytest.raises(PlanOverBudget) as err:
        plan_step(
            MODEL_PRESETS["qwen2_5_vl_3b"],
            WORKLOAD_PRESETS["video"],
            AlgoSpec(),
            HARDWARE_PRESETS["h200"],
            schedule,
        )
    msg = str(err.value)
    assert "misses by" in msg
    assert "train.logprob_response.saved" in msg and "train.logprob_prefix.saved" in msg
    assert "not a training forward's saved activations" in msg
