"""Scoring ops are priced at the width the runtime runs their rows at (ops/response_width.py).
Padded (schedule.pack_responses=false): a forward with grad, and its backward, at the
expected longest response of one micro-batch's rows (whole prompts' groups, or samples); a
no-grad forward at the expected longest of its rows. On a grid of length distributions x
rows x micro-batches: a fixed length prices the mean exactly, and more rows run together
never price fewer tokens. Packed (the default): every scorer at each row's own tokens, the
mean, whatever the rows and micro-batches, never above the padded price."""

from __future__ import annotations

import itertools

import pytest

from rollplex.algos import build_step
from rollplex.graph.passes import DEDUP_PASSES, run_passes
from rollplex.ops import formulas as F
from rollplex.ops.costs import CostContext, op_cost
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from rollplex.specs.workload import ResponseLengthSpec

MODEL = MODEL_PRESETS["qwen2_5_vl_3b"]
LENGTHS = {
    "fixed": ResponseLengthSpec(distribution="fixed", mean=200, max=1024),
    "uniform": ResponseLengthSpec(distribution="uniform", mean=200, min=8, max=1024),
    "lognormal": ResponseLengthSpec(distribution="lognormal", mean=200, sigma=0.45, max=1024),
    "lognormal_capped": ResponseLengthSpec(distribution="lognormal", mean=64, sigma=1.2, max=96),
}
# rows of a step as (prompts, G): 1, 8 and 32 samples
ROWS = {1: (1, 1), 8: (1, 8), 32: (4, 8)}
MICRO = (1, 2, 4)


def _graph(lengths: str, rows: int, dedup: bool):
    prompts, group = ROWS[rows]
    w = WORKLOAD_PRESETS["image"].model_copy(
        update={
            "prompts_per_step": prompts,
            "group_size": group,
            "response_length": LENGTHS[lengths],
        }
    )
    g = build_step(MODEL, w, AlgoSpec())  # verl's per-sample forwards
    return (run_passes(g, DEDUP_PASSES)[0] if dedup else g), w


def _expected_width(spec: ResponseLengthSpec, together: int) -> int:
    """The expected longest of `together` rows (the mean for one row), capped."""
    return max(1, round(min(spec.max, max(spec.mean, spec.expected_max(together)))))


def _together(rows: int, micro: int, dedup: bool) -> int:
    """Rows of one micro-batch: whole groups (dedup, a group shares its prefix) or samples;
    the grid's counts divide evenly."""
    prompts, group = ROWS[rows]
    units, per_unit = (prompts, group) if dedup else (rows, 1)
    return per_unit * units // min(micro, units)


GRID = list(itertools.product(LENGTHS, ROWS, MICRO))


@pytest.mark.parametrize("dedup", [True, False], ids=["prefix_shared", "per_sample"])
@pytest.mark.parametrize(("lengths", "rows", "micro"), GRID)
def test_training_forward_and_backward_priced_at_a_micro_batch_longest(lengths, rows, micro, dedup):
    g, w = _graph(lengths, rows, dedup)
    ctx = CostContext(MODEL, w, packed_responses=False, micro_batches=micro)
    fwd = g.ops["train.logprob_response" if dedup else "train.logprob"]
    ins = g.inputs_of(fwd)
    width = _expected_width(w.response_length, _together(rows, micro, dedup))
    if dedup:
        n, prefix, part = ins["responses"].shape[0], ins["kv"].shape[3], "response"
    else:
        n, prefix, part = rows, ins["features"].shape[1] + ins["text"].shape[1], "full"
    assert op_cost(g, fwd, ctx) == F.logprob(MODEL, n, prefix, width, part, grad=True)
    back = op_cost(g, g.ops["train.backward"], ctx)
    want = F.backward(MODEL, n, prefix, width, part)
    if dedup:  # and the prefix forward's, which no response width reaches
        pre = g.inputs_of(g.ops["train.logprob_prefix"])
        want += F.backward(MODEL, pre["features"].shape[0], prefix, 0, "prefix")
    assert back == want
    if w.response_length.distribution == "fixed":
        assert width == w.response_length.mean


@pytest.mark.parametrize("lengths", sorted(LENGTHS))
def test_more_rows_together_never_price_fewer_tokens(lengths):
    """Fewer micro-batches (more rows in each) and more rows a step: flops per row never
    fall, and at one row a micro-batch they are the mean's."""
    per_row = []
    for rows, micro in [(1, 1), (8, 4), (8, 1), (32, 4), (32, 2), (32, 1)]:
        g, w = _graph(lengths, rows, dedup=False)
        cost = op_cost(
            g,
            g.ops["train.logprob"],
            CostContext(MODEL, w, packed_responses=False, micro_batches=micro),
        )
        per_row.append(cost.flops / rows)
    assert per_row == sorted(per_row)
    spec = LENGTHS[lengths]
    g, w = _graph(lengths, 1, dedup=False)
    ins = g.inputs_of(g.ops["train.logprob"])
    prefix = ins["features"].shape[1] + ins["text"].shape[1]
    mean = F.logprob(MODEL, 1, prefix, min(spec.max, spec.mean), "full", grad=True)
    assert per_row[0] == pytest.approx(mean.flops)
    if spec.distribution == "fixed":
        assert per_row[-1] == pytest.approx(per_row[0])


@pytest.mark.parametrize("dp", [1, 4])
@pytest.mark.parametrize(("lengths", "rows"), list(itertools.product(LENGTHS, ROWS)))
def test_no_grad_response_part_priced_at_its_rows_longest(lengths, rows, dp):
    """The reference's response part runs its rows (a rank's) to their longest response,
    not the cap: under it wherever the expected longest is (a short cap, lognormal_capped,
    is reached by 8 rows), and the mean for a fixed length or a single row."""
    g, w = _graph(lengths, rows, dedup=True)
    op = g.ops["reference.logprob_response"]
    ins = g.inputs_of(op)
    cap = ins["responses"].shape[1]
    assert cap == w.response_length.max
    per_rank = -(-rows // dp)  # each rank's rows, rounded up
    width = _expected_width(w.response_length, per_rank)
    assert width <= cap
    if w.response_length.distribution == "fixed" or per_rank == 1:
        assert width == round(w.response_length.mean)
    for micro in MICRO:  # the trainer's micro-batches do not reach it
        cost = op_cost(
            g, op, CostContext(MODEL, w, packed_responses=False, dp=dp, micro_batches=micro)
        )
        n, prefix = per_rank, ins["kv"].shape[3]
        assert cost == F.logprob(MODEL, n, prefix, width, "response")
        at_cap = F.logprob(MODEL, n, prefix, cap, "response").flops
        assert cost.flops < at_cap if width < cap else cost.flops == at_cap


@pytest.mark.parametrize("dedup", [True, False], ids=["prefix_shared", "per_sample"])
def test_every_no_grad_scorer_priced_at_its_rows_longest(dedup):
    """PPO's no-grad scorers (reference, old-policy with a second epoch, the critic's old
    values), prefix-shared or per-sample: each at its rows' longest, none at the cap."""
    w = WORKLOAD_PRESETS["image"].model_copy(
        update={"prompts_per_step": 4, "group_size": 8, "response_length": LENGTHS["uniform"]}
    )
    g = build_step(MODEL, w, AlgoSpec(name="ppo", ppo_epochs=2))
    g = run_passes(g, DEDUP_PASSES)[0] if dedup else g
    kinds = ("logprob_response",) if dedup else ("logprob",)
    scorers = [op for op in g.ops.values() if op.kind in kinds and "saved" not in op.outputs]
    names = " ".join(op.name for op in scorers)
    assert all(who in names for who in ("reference.logprob", "old_logprob", "critic")), names
    for op in scorers:
        ins = g.inputs_of(op)
        rows = ins["responses"].shape[0]
        width = _expected_width(w.response_length, rows)
        assert width < w.response_length.max
        if dedup:
            prefix, part = ins["kv"].shape[3], "response"
        else:
            prefix, part = ins["features"].shape[1] + ins["text"].shape[1], "full"
        want = F.logprob(MODEL, rows, prefix, width, part)
        assert op_cost(g, op, CostContext(MODEL, w, packed_responses=False)) == want, op.name


@pytest.mark.parametrize(("lengths", "rows"), list(itertools.product(LENGTHS, ROWS)))
def test_no_grad_full_forward_priced_at_its_rows_longest(lengths, rows):
    """verl's per-sample reference runs all its rows to their longest response."""
    g, w = _graph(lengths, rows, dedup=False)
    op = g.ops["reference.logprob"]
    ins = g.inputs_of(op)
    prefix = ins["features"].shape[1] + ins["text"].shape[1]
    width = _expected_width(w.response_length, rows)
    assert op_cost(g, op, CostContext(MODEL, w, packed_responses=False)) == F.logprob(
        MODEL, rows, prefix, width, "full"
    )


def test_micro_batches_split_over_ranks_first():
    """With dp ranks each runs its own rows' micro-batches: 32 samples on 4 ranks in 2
    micro-batches run 4 rows together, as 8 samples on one rank in 2 do."""
    g, w = _graph("lognormal", 32, dedup=False)
    ranks = op_cost(
        g,
        g.ops["train.logprob"],
        CostContext(MODEL, w, packed_responses=False, dp=4, micro_batches=2),
    )
    ins = g.inputs_of(g.ops["train.logprob"])
    prefix = ins["features"].shape[1] + ins["text"].shape[1]
    width = _expected_width(w.response_length, 4)
    assert ranks == F.logprob(MODEL, 8, prefix, width, "full", grad=True)


@pytest.mark.parametrize("dedup", [True, False], ids=["prefix_shared", "per_sample"])
@pytest.mark.parametrize(("lengths", "rows", "micro"), GRID)
def test_packed_scorers_priced_at_each_rows_own_tokens(lengths, rows, micro, dedup):
    g, w = _graph(lengths, rows, dedup)
    mean = max(1, round(w.response_length.mean))
    packed = CostContext(MODEL, w, micro_batches=micro)
    padded = CostContext(MODEL, w, packed_responses=False, micro_batches=micro)
    scorers = [op for op in g.ops.values() if op.kind in ("logprob_response", "logprob")]
    assert scorers and any("saved" in op.outputs for op in scorers)
    for op in [*scorers, g.ops["train.backward"]]:
        if op.kind == "backward":
            fwd = g.ops["train.logprob_response" if dedup else "train.logprob"]
            ins, grad = g.inputs_of(fwd), None
        else:
            ins, grad = g.inputs_of(op), "saved" in op.outputs
        n = ins["responses"].shape[0]
        if dedup:
            prefix, part = ins["kv"].shape[3], "response"
        else:
            prefix, part = ins["features"].shape[1] + ins["text"].shape[1], "full"
        got = op_cost(g, op, packed)
        if grad is not None:
            assert got == F.logprob(MODEL, n, prefix, mean, part, grad=grad), op.name
        assert got.flops <= op_cost(g, op, padded).flops, op.name
