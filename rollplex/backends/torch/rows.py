"""Row chunks of prefix work and the host/device moves of backend values.

A plan cuts prefix ops into chunks of prompt rows (`row_ranges`); each chunk runs on the
rows it selects, and the last merges all chunks' outputs back in row order; an op run in
micro-batches (`Plan.meta["op_micro_batches"]`) is cut and merged alike. Prompt text is
a PromptBatch whose pixels are empty (the pixels travel as their own value).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import torch
from torch import nn

from rollplex.backends.base import BackendError, ValueOps
from rollplex.backends.torch.activations import Boundary, SavedActivations
from rollplex.backends.torch.exported_prefix import ExportedPrefix
from rollplex.backends.torch.host_memory import move
from rollplex.backends.torch.kv_rows import KVRows, LayerKV
from rollplex.backends.torch.prefix_pieces import join_pieces, pieces_of
from rollplex.backends.torch.values import Features, Pixels, Responses, TokenLogprobs
from rollplex.data.prompts import PromptBatch
from rollplex.data.sample import Sample
from rollplex.engine.prefix import PrefixState, cache_kv, fork_cache


def row_ranges(rows: int, chunks: int) -> list[tuple[int, int]]:
    """`chunks` contiguous, near-equal row ranges (sizes differ by at most one)."""
    if not 1 <= chunks <= rows:
        raise BackendError(f"cannot cut {rows} rows into {chunks} chunks")
    return [(rows * i // chunks, rows * (i + 1) // chunks) for i in range(chunks)]


# Prompt text is a PromptBatch whose pixels are empty: the pixels travel separately.
def text_rows(batch: PromptBatch, lo: int, hi: int) -> PromptBatch:
    return batch.select(lo, hi)


def text_repeat(batch: PromptBatch, g: int) -> PromptBatch:
    return batch.repeat(g)


def text_only(batch: PromptBatch) -> PromptBatch:
    return batch.text_only()


def merge_prefix(parts: Sequence[PrefixState], head: nn.Module | None = None) -> PrefixState:
    """Row chunks of one prefix forward, concatenated back (differentiably) in row order.
    Chunks that deferred the LM head get it here, on all rows at once: the logits are then
    computed exactly as for the unchunked batch (a head run per chunk, on fewer rows, may
    round differently on CPU, and Adam turns such noise into whole steps when the true
    gradient is ~0, e.g. the KL term at step 0). A training prefix's parts (`as_pieces`)
    are joined by `join_pieces` instead (prefix_pieces.py)."""
    if pieces_of(parts[0]) is not None:
        return join_pieces(parts, head)
    layers = list(zip(*(cache_kv(p.cache) for p in parts), strict=True))
    kv = [(torch.cat([k for k, _ in lay]), torch.cat([v for _, v in lay])) for lay in layers]

    def cat(name: str) -> torch.Tensor:
        return torch.cat([getattr(p, name) for p in parts])

    if all(p.last_logits is not None for p in parts):
        logits = cat("last_logits")
    elif head is not None and all(p.last_hidden is not None for p in parts):
        logits = head(cat("last_hidden"))
    else:
        raise BackendError("merging prefix chunks without logits needs the LM head")
    return PrefixState(
        cache=fork_cache(kv),
        last_logits=logits,
        attention_mask=cat("attention_mask"),
        next_positions=cat("next_positions"),
        rope_deltas=cat("rope_deltas"),
        lengths=cat("lengths"),
        group_size=parts[0].group_size,
    )


def prefix_rows(state: PrefixState, lo: int, hi: int, boundary: Boundary) -> PrefixState:
    """Prompt rows [lo, hi) of a prefix, its K/V (uncopied: `KVRows`) and last logits as
    leaves of `boundary`; one row per prompt, as response_logprobs takes it."""
    if state.last_logits is None:
        raise ValueError("a training prefix needs last_logits (the LM head was deferred)")
    kv = [
        LayerKV(boundary.cut(k, lo, hi), boundary.cut(v, lo, hi)) for k, v in cache_kv(state.cache)
    ]
    return PrefixState(
        cache=KVRows(kv),  # type: ignore[arg-type]  # read through cache_kv only
        last_logits=boundary.cut(state.last_logits, lo, hi),
        attention_mask=state.attention_mask[lo:hi],
        next_positions=state.next_positions[lo:hi],
        rope_deltas=state.rope_deltas[lo:hi],
        lengths=state.lengths[lo:hi],
        group_size=state.group_size,
    )


def row_count(inputs: dict[str, Any]) -> int:
    for port in ("pixels", "features"):
        if port in inputs:
            return inputs[port].rows
    raise BackendError(f"no row input among {sorted(inputs)}")


def select_rows(value: Any, lo: int, hi: int) -> Any:
    if isinstance(value, Pixels | Features):
        return value.select(lo, hi)
    if isinstance(value, PromptBatch):
        return text_rows(value, lo, hi)
    if isinstance(value, Responses):  # a PPO mini-batch's samples (select_rows)
        return Responses(value.tokens[lo:hi], value.lengths[lo:hi])
    if isinstance(value, TokenLogprobs):
        return TokenLogprobs(value.values[lo:hi], value.mask[lo:hi])
    if isinstance(value, PrefixState):  # prompt rows of a scored prefix, K/V uncopied
        return prefix_rows(value, lo, hi, Boundary())
    if isinstance(value, torch.Tensor):
        return value[lo:hi]
    return value  # weights


def merge_chunks(parts: list[dict[str, Any]], head: torch.nn.Module) -> dict[str, Any]:
    out = {}
    for port in parts[0]:
        vals = [p[port] for p in parts]
        first = vals[0]
        if isinstance(first, Features):
            out[port] = Features.merge(vals)
        elif isinstance(first, SavedActivations):
            out[port] = SavedActivations.merge(vals)
        elif isinstance(first, TokenLogprobs):  # a scorer's row ranges, each full width
            out[port] = TokenLogprobs(
                torch.cat([v.values for v in vals]), torch.cat([v.mask for v in vals])
            )
        else:
            with torch.set_grad_enabled(any(v.last_hidden.requires_grad for v in vals)):
                out[port] = merge_prefix(vals, head)
    return out


def repeat_rows(value: Any, g: int) -> Any:
    if isinstance(value, Pixels | Features):
        return value.repeat(g)
    if isinstance(value, PromptBatch):
        return text_repeat(value, g)
    if isinstance(value, torch.Tensor):
        return value.repeat_interleave(g, dim=0)
    raise BackendError(f"expand_group cannot repeat a {type(value).__name__}")


def move_value(value: Any, device: torch.device) -> Any:
    """A copy of `value` on `device` (in-place holders move their own tensors)."""
    if isinstance(value, torch.Tensor):  # moved once (a boundary): torch's pinned allocator
        return move(value, device)
    if hasattr(value, "move_to"):
        return value.move_to(device)
    if isinstance(value, Pixels):
        return Pixels(
            move_value(value.values, device), move_value(value.grid, device), list(value.counts)
        )
    if isinstance(value, Features):
        return Features(move_value(value.values, device), list(value.tokens))
    if isinstance(value, PromptBatch):
        return PromptBatch(
            **{f.name: move_value(getattr(value, f.name), device) for f in fields(value)}
        )
    if isinstance(value, PrefixState):
        # .to() is differentiable: a prefix kept for backward stays in its autograd graph.
        kv = [(move_value(k, device), move_value(v, device)) for k, v in cache_kv(value.cache)]
        return PrefixState(
            fork_cache(kv),
            *(move_value(getattr(value, n), device) for n in _PREFIX_FIELDS),
            group_size=value.group_size,
        )
    if isinstance(value, ExportedPrefix):
        return value.moved(lambda x: move_value(x, device))
    if isinstance(value, tuple | list) and all(isinstance(x, Sample) for x in value):
        return value  # answers as text: host data the reward reads where it is
    raise BackendError(f"cannot move a {type(value).__name__} between host and device")


_PREFIX_FIELDS = ("last_logits", "attention_mask", "next_positions", "rope_deltas", "lengths")


class TorchValues(ValueOps):
    """The runtime's handle on the torch value types (values.py, activations.py, handles.py,
    PromptBatch, PrefixState)."""

    def rows(self, inputs: dict[str, Any]) -> int:
        return row_count(inputs)

    def select(self, value: Any, lo: int, hi: int) -> Any:
        return select_rows(value, lo, hi)

    def row_count(self, value: Any) -> int:
        if isinstance(value, Pixels | Features):
            return value.rows
        if isinstance(value, PromptBatch):
            return value.input_ids.shape[0]
        if isinstance(value, Responses):
            return value.tokens.shape[0]
        if isinstance(value, TokenLogprobs):
            return value.values.shape[0]
        if isinstance(value, PrefixState):
            return value.rows
        if isinstance(value, torch.Tensor):
            return value.shape[0]
        raise BackendError(f"cannot count the rows of a {type(value).__name__}")

    def repeat(self, value: Any, group_size: int) -> Any:
        return repeat_rows(value, group_size)

    def move(self, value: Any, device: Any, share: float = 1.0) -> Any:
        if value is None:  # an output the role did not produce (e.g. engine logprobs)
            return None
        if share < 1:  # optimizer state, moved in part (OptimizerHandle.move_to)
            if not getattr(type(value), "MOVES_IN_PART", False):
                raise BackendError(f"a {type(value).__name__} moves whole, not {share:.0%} of it")
            return value.move_to(torch.device(device), share)
        return move_value(value, torch.device(device))
