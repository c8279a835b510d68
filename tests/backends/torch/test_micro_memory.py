"""Memory of training in micro-batches, counted as the bytes of every storage the trainer's
ops make that is still alive (a dispatch mode that follows each output tensor's life):

- the forward keeps only what its backward needs: checkpointed layer inputs, a fraction
  of what one plain forward with grad keeps;
- the backward holds one micro-batch's recomputed activations at a time: the bytes it adds
  beyond the gradients fall as 1/N with N micro-batches, for the prefix-shared and the
  per-sample forward.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rollplex.backends.torch.logprob import response_logprobs
from rollplex.backends.torch.loss import group_advantages
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import features_of
from rollplex.backends.torch.task import QUESTIONS, VisualTask
from rollplex.backends.torch.tokenizer import encode_prompt
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Pixels, Responses, TokenLogprobs
from rollplex.data.prompts import collate_prompts
from rollplex.engine.prefix import expand_prefix, prefix_forward
from rollplex.specs import AlgoSpec

P, G, R = 4, 4, 48  # responses long enough that activations dwarf the gradients


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages that ops inside the mode made and that are still alive (a
    storage dies with the last tensor that holds it), and the peak since `reset_peak`."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, list[int]] = {}  # storage address -> [bytes, live tensors]
        self.now = self.peak = 0

    def reset_peak(self) -> None:
        self.peak = self.now

    def _drop(self, key: int) -> None:
        entry = self.refs[key]
        entry[1] -= 1
        if not entry[1]:
            self.now -= entry[0]
            del self.refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or not t.untyped_storage().data_ptr():
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            entry = self.refs.setdefault(key, [storage.nbytes(), 0])
            if not entry[1]:
                self.now += entry[0]
                self.peak = max(self.peak, self.now)
            entry[1] += 1
            weakref.finalize(t, self._drop, key)
        return out


@pytest.fixture(scope="module")
def step(tokenizer, processor, spec):
    samples = VisualTask(seed=3).samples(0, P)
    batch = collate_prompts(
        [encode_prompt(tokenizer, processor, s.image, QUESTIONS["count"]) for s in samples],
        pad_id=spec.special_tokens.pad_token_id,
    )
    gen = torch.Generator().manual_seed(0)
    n = P * G
    responses = Responses(
        torch.randint(7, spec.vocab_size, (n, R), generator=gen), torch.full((n,), R)
    )
    old = TokenLogprobs(torch.full((n, R), -4.0), torch.ones(n, R, dtype=torch.bool))
    return batch, responses, old, group_advantages(torch.rand(n, generator=gen), G)


def _train(spec, step, shared: bool, micro: int) -> tuple[int, int, int]:
    """(bytes the forward keeps, bytes the backward adds at its peak, gradient bytes)."""
    batch, responses, old, adv = step
    trainer = TorchTrainer(build_model(spec, seed=0), spec, AlgoSpec())
    trainer.micro_batches = micro
    feats, text = trainer.vision_encode(Pixels.of(batch)), batch.text_only()
    with LiveBytes() as mode:
        if shared:
            state, _ = trainer.logprob_prefix(feats, text)
            logprobs, _ = trainer.logprob_response(state, responses, G)
        else:
            logprobs, _ = trainer.logprob(feats.repeat(G), text.repeat(G), responses)
        kept = mode.now
        loss = trainer.loss(logprobs, old, adv, None)
        mode.reset_peak()
        start = mode.now
        trainer.backward(loss)
    assert loss.metrics["train_micro_batches"] == micro
    grads = sum(p.grad.numel() * p.grad.element_size() for p in trainer.params)
    return kept, mode.peak - start, grads


@pytest.mark.parametrize("shared", [True, False])
def test_backward_holds_one_micro_batch_at_a_time(spec, step, shared):
    _, whole, grads = _train(spec, step, shared, 1)
    activations = whole - grads
    assert activations > 4 * grads  # the measure sees activations, not only gradients
    for micro in (2, 4):
        _, extra, _ = _train(spec, step, shared, micro)
        assert extra - grads <= 1.1 * activations / micro, (micro, extra, whole)


def test_forward_keeps_only_what_backward_needs(spec, step):
    batch, responses, _, _ = step
    model = build_model(spec, seed=0)
    with torch.no_grad():
        feats = features_of(model, Pixels.of(batch))
    with LiveBytes() as mode:  # one plain forward with grad: every layer's activations
        state = prefix_forward(model, batch.text_only(), feats.values, grad=True)
        out = response_logprobs(model, expand_prefix(state, G), responses.tokens, responses.lengths)
        plain = mode.now
    assert out.requires_grad
    for micro in (1, 4):
        kept, _, _ = _train(spec, step, True, micro)
        assert kept < 0.3 * plain, (micro, kept, plain)
