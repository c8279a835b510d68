"""Piggybacked prefix rows (engine/riders.py): the training phase's prefix rows ride a
decode step, in the same GEMMs, and give the trainer what its separate prefix forward
gives (K/V, last logits, response logprobs, every gradient, the vision tower's too), and
the decode the tokens it draws without them. Images, videos (M-RoPE's temporal axis) and
mixed prompts of unequal length."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import features_of, freeze_for_graph
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Pixels, Responses, TokenLogprobs
from rollplex.engine.prefix import cache_kv, prefix_forward
from rollplex.engine.session import DecodeEngine
from rollplex.specs import AlgoSpec
from tests.backends.torch.test_video import BATCHES, renderer  # noqa: F401

G, R = 2, 6


def _trainer(spec, device: str = "cpu", dtype: torch.dtype = torch.float32) -> TorchTrainer:
    model = build_model(spec, seed=0, dtype=dtype).to(device)
    freeze_for_graph(model, spec)
    return TorchTrainer(model, spec, AlgoSpec())


def _setup(spec, renderer, kind: str, device: str = "cpu", dtype=torch.float32):  # noqa: F811
    """A batch of `kind` prompts, a trainer on `device` and the batch's vision features."""
    batch = renderer.encode_batch(BATCHES[kind]).to(device)
    trainer = _trainer(spec, device, dtype)
    with torch.no_grad():
        feats = features_of(trainer.model, Pixels.of(batch))
    return batch, trainer, feats


def _decode(model, batch, feats, seed: int, r: int = R):
    with torch.no_grad():
        prefix = prefix_forward(model, batch.text_only(), feats.values, False)
    gen = torch.Generator(model.device).manual_seed(seed)
    return DecodeEngine(model).start(prefix, G, r, 1.0, 1.0, gen, -1)


def _train_pass(trainer, batch, responses, ridden=None):
    """Prefix (separate, or attached from `ridden`) -> response logprobs -> a loss ->
    backward: (K/V, last logits, logprobs, {param: grad}, saved bytes)."""
    trainer.model.zero_grad(set_to_none=True)
    feats = trainer.vision_encode(Pixels.of(batch))
    text = batch.text_only()
    if ridden is None:
        state, saved = trainer.logprob_prefix(feats, text)
    else:
        state, saved = trainer.attach_ridden(ridden, feats)
    kv = [(k.detach().clone(), v.detach().clone()) for k, v in cache_kv(state.cache)]
    logits = state.last_logits.detach().clone()
    lp, _ = trainer.logprob_response(state, responses, G)
    adv = torch.linspace(-1.0, 1.0, responses.tokens.shape[0], device=lp.values.device)
    old = TokenLogprobs(lp.values.detach() - 0.05, lp.mask)  # ratios off 1: the clip acts
    trainer.backward(trainer.loss(lp, old, adv, None, 0.2, 0.0))
    grads = {n: p.grad.float() for n, p in trainer.model.named_parameters() if p.grad is not None}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in saved.tensors()}
    held = sum(s.nbytes() for s in storages.values())
    return kv, logits, lp.values.detach(), grads, held


@pytest.mark.parametrize("kind", ["image", "video", "mixed"])
@pytest.mark.parametrize("vision", [False, True], ids=["frozen_vision", "trained_vision"])
def test_ridden_prefix_equals_separate_forward(spec, renderer, kind, vision):  # noqa: F811
    spec = spec.model_copy(update={"trainable_vision": vision})
    batch, trainer, feats = _setup(spec, renderer, kind)
    model = trainer.model
    plain = _decode(model, batch, feats, seed=5)
    plain.advance()
    riding = _decode(model, batch, feats, seed=5)
    riding.advance(2)
    rows = trainer.ride_rows(feats, batch.text_only())
    ridden = riding.ride(rows)
    assert not ridden.alone and riding.t == 4  # it was a decode step: token 3 drawn
    riding.advance()
    # the decode rows drew the same tokens with the prefix rows in their GEMMs
    a, b = plain.result(), riding.result()
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    torch.testing.assert_close(b[1], a[1], atol=1e-5, rtol=0)

    responses = Responses(a[0], a[2])
    sep = _train_pass(trainer, batch, responses)
    rid = _train_pass(trainer, batch, responses, ridden)
    # K/V on every valid token (a right-padded prompt's padding is attended by nothing:
    # the ride attends causally, the separate forward masks it; their pads may differ)
    valid = batch.attention_mask.bool()[:, None, :, None]
    for (k0, v0), (k1, v1) in zip(sep[0], rid[0], strict=True):
        torch.testing.assert_close(k1 * valid, k0 * valid, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1 * valid, v0 * valid, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rid[1], sep[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rid[2], sep[2], atol=1e-5, rtol=0)
    assert sep[3].keys() == rid[3].keys()
    assert any("visual" in n for n in sep[3]) == vision  # the tower's gradients, when trained
    for n, g in sep[3].items():
        assert g.abs().max() > 0, n
        torch.testing.assert_close(rid[3][n], g, atol=1e-5, rtol=1e-4, msg=n)
    # what the backward keeps: every layer's input, as the checkpointed forward keeps
    # (which also keeps the final norm's input at every position, the ride only its rows')
    layers = len(model.model.language_model.layers)
    inputs = layers * batch.input_ids.numel() * model.config.text_config.hidden_size * 4
    assert inputs <= rid[4] <= sep[4]


def test_ride_after_the_decode_finished_runs_alone(spec, renderer):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, "mixed")
    session = _decode(trainer.model, batch, feats, seed=1)
    session.advance()
    ridden = session.ride(trainer.ride_rows(feats, batch.text_only()))
    assert ridden.alone
    responses = Responses(*session.result()[::2])
    sep = _train_pass(trainer, batch, responses)
    rid = _train_pass(trainer, batch, responses, ridden)
    torch.testing.assert_close(rid[2], sep[2], atol=1e-5, rtol=0)
    for n, g in sep[3].items():
        torch.testing.assert_close(rid[3][n], g, atol=1e-5, rtol=1e-4, msg=n)
