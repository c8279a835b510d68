"""The training prefix in pieces (backends/torch/prefix_pieces.py): a prefix forward run a
micro-batch of prompts at a time, its parts joined as leaves, trains exactly as the whole
forward (K/V, last logits, response logprobs, every gradient, the vision tower's when it
trains; fp32 to 1e-6), and so does an attached prefill whose layers recompute in pieces.
Each piece's backward runs in a call of its own, so no second copy of the gradients
builds up (the memory side: tests/runtime/test_backward_memory.py)."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.exported_prefix import prefill_exported
from rollplex.backends.torch.prefix_pieces import pieces_of
from rollplex.backends.torch.values import Pixels, Responses, TokenLogprobs
from rollplex.engine.prefix import cache_kv
from rollplex.ops.micro_batches import micro_ranges
from tests.backends.torch.test_riders import G, _decode, _trainer
from tests.backends.torch.test_video import BATCHES, renderer  # noqa: F401

TOL = {"atol": 1e-6, "rtol": 0}


def _prefix(trainer, batch, feats, pieces: int):
    """The training prefix whole (pieces=1), or in `pieces` parts joined as the runtime's
    dispatch joins an op's micro-batches (its LM head deferred to the merge)."""
    text = batch.text_only()
    if pieces == 1:
        return trainer.logprob_prefix(feats, text)[0]
    parts = []
    for lo, hi in micro_ranges(batch.size, pieces):
        state, saved = trainer.logprob_prefix(feats.select(lo, hi), text.select(lo, hi), False)
        parts.append({"kv": state, "saved": saved})
    return trainer.merge_rows(parts)["kv"]


def _train(trainer, batch, responses, prefix):
    """prefix(trainer, features) -> response logprobs -> a GRPO loss with the clip active ->
    backward: (K/V, last logits, logprobs, {param: grad})."""
    trainer.model.zero_grad(set_to_none=True)
    feats = trainer.vision_encode(Pixels.of(batch))
    state = prefix(trainer, feats)
    kv = [(k.detach().clone(), v.detach().clone()) for k, v in cache_kv(state.cache)]
    logits = state.last_logits.detach().clone()
    lp, _ = trainer.logprob_response(state, responses, G)
    adv = torch.linspace(-1.0, 1.0, responses.tokens.shape[0])
    old = TokenLogprobs(lp.values.detach() - 0.05, lp.mask)
    trainer.backward(trainer.loss(lp, old, adv, None, 0.2, 0.0))
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return kv, logits, lp.values.detach(), grads


def _assert_same(whole, cut, vision: bool) -> None:
    for (k0, v0), (k1, v1) in zip(whole[0], cut[0], strict=True):
        torch.testing.assert_close(k1, k0, **TOL)
        torch.testing.assert_close(v1, v0, **TOL)
    torch.testing.assert_close(cut[1], whole[1], **TOL)
    torch.testing.assert_close(cut[2], whole[2], **TOL)
    assert cut[3].keys() == whole[3].keys()
    assert any("language_model.layers.0." in n for n in whole[3])  # the prefix trained
    assert any("visual." in n for n in whole[3]) == vision  # and the tower, when it trains
    for n, g in whole[3].items():
        assert g.abs().max() > 0, n
        torch.testing.assert_close(cut[3][n], g, **TOL, msg=n)


def _responses(trainer, batch):
    with torch.no_grad():
        feats = trainer.vision_encode(Pixels.of(batch))
    session = _decode(trainer.model, batch, feats, seed=3)
    session.advance()
    tokens, _, lengths = session.result()
    return Responses(tokens, lengths)


@pytest.mark.parametrize("vision", [False, True], ids=["frozen-tower", "trained-tower"])
@pytest.mark.parametrize("kind", ["image", "video", "mixed"])
def test_a_prefix_in_pieces_trains_as_the_whole_forward(spec, renderer, kind, vision):  # noqa: F811
    spec = spec.model_copy(update={"trainable_vision": vision})
    batch = renderer.encode_batch(BATCHES[kind])
    trainer = _trainer(spec)
    trainer.micro_batches = batch.size  # a response micro-batch per prompt, as pieces
    responses = _responses(trainer, batch)
    whole = _train(trainer, batch, responses, lambda t, f: _prefix(t, batch, f, 1))
    for pieces in range(2, batch.size + 1):
        cut = _train(trainer, batch, responses, lambda t, f, n=pieces: _prefix(t, batch, f, n))
        _assert_same(whole, cut, vision)


@pytest.mark.parametrize("vision", [False, True], ids=["frozen-tower", "trained-tower"])
@pytest.mark.parametrize("kind", ["image", "mixed"])
def test_an_attached_prefill_recomputed_in_pieces_trains_as_one_recompute(
    spec,
    renderer,  # noqa: F811
    kind,
    vision,
):
    """prefill_once: the attach's layers recompute in the trainer's micro-batches of the
    prompts (engine/riders.py `_Replayed`), one range at a time; the gradients are those
    of the recompute over every prompt at once (micro_batches=1)."""
    spec = spec.model_copy(update={"trainable_vision": vision})
    batch = renderer.encode_batch(BATCHES[kind])
    trainer = _trainer(spec)
    responses = _responses(trainer, batch)

    def attached(t, feats):
        with torch.no_grad():
            plain = feats.values.detach()
        _, exported = prefill_exported(t.model, plain, batch.text_only(), "policy@0")
        return t.attach_exported(exported, feats)[0]

    trainer.micro_batches = 1
    once = _train(trainer, batch, responses, attached)
    trainer.micro_batches = batch.size
    pieces = _train(trainer, batch, responses, attached)
    _assert_same(once, pieces, vision)


def test_the_joined_prefix_is_one_node_over_its_pieces(spec, renderer):  # noqa: F811
    """The joined state hands on every piece's rows as outputs of one node, the pieces'
    row ranges in order, and its backward drives each piece once, then lets them go."""
    batch = renderer.encode_batch(BATCHES["mixed"])
    trainer = _trainer(spec)
    feats = trainer.vision_encode(Pixels.of(batch))
    state = _prefix(trainer, batch, feats, batch.size)
    pieces = pieces_of(state)
    assert pieces is not None
    assert [p.rows for p in pieces.pieces] == micro_ranges(batch.size, batch.size)
    nodes = {t.grad_fn for pair in cache_kv(state.cache) for t in pair}
    assert len(nodes) == 1 and type(next(iter(nodes))).__name__ == "_JoinedBackward"
    for k, v in cache_kv(state.cache):
        assert k.shape[0] == v.shape[0] == batch.size
    assert state.last_logits.grad_fn is not None  # the head, run once on the joined rows
    pieces.backward([None] * (2 * len(cache_kv(state.cache)) + 1))  # no gradient: no call
    assert pieces.pieces == []  # the graphs are let go
