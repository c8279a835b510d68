"""prefill_once on the torch roles (backends/torch/exported_prefix.py): the rollout's
prefill, exported, gives the trainer what its separate checkpointed prefix forward gives
(K/V, last logits, response logprobs, every gradient) in fp32 to 1e-6, and the decode the
prefix state it would get from the plain prefill. Images, videos and mixed prompts of
unequal length, on the tiny Qwen2.5-VL."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.base import BackendError
from rollplex.backends.torch.exported_prefix import prefill_exported
from rollplex.backends.torch.rows import move_value
from rollplex.backends.torch.values import Responses, TokenLogprobs
from rollplex.engine.prefix import cache_kv, prefix_forward
from tests.backends.torch.test_riders import G, _decode, _setup
from tests.backends.torch.test_video import BATCHES, renderer  # noqa: F401

TOL = {"atol": 1e-6, "rtol": 0}


def _train(trainer, batch, feats, responses, exported=None):
    """Prefix (separate, or attached from `exported`) -> response logprobs -> a GRPO loss
    with the clip active -> backward: (K/V, last logits, logprobs, {param: grad})."""
    trainer.model.zero_grad(set_to_none=True)
    text = batch.text_only()
    if exported is None:
        state, _ = trainer.logprob_prefix(feats, text)
    else:
        state, _ = trainer.attach_exported(exported, feats)
    kv = [(k.detach().clone(), v.detach().clone()) for k, v in cache_kv(state.cache)]
    logits = state.last_logits.detach().clone()
    lp, _ = trainer.logprob_response(state, responses, G)
    adv = torch.linspace(-1.0, 1.0, responses.tokens.shape[0], device=lp.values.device)
    old = TokenLogprobs(lp.values.detach() - 0.05, lp.mask)
    trainer.backward(trainer.loss(lp, old, adv, None, 0.2, 0.0))
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return kv, logits, lp.values.detach(), grads


@pytest.mark.parametrize("kind", ["image", "video", "mixed"])
def test_exported_prefill_trains_as_the_separate_forward(spec, renderer, kind):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, kind)
    model, text = trainer.model, batch.text_only()
    with torch.no_grad():
        plain = prefix_forward(model, text, feats.values, grad=False)
    state, exported = prefill_exported(model, feats.values, text, "policy@0")
    # the decode's prefix: what the plain prefill gives it, bit for bit
    for (k0, v0), (k1, v1) in zip(cache_kv(plain.cache), cache_kv(state.cache), strict=True):
        assert torch.equal(k1, k0) and torch.equal(v1, v0)
    assert torch.equal(state.last_logits, plain.last_logits)
    assert torch.equal(state.next_positions, plain.next_positions)
    # the export: one input per layer, and the cache's own K/V (no copy)
    ridden = exported.ridden
    assert len(ridden.inputs) == len(model.model.language_model.layers)
    assert all(x.shape == ridden.hidden.shape for x in ridden.inputs)
    for (k, v), (ek, ev) in zip(cache_kv(state.cache), ridden.kv, strict=True):
        assert k.data_ptr() == ek.data_ptr() and v.data_ptr() == ev.data_ptr()
    # the rows' embeddings are the first layer's input, not a second copy (it lives to the
    # backward), and what the export holds is what the plan's `exported` value counts
    assert ridden.rows.embeds is ridden.inputs[0]
    held = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in exported.tensors()
    }
    rows, prefix, width = ridden.hidden.shape
    kv_width = sum(k.shape[1] * k.shape[3] for k in ridden.kv[0])  # K and V: heads x dim
    layers = len(ridden.inputs)
    counted = (layers + 1) * rows * prefix * (width + kv_width) * ridden.hidden.element_size()
    assert sum(held.values()) <= counted
    session = _decode(model, batch, feats, seed=3)
    session.advance()
    tokens, _, lengths = session.result()
    responses = Responses(tokens, lengths)

    sep = _train(trainer, batch, feats, responses)
    once = _train(trainer, batch, feats, responses, exported)
    for (k0, v0), (k1, v1) in zip(sep[0], once[0], strict=True):
        torch.testing.assert_close(k1, k0, **TOL)
        torch.testing.assert_close(v1, v0, **TOL)
    torch.testing.assert_close(once[1], sep[1], **TOL)
    torch.testing.assert_close(once[2], sep[2], **TOL)
    assert sep[3].keys() == once[3].keys()
    assert any("layers.0." in n for n in sep[3])  # the prefix's layers really trained
    for n, g in sep[3].items():
        assert g.abs().max() > 0, n
        torch.testing.assert_close(once[3][n], g, **TOL, msg=n)


def test_a_released_export_is_refused(spec, renderer):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, "image")
    _, exported = prefill_exported(trainer.model, feats.values, batch.text_only(), "policy@0")
    exported.release()
    assert list(exported.tensors()) == []
    with pytest.raises(BackendError, match="already released"):
        trainer.attach_exported(exported, feats)


@pytest.mark.parametrize("kind", ["image", "video"])
def test_an_export_parked_on_host_trains_as_the_one_kept(spec, renderer, kind):  # noqa: F811
    """The plan may offload the export across the decode and onload it before the attach
    (residency's covering rule): the copy back must train exactly as the export it was."""
    batch, trainer, feats = _setup(spec, renderer, kind)
    text = batch.text_only()
    _, exported = prefill_exported(trainer.model, feats.values, text, "policy@0")
    copies: list[torch.Tensor] = []

    def park(x):  # a real copy each way, as to host and back
        if isinstance(x, torch.Tensor):
            copies.append(x.clone())
            return copies[-1]
        return move_value(x, torch.device("cpu"))

    back = exported.moved(park).moved(park)
    ridden = exported.ridden

    def held(e):  # every tensor the export holds, its rows' embeddings too
        return [*e.tensors(), e.ridden.rows.embeds]

    # a tensor held twice moves once: the copy shares exactly what the original shares
    assert len({t.data_ptr() for t in held(back)}) == len({t.data_ptr() for t in held(exported)})
    assert back.version == exported.version
    for a, b in zip(exported.tensors(), back.tensors(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert move_value(exported, torch.device("cpu")).ridden.inputs[0] is not None
    session = _decode(trainer.model, batch, feats, seed=3)
    session.advance()
    tokens, _, lengths = session.result()
    responses = Responses(tokens, lengths)
    kept = _train(trainer, batch, feats, responses, exported)
    parked = _train(trainer, batch, feats, responses, back)
    torch.testing.assert_close(parked[2], kept[2], atol=0, rtol=0)
    for n, g in kept[3].items():
        torch.testing.assert_close(parked[3][n], g, atol=0, rtol=0, msg=n)
    assert ridden.inputs  # the original is untouched by its copies


@pytest.mark.parametrize("kind", ["image", "mixed"])
def test_an_attach_replays_only_live_prompts(spec, renderer, kind, monkeypatch):  # noqa: F811
    """algo.skip_zero_advantage on the attached prefix: the backward replays no layer of a
    prompt whose group's advantages are all 0, and every gradient is the full replay's."""
    from rollplex.engine import riders

    batch, trainer, feats = _setup(spec, renderer, kind)
    _, exported = prefill_exported(trainer.model, feats.values, batch.text_only(), "policy@0")
    session = _decode(trainer.model, batch, feats, seed=3)
    session.advance()
    tokens, _, lengths = session.result()
    responses = Responses(tokens, lengths)
    adv = torch.linspace(-1.0, 1.0, responses.tokens.shape[0])
    adv[:G] = 0.0  # the first prompt's group is dead
    replayed: list[int] = []
    real = riders._layer_backward

    def counting(run, x, grads):
        replayed.append(x.shape[0])
        return real(run, x, grads)

    monkeypatch.setattr(riders, "_layer_backward", counting)
    layers = len(trainer.model.model.language_model.layers)
    grads = {}
    for skip in (False, True):
        replayed.clear()
        trainer.model.zero_grad(set_to_none=True)
        live = {"advantages": adv} if skip else {}
        state, _ = trainer.attach_exported(exported, feats, **live)
        lp, _ = trainer.logprob_response(state, responses, G, **live)
        old = TokenLogprobs(lp.values.detach() - 0.05, lp.mask)
        trainer.backward(trainer.loss(lp, old, adv, None, 0.2, 0.0))
        params = trainer.model.named_parameters()
        grads[skip] = {n: p.grad.clone() for n, p in params if p.grad is not None}
        assert sum(replayed) == layers * (batch.size - skip), (skip, replayed)
    assert grads[True].keys() == grads[False].keys()
    assert any("layers.0." in n for n in grads[False])  # the prefix's layers really trained
    for n, g in grads[False].items():
        torch.testing.assert_close(grads[True][n], g, **TOL, msg=n)
