"""Scoring responses up to their rows' longest: the one helper every response scorer (the
trainer's micro-batches, the reference, the old-policy scorer, the critic) runs through, so
none pays for the padded columns past every row's end (ops/response_width.py prices it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rollplex.backends.torch.activations import Scored


def trimmed(
    score: Callable[[torch.Tensor], Scored], tokens: torch.Tensor, lengths: torch.Tensor
) -> Scored:
    """`score(tokens)` [rows, R] run on the columns up to these rows' longest response only,
    zeros after: the columns past every row's end are padding whose outputs nothing reads
    (the response mask is 0 there), and a forward over rows that all end early (a
    micro-batch without the step's longest row, or a step whose rows all end before the
    cap) would otherwise run, and with grad keep for backward, all `max_new_tokens`
    columns. A (logprobs, entropy) pair is padded each."""
    width, used = tokens.shape[1], max(1, int(lengths.max()))
    if used >= width:
        return score(tokens)
    out = score(tokens[:, :used])
    if isinstance(out, tuple):
        logprobs, entropy = out
        return _pad(logprobs, width - used), _pad(entropy, width - used)
    return _pad(out, width - used)


def _pad(x: torch.Tensor, columns: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, columns))
