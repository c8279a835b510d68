"""Sampling on the device as a pure function of (row seed, step, logits): no generator state
advances inside a step, so it can be captured in a CUDA graph, and a row's draw never
depends on which other rows (or padding rows) share its batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

SEED_BITS = 62
_M32 = 0xFFFFFFFF


def row_seeds(
    generator: torch.Generator | Sequence[torch.Generator] | None,
    rows: int,
    device: torch.device,
) -> torch.Tensor:
    """[rows] int64 seeds: one draw per row from `generator`, or one from each of a
    sequence of per-row generators (data-parallel ranks); the global RNG when None
    (unseeded, as before). So a row's tokens are a function of (run seed, RL step, row);
    its uniform at step t is a counter-based hash of (seed, t) (`counter_uniform`)."""
    high = 1 << SEED_BITS
    if isinstance(generator, list | tuple):
        if len(generator) != rows:
            raise ValueError(f"{len(generator)} row generators for {rows} rows")
        parts = [torch.randint(0, high, (1,), generator=g, device=g.device) for g in generator]
        seeds = torch.cat([p.to(device) for p in parts]) if parts else torch.zeros(0)
    elif generator is None:
        seeds = torch.randint(0, high, (rows,))
    else:
        seeds = torch.randint(0, high, (rows,), generator=generator, device=generator.device)
    return seeds.to(device=device, dtype=torch.long)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # lowbias32 (C. Wellons) on uint32 values held in int64: an int64 product may wrap,
    # and its low 32 bits are still the uint32 product's.
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, step: torch.Tensor | int) -> torch.Tensor:
    """[N] fp32 uniforms in [0, 1) (24 random bits) for `seeds` [N] at decode `step` (an int
    or a device tensor, so a captured graph reads the step it is replayed at)."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    h = _mix32((torch.as_tensor(step, device=seeds.device) * 0x9E3779B9 + 1) & _M32)
    h = _mix32(_mix32(h ^ hi) ^ lo)
    return (h >> 8).float() * (1.0 / (1 << 24))


# Entries per block of the two-level inverse CDF: the block sums are one reduction over
# the vocabulary, then only ~V/1024 block totals and one block's 1024 entries are scanned.
CDF_BLOCK = 1024


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index of the first entry whose cumulative mass exceeds u * total: zero-mass entries
    are never drawn, and the total is the row's own sum (not assumed to be 1).

    Past one block, two levels instead of a cumulative sum over the whole vocabulary (a
    scan kernel that took ~0.3 ms a step at 256 rows x 152k on an H200, more than a
    layer): the block whose running total first exceeds the target, then the entry inside
    it. The same entry in exact arithmetic; in floating point the sums are grouped by
    block, so a draw within a rounding error of a boundary may pick its neighbour."""
    n, v = probs.shape
    if v <= CDF_BLOCK:  # one block: its scan is the whole search
        cum = probs.cumsum(-1)
        return _first_above(probs, cum, u * cum[:, -1]).squeeze(-1)
    full = v - v % CDF_BLOCK
    sums = probs[:, :full].view(n, -1, CDF_BLOCK).sum(-1)
    if full < v:
        sums = torch.cat([sums, probs[:, full:].sum(-1, keepdim=True)], dim=-1)
    cum = sums.cumsum(-1)
    target = u * cum[:, -1]
    block = _first_above(sums, cum, target)
    before = torch.where(block > 0, cum.gather(-1, (block - 1).clamp(min=0)), 0.0)
    idx = block * CDF_BLOCK + torch.arange(CDF_BLOCK, device=probs.device)
    inside = probs.gather(-1, idx.clamp(max=v - 1)) * (idx < v)
    within = _first_above(inside, inside.cumsum(-1), target - before.squeeze(-1))
    return (block * CDF_BLOCK + within).squeeze(-1)


def _first_above(mass: torch.Tensor, cum: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[N, 1]: the first index whose running sum `cum` ([N, K], of `mass`) exceeds `target`
    [N]; the last index with mass where rounding put the target at or past the total."""
    first = torch.searchsorted(cum, target[:, None], right=True)
    last = mass.shape[-1] - 1 - (mass > 0).flip(-1).int().argmax(-1, keepdim=True)
    return torch.minimum(first, last)


def draw(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [N], its logprob [N]) per row of `logits` [N, V]: argmax when temperature == 0,
    else the inverse CDF at `uniforms` [N] of softmax(logits / T) cut to its top-p nucleus.
    The logprob is log softmax(logits / T) of the token before the cut (raw logits when
    greedy), as `token_logprobs` scores it; both share one fp32 copy of the logits and one
    log-normaliser, since at a real vocabulary these passes cost as much as a layer. The
    same distribution as `torch.multinomial`, not the same tokens for a given seed."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    scaled = logits.to(torch.float32, copy=True)
    if temperature > 0 and temperature != 1.0:
        scaled.div_(temperature)
    lse = scaled.logsumexp(-1)
    if temperature == 0:
        token = logits.argmax(-1)
    elif top_p >= 1:
        token = _inverse_cdf((scaled - lse[:, None]).exp_(), uniforms)
    else:
        token = _nucleus((scaled - lse[:, None]).exp_(), uniforms, top_p)
    return token, scaled.gather(-1, token[:, None]).squeeze(-1) - lse


@torch.compiler.disable  # a scan, as _inverse_cdf
def _nucleus(probs: torch.Tensor, uniforms: torch.Tensor, top_p: float) -> torch.Tensor:
    """The inverse CDF draw within the smallest head of the sorted distribution whose mass
    reaches top_p (the most likely token always survives); a stable sort keeps ties
    deterministic."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    drop = sorted_p.cumsum(-1) - sorted_p >= top_p
    picked = _inverse_cdf(sorted_p.masked_fill_(drop, 0.0), uniforms)
    return order.gather(-1, picked[:, None]).squeeze(-1)


def sample_rows(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_p: float
) -> torch.Tensor:
    """The tokens of `draw`."""
    return draw(logits, uniforms, temperature, top_p)[0]


def next_tokens(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    column: torch.Tensor,
    done: torch.Tensor,
    eos: torch.Tensor,
    caps: torch.Tensor,
    temperature: float,
    top_p: float,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step's draw for every row, out of place (the engine writes it into its
    buffers): (token to store: pad once finished, its logprob: 0 once finished, live rows,
    rows finished after this token, the token each row feeds next). `column` is the
    response step drawn (a device tensor), `caps` each row's forced length."""
    nxt, lp = draw(logits, counter_uniform(seeds, column), temperature, top_p)
    live = ~done
    finished = done | (live & ((nxt == eos) | (column + 1 >= caps)))
    return torch.where(live, nxt, pad_id), torch.where(live, lp, 0.0), live, finished, nxt
