"""Scoring ops are priced at the width the runtime pads their rows to (ops/response_width.py):
a forward with grad, and its backward, at the expected longest response of one
micro-batch's rows (whole prompts' groups, or samples); a no-grad response part at the
generation cap. On a grid of length distributions x rows x micro-batches: a fixed length
prices the mean exactly, and more rows run together never price fewer tokens."""

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
    ctx = CostContext(MODEL, w, micro_batches=micro)
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
        cost = op_cost(g, g.ops["train.logprob"], CostContext(MODEL, w, micro_batches=micro))
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


@pytest.mark.parametrize(("lengths", "rows"), list(itertools.product(LENGTHS, ROWS)))
def test_no_grad_response_part_priced_at_the_cap(lengths, rows):
    """The reference's response part runs the responses' whole padded width."""
    g, w = _graph(lengths, rows, dedup=True)
    op = g.ops["reference.logprob_response"]
    ins = g.inputs_of(op)
    cap = ins["responses"].shape[1]
    assert cap == w.response_length.max
    for micro in MICRO:  # the trainer's micro-batches do not reach it
        cost = op_cost(g, op, CostContext(MODEL, w, micro_batches=micro))
        assert cost == F.logprob(MODEL, rows, ins["kv"].shape[3], cap, "response")


@pytest.mark.parametrize(("lengths", "rows"), list(itertools.product(LENGTHS, ROWS)))
def test_no_grad_full_forward_priced_at_its_rows_longest(lengths, rows):
    """verl's per-sample reference runs all its rows to their longest response."""
    g, w = _graph(lengths, rows, dedup=False)
    op = g.ops["reference.logprob"]
    ins = g.inputs_of(op)
    prefix = ins["features"].shape[1] + ins["text"].shape[1]
    width = _expected_width(w.response_length, rows)
    assert op_cost(g, op, CostContext(MODEL, w)) == F.logprob(MODEL, rows, prefix, width, "full")


def test_micro_batches_split_over_ranks_first():
    """With dp ranks each runs its own rows' micro-batches: 32 samples on 4 ranks in 2
    micro-batches run 4 rows together, as 8 samples on one rank in 2 do."""
    g, w = _graph("lognormal", 32, dedup=False)
    ranks = op_cost(g, g.ops["train.logprob"], CostContext(MODEL, w, dp=4, micro_batches=2))
    ins = g.inputs_of(g.ops["train.logprob"])
    prefix = ins["features"].shape[1] + ins["text"].shape[1]
    width = _expected_width(w.response_length, 4)
    assert ranks == F.logprob(MODEL, 8, prefix, width, "full", grad=True)
