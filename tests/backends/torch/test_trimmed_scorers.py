"""The no-grad response scorers (the reference, the old-policy scorer, the critic's old
values; prefix-shared and per-sample) run to their rows' longest response, not the cap
(trim.py), and give what the whole padded width gives: equal on every real position (fp32,
1e-6), zero past each row's end. The critic's training forward, trimmed per micro-batch,
gives its scorer's values. On a grid of lengths: all equal, one long row, all at the cap,
a single row."""

from __future__ import annotations

import pytest
import torch

import rollplex.backends.torch.critic as critic_module
from rollplex.backends.torch.critic import TorchCritic, build_critic_model
from rollplex.backends.torch.full_forward import features_full_head_outputs, features_full_logprobs
from rollplex.backends.torch.logprob import response_head_outputs, response_logprobs, response_mask
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import TorchReference
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Pixels, Responses
from rollplex.specs import AlgoSpec

CAP, T = 8, 0.7
# (prompts, G, lengths): none of the first two reaches the cap
CASES = {
    "all_equal": (2, 3, [4, 4, 4, 4, 4, 4]),
    "one_long": (2, 3, [1, 2, 1, 1, 7, 2]),
    "all_at_cap": (2, 3, [CAP] * 6),
    "single_row": (1, 1, [5]),
}
PATHS = ["reference_shared", "reference_full", "old_policy_shared", "critic_shared", "critic_full"]


def _responses(spec, lengths: list[int]) -> Responses:
    gen = torch.Generator().manual_seed(3)
    raw = torch.randint(7, spec.vocab_size, (len(lengths), CAP), generator=gen)
    lens = torch.tensor(lengths)
    pad = spec.special_tokens.pad_token_id
    return Responses(torch.where(response_mask(lens, CAP), raw, pad), lens)


def _scorer(path: str, spec):
    model = build_model(spec, seed=0)
    if path.startswith("reference"):
        return TorchReference(model, T)
    if path.startswith("old_policy"):
        return TorchTrainer(model, spec, AlgoSpec(temperature=T)).scorer()
    critic = TorchCritic(build_critic_model(model, spec, seed=0), spec, AlgoSpec(name="ppo"))
    return critic.scorer


def _padded_width(path: str, model, state, feats, text, r: Responses, g: int) -> torch.Tensor:
    """What the scorer gave before trimming: its forward over the whole padded width."""
    tokens, lengths = r.tokens, r.lengths
    if path == "critic_shared":
        out = critic_module._values(*response_head_outputs(model, state, tokens, lengths, g))
    elif path == "critic_full":
        out = features_full_head_outputs(model, text, feats.values, tokens, lengths)
        out = out.squeeze(-1).float()
    elif path.endswith("shared"):
        out = response_logprobs(model, state, tokens, lengths, T, g)
    else:
        out = features_full_logprobs(model, text, feats.values, tokens, lengths, T)
    return torch.where(response_mask(lengths, tokens.shape[1]), out, 0.0)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("path", PATHS)
def test_trimmed_scorer_equals_the_padded_width(spec, batch, path, case):
    prompts, g, lengths = CASES[case]
    sel = batch.select(0, prompts)
    scorer, r = _scorer(path, spec), _responses(spec, lengths)
    with torch.no_grad():
        feats = scorer.vision_encode(Pixels.of(sel))
        state = text = None
        if path.endswith("shared"):
            state = scorer.logprob_prefix(feats, sel.text_only())
            got = scorer.logprob_response(state, r, g)
        else:
            feats, text = feats.repeat(g), sel.text_only().repeat(g)
            got = scorer.logprob(feats, text, r)
        want = _padded_width(path, scorer.model, state, feats, text, r, g)
    valid = response_mask(r.lengths, CAP)
    assert got.values.shape == (len(lengths), CAP) and torch.equal(got.mask, valid)
    assert got.values[valid].abs().min() > 0  # real positions were scored
    torch.testing.assert_close(got.values[valid], want[valid], atol=1e-6, rtol=0)
    assert torch.equal(got.values[~valid], want[~valid])  # both exactly 0 past each end
    assert (got.values[~valid] == 0).all()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("shared", [True, False], ids=["prefix_shared", "per_sample"])
def test_critic_training_micro_batches_give_its_scorer_values(spec, batch, shared, case):
    """Two micro-batches, each trimmed to its own rows' longest (one_long's first group
    ends at 2 of 8 columns): the values with grad are the no-grad scorer's."""
    prompts, g, lengths = CASES[case]
    sel = batch.select(0, prompts)
    model = build_model(spec, seed=0)
    critic = TorchCritic(build_critic_model(model, spec, seed=0), spec, AlgoSpec(name="ppo"))
    critic.micro_batches = 2
    r = _responses(spec, lengths)
    feats = critic.trainer.vision_encode(Pixels.of(sel))
    if shared:
        state, _ = critic.trainer.logprob_prefix(feats, sel.text_only())
        trained, _ = critic.trainer.logprob_response(state, r, g)
        with torch.no_grad():
            scored = critic.scorer.logprob_response(state, r, g)
    else:
        feats, text = feats.repeat(g), sel.text_only().repeat(g)
        trained, _ = critic.trainer.logprob(feats, text, r)
        with torch.no_grad():
            scored = critic.scorer.logprob(feats, text, r)
    assert torch.equal(trained.mask, scored.mask)
    torch.testing.assert_close(trained.values, scored.values, atol=1e-6, rtol=0)
