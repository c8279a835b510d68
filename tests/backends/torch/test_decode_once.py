"""decode_once on the torch roles (backends/torch/decoded_response.py): the trainer's
response forward replaced by the decode's kept layer outputs gives the logprobs and every
gradient of the ordinary training forward + backward (GRPO's clipped loss, rows of unequal
length, 1 to 3 micro-batches in each micro-batch mode), alone and with prefill_once, in
fp32 on the tiny Qwen2.5-VL."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.base import BackendError
from rollplex.backends.torch.exported_prefix import prefill_exported
from rollplex.backends.torch.values import Responses, TokenLogprobs
from rollplex.engine.prefix import prefix_forward
from rollplex.engine.session import DecodeEngine
from tests.backends.torch.test_riders import G, _setup
from tests.backends.torch.test_video import renderer  # noqa: F401

R = 7
# fp32. The replay's forward values are the decode's, which round differently from the
# trainer's own response forward (fused q/k/v GEMM, attention over the engine's cache:
# test_engine_kept.py measures 6e-8 on the layer outputs); the backward recomputes each
# layer exactly as the checkpointed forward does. Measured: every gradient within 9.2e-7
# of its largest element.
TOL = {"atol": 1e-7, "rtol": 1e-6}


def _decode(trainer, batch, feats, keep: bool):
    """A decode of G responses per prompt, rows of unequal forced length (eos ignored)."""
    model = trainer.model
    with torch.no_grad():
        prefix = prefix_forward(model, batch.text_only(), feats.values, False)
    n = batch.size * G
    forced = [R - (3 * i) % R for i in range(n)]  # 7, 4, 1, 5, 2, ...: a 1-token row too
    gen = torch.Generator(model.device).manual_seed(11)
    engine = DecodeEngine(model, keep_workspace=True)
    session = engine.start(prefix, G, R, 1.0, 1.0, gen, -1, lengths=forced, keep_outputs=keep)
    session.advance()
    tokens, _, lengths = session.result()
    return Responses(tokens, lengths), session.kept() if keep else None


def _train(trainer, batch, feats, responses, kept=None, exported=None):
    """Prefix (separate, or attached from `exported`) -> response logprobs (forward, or
    attached from `kept`) -> GRPO's clipped loss -> backward: (logprobs, {param: grad})."""
    trainer.model.zero_grad(set_to_none=True)
    text = batch.text_only()
    if exported is None:
        state, _ = trainer.logprob_prefix(feats, text)
    else:
        state, _ = trainer.attach_exported(exported, feats)
    calls = []  # decoder-layer calls of the response forward (the replay calls none)
    hooks = [
        layer.register_forward_hook(lambda *_: calls.append(1))
        for layer in trainer.model.model.language_model.layers
    ]
    try:
        if kept is None:
            lp, _ = trainer.logprob_response(state, responses, G)
        else:
            lp, _ = trainer.attach_decoded(state, responses, G, kept)
    finally:
        for h in hooks:
            h.remove()
    adv = torch.linspace(-1.0, 1.0, responses.tokens.shape[0], device=lp.values.device)
    old = TokenLogprobs(lp.values.detach() - 0.05, lp.mask)  # ratios off 1: the clip acts
    loss = trainer.loss(lp, old, adv, None, 0.2, 0.0)
    trainer.backward(loss)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return lp.values.detach().clone(), float(loss.value), grads, len(calls)


def _assert_same(got, want):
    worst = max(float((got[2][n] - g).abs().max() / g.abs().max()) for n, g in want[2].items())
    print(f"decode once vs the response forward: worst gradient difference {worst:.1e} of max")
    assert got[3] == 0  # no response forward ran
    torch.testing.assert_close(got[0], want[0], **TOL)
    assert got[1] == pytest.approx(want[1], rel=1e-6, abs=1e-7)
    assert got[2].keys() == want[2].keys()
    assert any("layers.1.mlp" in n for n in want[2])  # the response's layers really trained
    for n, g in want[2].items():
        assert g.abs().max() > 0, n
        torch.testing.assert_close(got[2][n], g, **TOL, msg=n)


@pytest.mark.parametrize("kind", ["image", "mixed"])
@pytest.mark.parametrize("micro", [1, 2, 3])
@pytest.mark.parametrize("mode", ["kept", "recompute", "fused"])
def test_kept_decode_trains_as_the_response_forward(spec, renderer, kind, micro, mode):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, kind)
    if micro > batch.size:
        pytest.skip(f"{batch.size} prompts: at most {batch.size} micro-batches of whole groups")
    trainer.micro_batches = micro
    trainer.micro_recompute, trainer.micro_fused = mode == "recompute", mode == "fused"
    responses, kept = _decode(trainer, batch, feats, keep=True)
    assert len(set(responses.lengths.tolist())) > 2
    once, plain = (
        _train(trainer, batch, feats, responses, kept),
        _train(trainer, batch, feats, responses),
    )
    assert plain[3] > 0 or mode == "fused"  # fused: the forward runs inside the backward
    _assert_same(once, plain)


@pytest.mark.parametrize("kind", ["image", "mixed"])
def test_prefill_once_and_decode_once_train_as_both_forwards(spec, renderer, kind):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, kind)
    trainer.micro_batches = 2
    trainer.algo = trainer.algo.model_copy(update={"entropy_coeff": 0.01})  # entropy with grad
    text = batch.text_only()
    with torch.no_grad():
        _, exported = prefill_exported(trainer.model, feats.values, text, "policy@0")
    responses, kept = _decode(trainer, batch, feats, keep=True)
    both = _train(trainer, batch, feats, responses, kept, exported)
    _assert_same(both, _train(trainer, batch, feats, responses))


def test_a_stale_or_foreign_decode_is_refused(spec, renderer):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, "image")
    responses, kept = _decode(trainer, batch, feats, keep=True)
    state, _ = trainer.logprob_prefix(feats, batch.text_only())
    short = Responses(responses.tokens[:G], responses.lengths[:G])
    with pytest.raises(BackendError, match="kept 4 rows for 2 responses"):
        trainer.attach_decoded(state, short, G, kept)
    kept.release()
    with pytest.raises(BackendError, match="already released"):
        trainer.attach_decoded(state, responses, G, kept)
