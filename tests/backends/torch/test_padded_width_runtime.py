"""The widths the planner prices scoring ops at (ops/response_width.py) are the widths the
torch backend runs, on a tiny model with known response lengths: the trainer's forward in
each micro-batch (prefix-shared groups or per-sample rows, kept or recomputed) runs up to
the longest response of the rows the pricing puts together; the no-grad response parts
(reference, old-policy scorer, critic) run the step's longest response, not the cap; verl's
no-grad full forward runs its prefix and its rows' longest response through the decoder, and
its head to the longest response. The pricing's expected longest is replaced by the actual
longest of those rows here. Inside those calls the layers run packed rows by default
(schedule.pack_responses; test_packed_rows.py): priced at each row's own tokens."""

from __future__ import annotations

import pytest
import torch

import rollplex.backends.torch.critic as critic_module
import rollplex.backends.torch.full_forward as full_forward_module
import rollplex.backends.torch.roles as roles_module
import rollplex.backends.torch.trainer as trainer_module
from rollplex.backends.torch.critic import TorchCritic, build_critic_model
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import TorchReference
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Pixels, Responses
from rollplex.ops import response_width as W
from rollplex.specs import AlgoSpec
from rollplex.specs.workload import ResponseLengthSpec

G, CAP = 3, 9
# two prompts' groups of three: the longest row of each group differs, and neither reaches
# the cap, so a forward that ran the padded width would show
LENGTHS = [2, 5, 1, 3, 3, 7]


def _responses(spec) -> Responses:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(7, spec.vocab_size, (len(LENGTHS), CAP), generator=gen)
    lengths = torch.tensor(LENGTHS)
    tokens[torch.arange(CAP)[None, :] >= lengths[:, None]] = spec.special_tokens.pad_token_id
    return Responses(tokens, lengths)


def _priced_widths(count: int, units: int, rows_per_unit: int) -> list[int]:
    """The pricing's rows together (its micro-batches), each at its actual longest row."""
    out, lo = [], 0
    for rows in W.micro_batch_rows(units, count, rows_per_unit):
        out.append(max(LENGTHS[lo : lo + rows]))
        lo += rows
    assert lo == len(LENGTHS)
    return out


def _recording(monkeypatch, module, name: str, arg: int, widths: list[int]):
    """Wrap `module.name` to record the column count of its positional argument `arg`."""
    inner = getattr(module, name)

    def wrapped(*args, **kwargs):
        widths.append(int(args[arg].shape[1]))
        return inner(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("micro", [1, 2, 3])
@pytest.mark.parametrize("shared", [True, False], ids=["prefix_shared", "per_sample"])
def test_trainer_runs_each_micro_batch_to_its_priced_width(
    spec, batch, monkeypatch, shared, micro, recompute
):
    trainer = TorchTrainer(build_model(spec, seed=0), spec, AlgoSpec())
    trainer.micro_batches, trainer.micro_recompute = micro, recompute
    responses, text = _responses(spec), batch.text_only()
    feats = trainer.vision_encode(Pixels.of(batch))
    widths: list[int] = []
    if shared:  # response_logprobs(model, state, tokens, ...)
        _recording(monkeypatch, trainer_module, "response_logprobs", 2, widths)
        state, _ = trainer.logprob_prefix(feats, text)
        trainer.logprob_response(state, responses, G)
        units, per_unit = batch.size, G
    else:  # features_full_logprobs(model, text, visual, tokens, ...)
        _recording(monkeypatch, trainer_module, "features_full_logprobs", 3, widths)
        trainer.logprob(feats.repeat(G), text.repeat(G), responses)
        units, per_unit = len(LENGTHS), 1
    assert widths == _priced_widths(micro, units, per_unit)
    assert max(widths) < CAP  # it trimmed: nothing ran the padding past every row's end


@pytest.mark.parametrize("role", ["reference", "old_policy", "critic"])
def test_no_grad_response_part_runs_the_steps_longest(spec, batch, monkeypatch, role):
    """Priced at `longest_width` of the step's rows (their actual longest here), and the
    runtime runs that many columns, not the cap."""
    model = build_model(spec, seed=0)
    if role == "critic":
        scorer = TorchCritic(build_critic_model(model, spec, seed=0), spec, AlgoSpec()).scorer
        module, name = critic_module, "response_head_outputs"
    else:
        trainer = TorchTrainer(model, spec, AlgoSpec())
        scorer = TorchReference(model) if role == "reference" else trainer.scorer()
        module, name = roles_module, "response_logprobs"
    widths: list[int] = []
    _recording(monkeypatch, module, name, 2, widths)  # (model, state, tokens, ...)
    state = scorer.logprob_prefix(scorer.vision_encode(Pixels.of(batch)), batch.text_only())
    with torch.no_grad():
        scorer.logprob_response(state, _responses(spec), G)
    fixed = ResponseLengthSpec(distribution="fixed", mean=max(LENGTHS), max=CAP)
    assert widths == [W.longest_width(fixed, len(LENGTHS))] == [max(LENGTHS)]
    assert widths[0] < CAP


@pytest.mark.parametrize("packed", [False, True])
def test_reference_full_forward_runs_prefix_and_its_rows_longest(spec, batch, monkeypatch, packed):
    """Through the decoder: prefix + response per row, padded to the longest such row, which
    is at most the longest prefix + the longest response (the pricing's, prefixes equal);
    packed (schedule.pack_responses), one sequence of the rows' real tokens only."""
    ref = TorchReference(build_model(spec, seed=0))
    ref.packed_responses = packed
    widths: list[int] = []
    _recording(monkeypatch, full_forward_module, "lm_hidden", 1, widths)  # (model, embeds, ...)
    feats = ref.vision_encode(Pixels.of(batch))
    text = batch.text_only()
    ref.logprob(feats.repeat(G), text.repeat(G), _responses(spec))
    prefixes = batch.lengths.repeat_interleave(G)
    totals = prefixes + torch.tensor(LENGTHS)
    if packed:
        assert widths == [int(totals.sum())]
        return
    assert widths == [int(totals.max())]
    assert widths[0] <= int(prefixes.max()) + max(LENGTHS)
    assert widths[0] - int(prefixes.max()) < CAP


def test_reference_full_forward_head_runs_its_rows_longest(spec, batch, monkeypatch):
    """Its LM head (the part the pricing leaves out) runs the longest response, not the cap."""
    ref = TorchReference(build_model(spec, seed=0))
    widths: list[int] = []
    _recording(monkeypatch, roles_module, "features_full_logprobs", 3, widths)
    feats = ref.vision_encode(Pixels.of(batch))
    ref.logprob(feats.repeat(G), batch.text_only().repeat(G), _responses(spec))
    assert widths == [max(LENGTHS)]
