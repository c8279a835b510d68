"""Packed response rows (backends/torch/packed_rows.py, packed_attention.py): the response
forward, its LM head, the decode-once replay and verl's per-sample full forward run on the
rows' real tokens only, and give the padded path's logprobs, entropy and every gradient
(fp32, tiny Qwen2.5-VL, rows of unequal length with 1-token rows), while the decoder
layers see no padding."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.decoded_response import decoded_response_logprobs
from rollplex.backends.torch.logprob import ENTROPY_GRAD, response_head_outputs, response_logprobs
from rollplex.backends.torch.packed_rows import PackedRows
from rollplex.backends.torch.values import TokenLogprobs
from rollplex.engine.prefix import prefix_forward
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from tests.backends.torch.test_decode_once import _decode
from tests.backends.torch.test_riders import G, _setup
from tests.backends.torch.test_video import renderer  # noqa: F401

# fp32: the same per-token ops on fewer GEMM rows (another blocking, not other math)
TOL = {"atol": 1e-6, "rtol": 1e-5}


def test_pack_and_unpack_are_inverse_on_the_real_tokens():
    valid = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    packing = PackedRows.of(valid)
    x = torch.arange(9.0).view(3, 3, 1).requires_grad_()
    packed = packing.pack(x)
    assert packing.tokens == 5 and packed.shape == (1, 5, 1)
    assert packed.flatten().tolist() == [0.0, 1.0, 6.0, 7.0, 8.0]
    back = packing.unpack(packed)
    assert torch.equal(back[..., 0], torch.where(valid, x[..., 0], 0.0))
    back.sum().backward()  # gradients reach the real tokens only
    assert torch.equal(x.grad[..., 0], valid.float())


def _layer_tokens(model) -> tuple[list[tuple[int, ...]], list]:
    """[rows, tokens] of every MLP call (the replay calls layers by their class's forward,
    which module hooks on the layer would miss; its MLP is a module call)."""
    seen: list[tuple[int, ...]] = []
    hooks = [
        layer.mlp.register_forward_pre_hook(lambda _m, args: seen.append(tuple(args[0].shape[:2])))
        for layer in model.model.language_model.layers
    ]
    return seen, hooks


def _run(trainer, batch, feats, responses, kept, packed: bool):
    model = trainer.model
    model.zero_grad(set_to_none=True)
    state, _ = trainer.logprob_prefix(feats, batch.text_only())  # as the trainer holds it
    seen, hooks = _layer_tokens(model)
    try:
        args = (model, state, responses.tokens, responses.lengths)
        if kept is None:
            lp, ent = response_logprobs(*args, 1.0, G, ENTROPY_GRAD, packed=packed)
        else:
            layers = kept.layers()
            lp, ent = decoded_response_logprobs(*args, layers, 1.0, ENTROPY_GRAD, packed=packed)
        adv = torch.linspace(-1.0, 1.0, lp.shape[0], device=lp.device)[:, None]
        (-(lp * adv).sum() - 0.01 * ent.sum()).backward()  # through the replay's recompute too
    finally:
        for h in hooks:
            h.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads, seen


@pytest.mark.parametrize("source", ["forward", "decode once"])
def test_packed_rows_give_the_padded_logprobs_and_gradients(spec, renderer, source):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, "mixed")
    responses, kept = _decode(trainer, batch, feats, keep=source == "decode once")
    lengths = responses.lengths
    assert 1 in lengths.tolist() and len(set(lengths.tolist())) > 2
    packed = _run(trainer, batch, feats, responses, kept, packed=True)
    padded = _run(trainer, batch, feats, responses, kept, packed=False)
    torch.testing.assert_close(packed[0], padded[0], **TOL)
    torch.testing.assert_close(packed[1], padded[1], **TOL)
    assert packed[2].keys() == padded[2].keys()
    assert any("layers.1.mlp" in n for n in padded[2])
    for n, g in padded[2].items():
        assert g.abs().max() > 0, n
        torch.testing.assert_close(packed[2][n], g, **TOL, msg=n)
    # The response layers ran the fed tokens only (token j < length predicts j + 1, the
    # last is never fed); the other calls are the prefix's, recomputed in the backward.
    rows, width = responses.tokens.shape
    fed = int(lengths.clamp(max=width - 1).sum())
    assert fed < rows * (width - 1)
    assert (1, fed) in packed[3] and (rows, width - 1) not in packed[3]
    assert (rows, width - 1) in padded[3] and (1, fed) not in padded[3]


def test_the_critic_head_reads_packed_hidden_states_as_padded(spec, renderer):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, "image")
    responses, _ = _decode(trainer, batch, feats, keep=False)
    model = trainer.model
    with torch.no_grad():
        state = prefix_forward(model, batch.text_only(), feats.values, False)
        _, rest = response_head_outputs(model, state, responses.tokens, responses.lengths)
    width = responses.tokens.shape[1]
    fed = torch.arange(width - 1)[None, :] < responses.lengths[:, None]
    assert rest.shape[:2] == (responses.tokens.shape[0], width - 1)
    assert bool((rest[~fed] == 0).all())  # padding left at zero, never read
    with torch.no_grad():
        lp = response_logprobs(model, state, responses.tokens, responses.lengths, packed=False)
        want = torch.log_softmax(rest.float(), -1).gather(-1, responses.tokens[:, 1:, None])[..., 0]
    real = torch.arange(1, width)[None, :] < responses.lengths[:, None]  # real targets
    torch.testing.assert_close(want[real], lp[:, 1:][real], **TOL)


def _full(trainer, batch, feats, responses, packed: bool):
    """verl's per-sample forward ([prefix_i ; response_i] per row) in the trainer's sample
    micro-batches, its clipped loss and backward: (logprobs, {param: grad}, MLP calls)."""
    trainer.packed_responses = packed
    trainer.model.zero_grad(set_to_none=True)
    seen, hooks = _layer_tokens(trainer.model)
    try:
        lp, _ = trainer.logprob(feats.repeat(G), batch.text_only().repeat(G), responses)
        adv = torch.linspace(-1.0, 1.0, lp.values.shape[0], device=lp.values.device)
        old = TokenLogprobs(lp.values.detach() - 0.05, lp.mask)  # the clip acts
        trainer.backward(trainer.loss(lp, old, adv, None, 0.2, 0.0))
    finally:
        for h in hooks:
            h.remove()
    named = trainer.model.named_parameters()
    grads = {n: p.grad.clone() for n, p in named if p.grad is not None}
    return lp.values.detach(), grads, seen


@pytest.mark.parametrize("micro", [1, 2])
def test_the_packed_full_forward_trains_as_the_padded_one(spec, renderer, micro):  # noqa: F811
    """verl's per-sample forward in 1 or 2 sample micro-batches: packed gives the padded
    logprobs and gradients, and its layers see one sequence of real tokens."""
    batch, trainer, feats = _setup(spec, renderer, "mixed")
    responses, _ = _decode(trainer, batch, feats, keep=False)
    trainer.micro_batches = micro
    packed_lp, packed_grads, packed_seen = _full(trainer, batch, feats, responses, True)
    padded_lp, padded_grads, padded_seen = _full(trainer, batch, feats, responses, False)
    torch.testing.assert_close(packed_lp, padded_lp, **TOL)
    assert packed_grads.keys() == padded_grads.keys()
    for n, g in padded_grads.items():
        assert g.abs().max() > 0, n
        torch.testing.assert_close(packed_grads[n], g, **TOL, msg=n)
    assert all(rows == 1 for rows, _ in packed_seen)
    assert all(rows > 1 for rows, _ in padded_seen)
    assert sum(t for _, t in packed_seen) < sum(r * t for r, t in padded_seen)


@pytest.mark.parametrize("pack", [True, False])
def test_the_executor_applies_the_plans_packing_to_every_scorer(pack):
    """schedule.pack_responses reaches the roles through the plan (Plan.meta), the padded
    ablation included: the trainer, its old-policy scorer and the reference."""
    model, algo = MODEL_PRESETS["tiny"], AlgoSpec()
    planned = plan_step(
        model,
        WORKLOAD_PRESETS["tiny"],
        algo,
        HARDWARE_PRESETS["cpu"],
        ScheduleSpec(name="serial", pack_responses=pack),
    )
    assert planned.plan.meta["pack_responses"] is pack
    backend = compose(StepConfig(model, algo, seed=0, max_new_tokens=4))
    Executor(planned.plan, planned.graph, backend)
    assert backend.reference is not None
    for role in (backend.trainer, backend.trainer.scorer(), backend.reference):
        assert role.packed_responses is pack, type(role).__name__
