"""Tensor-parallel rollout over data-parallel ranks: the ranks of one TP group must run the
same rows, but each rank's step holds its own slice of the prompts.

Before each LLM call a TP group gathers its inputs (prompts, vision features, generator
states) in TP-rank order, runs the union in lockstep (every collective sees the same shapes)
and hands each rank back its own rows.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from rollplex.backends.base import BackendError
from rollplex.backends.torch.decode import DecodeSession as TorchDecodeSession
from rollplex.backends.torch.roles import TorchDecode
from rollplex.backends.torch.values import Features, Responses, TokenLogprobs
from rollplex.engine.sampling import counter_uniform, draw, row_seeds


def gather_cat(t: torch.Tensor, group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
    """Concatenation along dim 0 of every group member's `t`. Shapes may differ: dim 0
    is cut back to each member's rows; other dims are zero-padded to the largest (padded
    prompt positions carry attention mask 0, so their content is never read)."""
    k = dist.get_world_size(group)
    x = t.to(device)
    if x.dtype == torch.bool:  # gloo has no bool collectives
        return gather_cat(x.to(torch.uint8), group, device).bool()
    shape = torch.tensor(list(x.shape), device=device)
    shapes = [torch.zeros_like(shape) for _ in range(k)]
    dist.all_gather(shapes, shape, group=group)
    top = torch.stack(shapes).amax(0).tolist()
    padded = x.new_zeros(top)
    padded[tuple(slice(0, n) for n in x.shape)] = x
    outs = [torch.empty_like(padded) for _ in range(k)]
    dist.all_gather(outs, padded.contiguous(), group=group)
    return torch.cat([o[: int(s[0])] for o, s in zip(outs, shapes, strict=True)]).to(t.device)


def gather_rows(value: Any, group: dist.ProcessGroup, device: torch.device) -> Any:
    """A prompt batch (every field is stacked along dim 0) or Features, unioned over the
    group in member order."""
    if isinstance(value, Features):
        values = gather_cat(value.values, group, device)
        tokens = gather_cat(torch.tensor(value.tokens, dtype=torch.long), group, device)
        return Features(values, [int(t) for t in tokens])
    if is_dataclass(value):
        return replace(
            value, **{f.name: gather_cat(getattr(value, f.name), group, device)
                      for f in fields(value)}
        )  # fmt: skip
    raise BackendError(f"the TP rollout cannot gather a {type(value).__name__} over its group")


def gather_generators(
    generator: Any, group: dist.ProcessGroup, device: torch.device, temperature: float
) -> Any:
    """The generators every member decodes the union with, the same on all of them:
    per-sample generators of the whole group (their states travel, each stream goes on
    from where its rank's would); one shared generator is set to member 0's state. The
    global RNG (None) differs per rank, so sampling from it is refused."""
    if temperature == 0:
        return generator  # greedy draws nothing
    if generator is None:
        raise BackendError(
            "the TP rollout samples (temperature > 0) but got no generator: its ranks would "
            "draw different tokens for the same rows; pass per-sample generators or a seed"
        )
    single = isinstance(generator, torch.Generator)
    gens = [generator] if single else list(generator)
    if not gens:
        raise BackendError("the TP rollout got an empty generator list")
    states = gather_cat(torch.stack([g.get_state() for g in gens]), group, device).cpu()
    if single:  # everyone continues member 0's stream
        generator.set_state(states[0].clone())
        return generator
    out = []
    for s in states:
        g = torch.Generator(gens[0].device)
        g.set_state(s.clone())  # a fresh ByteTensor: a row view of the stack crashes it
        out.append(g)
    return out


def member_rows(
    union: int, mine: int | None, group: dist.ProcessGroup, device: torch.device
) -> tuple[int, int]:
    """This member's rows [lo, hi) of a union of `union` rows. `mine`: its own count (the
    length of its per-sample generator list); None: the rows split evenly."""
    k, me = dist.get_world_size(group), dist.get_rank(group)
    if mine is None:
        if union % k:
            raise BackendError(f"the TP rollout cannot split {union} rows over {k} ranks")
        return me * (union // k), (me + 1) * (union // k)
    counts = gather_cat(torch.tensor([mine], device=device), group, device).tolist()
    return sum(counts[:me]), sum(counts[: me + 1])


class GroupDecodeSession(TorchDecodeSession):
    """decode.py's eager loop (transformers' own cache, which follows the TP plan's local
    heads; the engine's static cache is sized from the config's full heads) drawing each
    token as the decode engine does: uniform = hash(row seed, step), one seed per row
    from its generator (engine/sampling.py). So a TP group samples the very tokens the
    torch rollout's engine samples for the same rows and logits."""

    def __init__(self, model, state, max_new_tokens, temperature, top_p, generator, eos_id,
                 pad_id) -> None:  # fmt: skip
        super().__init__(model, state, max_new_tokens, temperature, top_p, None, eos_id, pad_id)
        rows, dev = state.rows, state.lengths.device
        zero = torch.zeros(rows, dtype=torch.long, device=dev)
        self.seeds = row_seeds(generator, rows, dev) if temperature > 0 else zero

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        return draw(self.logits, counter_uniform(self.seeds, self.t), self.temperature, self.top_p)


class MemberDecode(TorchDecode):
    """A decode session over the group's union of rows; `result` is this member's rows."""

    def __init__(self, session: Any, lo: int, hi: int) -> None:
        super().__init__(session)
        self.lo, self.hi = lo, hi

    def result(self) -> tuple[Responses, TokenLogprobs]:
        responses, logprobs = super().result()
        lo, hi = self.lo, self.hi
        mine = Responses(responses.tokens[lo:hi], responses.lengths[lo:hi])
        return mine, TokenLogprobs(logprobs.values[lo:hi], logprobs.mask[lo:hi])
