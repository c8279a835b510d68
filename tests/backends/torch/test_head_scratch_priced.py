"""The planner's price of the LM head's scratch (ops/formulas/head.py) bounds what the torch
head holds at its peak, and not by much: scoring without grad, the forward with grad and
its backward, fused and unfused, with and without the entropy's gradient, at sizes below
a chunk and several chunks over it (the price caps at the chunk, as the runtime does)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from cpu_memory import cpu_peak_bytes

from rollplex.backends.torch import logprob
from rollplex.backends.torch.logprob import ENTROPY_GRAD, ENTROPY_METRIC, head_logprobs
from rollplex.ops.formulas import head as head_price
from rollplex.ops.formulas.head import head_scratch

VOCAB, WIDTH, CHUNK_TOKENS = 4096, 64, 64
CHUNK = CHUNK_TOKENS * VOCAB * 4  # float32 logits of one chunk


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 64 tokens at a 4k vocab, in the runtime and in the price alike."""
    monkeypatch.setattr(logprob, "HEAD_CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(head_price, "HEAD_CHUNK_BYTES", CHUNK)
    return monkeypatch


def _inputs(tokens_n: int, grad: bool):
    torch.manual_seed(0)
    head = torch.nn.Linear(WIDTH, VOCAB, bias=False).to(torch.bfloat16)
    hidden = torch.randn(1, tokens_n, WIDTH, dtype=torch.bfloat16, requires_grad=grad)
    return head, hidden, torch.randint(0, VOCAB, (1, tokens_n))


def _measured(head_pass: str, tokens_n: int, entropy: str | None) -> int:
    """The torch head's peak bytes in `head_pass`, less its outputs and gradients."""
    grad = head_pass != "score"
    head, hidden, tokens = _inputs(tokens_n, grad)
    if head_pass == "score":
        with torch.no_grad():
            return cpu_peak_bytes(lambda: head_logprobs(head, hidden, tokens, 1.0))
    outputs = tokens_n * 4 * (2 if entropy else 1)  # float32 logprobs (and entropy)
    if head_pass == "forward":
        return cpu_peak_bytes(lambda: head_logprobs(head, hidden, tokens, 1.0, entropy)) - outputs
    out = head_logprobs(head, hidden, tokens, 1.0, entropy)
    loss = out[0].sum() + out[1].sum() if entropy else out.sum()
    grads = (hidden.numel() + head.weight.numel()) * 2
    return cpu_peak_bytes(loss.backward) - grads


@pytest.mark.parametrize("tokens_n", [48, 64, 256])  # under a chunk, one, four
@pytest.mark.parametrize(
    ("head_pass", "fused", "entropy"),
    [
        ("score", True, None),
        ("forward", True, ENTROPY_METRIC),
        ("forward", True, ENTROPY_GRAD),
        ("forward", False, ENTROPY_METRIC),
        ("backward", True, None),
        ("backward", True, ENTROPY_GRAD),
        ("backward", False, None),
        ("backward", False, ENTROPY_GRAD),
    ],
)
def test_the_price_bounds_the_runtime_peak(small_chunks, head_pass, fused, entropy, tokens_n):
    if not fused:
        small_chunks.setattr(logprob, "fusable", lambda _: False)
    measured = _measured(head_pass, tokens_n, entropy)
    priced = head_scratch(
        tokens_n * VOCAB * 4, head_pass, fused=fused, entropy_grad=entropy == ENTROPY_GRAD
    )
    assert measured <= priced * 1.02, (measured / CHUNK, priced / CHUNK)
    assert measured >= priced * 0.75, (measured / CHUNK, priced / CHUNK)


def test_a_run_caps_at_whole_chunks_of_its_own_rows():
    """A run (micro-batch) of a quarter of the rows holds at most the chunks of its own
    logits: the op's price, which the planner scales by the run's share, caps at 4 chunks."""
    chunk = head_price.HEAD_CHUNK_BYTES
    whole = head_scratch(100 * chunk, "backward", run_share=0.25)
    assert whole * 0.25 == pytest.approx(1.5 * chunk)
    small = head_scratch(0.5 * chunk, "backward", run_share=0.25)
    assert small * 0.25 == pytest.approx(1.5 * 0.5 * chunk * 0.25)
    assert head_scratch(3 * chunk, "sample") == 3 * chunk  # the rollout's sampled rows: whole
    with pytest.raises(ValueError, match="run_share"):
        head_scratch(chunk, "score", run_share=0.0)
