"""Executing a plan's cross-pool `Transfer`s (planner/transfers.py) with torch.distributed
point-to-point ops: the weights every RL step, then the rollout's outputs by prompt rows.
All sends and receives of one transfer are posted at once (`batch_isend_irecv`: gloo on
CPU, NCCL on GPU); each side records and logs the bytes per route and the seconds waited.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from rollplex.backends.torch.values import Features, Responses, TokenLogprobs
from rollplex.planner.plan import Transfer
from rollplex.planner.pools import Pools
from rollplex.planner.transfers import handover_values

log = logging.getLogger(__name__)
_TYPES = {c.__name__: c for c in (Responses, TokenLogprobs)}


@dataclass(slots=True)
class Moved:
    """What one rank moved for one transfer step."""

    step: str
    what: str
    seconds: float = 0.0
    routes: dict[tuple[int, int], int] = field(default_factory=dict)  # (src, dst) -> bytes
    header_bytes: int = 0
    values: dict[str, int] = field(default_factory=dict)  # hand-over: bytes per graph value

    @property
    def nbytes(self) -> int:
        return sum(self.routes.values())


def _post(ops: list[dist.P2POp]) -> None:
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _done(device: torch.device) -> None:
    if device.type == "cuda":  # the seconds include the copies, not only their launch
        torch.cuda.current_stream(device).synchronize()


# -- weights ------------------------------------------------------------------------------
def send_weights(
    pools: Pools, transfer: Transfer, shards: Sequence[torch.Tensor], version: int, step: str
) -> Moved:
    """Training rank: its local shards (dim-0 chunks, in the rollout's dtype, contiguous)
    of every trained parameter to each rollout rank of `transfer`'s routes from it. FSDP2's
    `Shard(0)` is torch.chunk's split of dim 0, so the rollout rank receives chunk j straight
    into rows of its full parameter (a contiguous view: no staging buffer) from the j-th
    training rank. The first training rank also sends the version (8 bytes, counted apart
    from the payload), so the rollout names what it holds."""
    moved = Moved(step, transfer.what)
    t0 = time.perf_counter()
    dsts = sorted({r.dst for r in transfer.routes if r.src == pools.rank})
    ops = []
    first = min(r.src for r in transfer.routes) == pools.rank
    dev = shards[0].device if shards else torch.device("cpu")
    tag = torch.tensor([version], dtype=torch.long, device=dev)
    for dst in dsts:
        if first:  # one training rank names the version
            ops.append(dist.P2POp(dist.isend, tag, dst))
            moved.header_bytes += 8
        for s in shards:
            if s.numel():
                ops.append(dist.P2POp(dist.isend, s, dst))
        moved.routes[(pools.rank, dst)] = sum(s.numel() * s.element_size() for s in shards)
    _post(ops)
    _done(dev)
    moved.seconds = time.perf_counter() - t0
    return moved


def recv_weights(
    pools: Pools, transfer: Transfer, params: Sequence[torch.Tensor], step: str
) -> tuple[int, Moved]:
    """Rollout rank: every trained parameter (full, contiguous; filled in place) from the
    training ranks; returns the version they hold."""
    moved = Moved(step, transfer.what)
    t0 = time.perf_counter()
    train = list(pools.pool_ranks("train"))
    srcs = sorted({r.src for r in transfer.routes if r.dst == pools.rank})
    dev = params[0].device if params else torch.device("cpu")
    tag = torch.zeros(1, dtype=torch.long, device=dev)
    ops = [dist.P2POp(dist.irecv, tag, min(r.src for r in transfer.routes))]
    moved.header_bytes = 8
    for src in srcs:
        j, n = train.index(src), 0
        for p in params:
            chunks = p.chunk(len(train))  # torch.chunk, as DTensor's Shard(0)
            if j < len(chunks) and chunks[j].numel():
                ops.append(dist.P2POp(dist.irecv, chunks[j], src))
                n += chunks[j].numel() * p.element_size()
        moved.routes[(src, pools.rank)] = n
    _post(ops)
    _done(dev)
    moved.seconds = time.perf_counter() - t0
    return int(tag.item()), moved


# -- rollout outputs ----------------------------------------------------------------------
def prompt_rows(index: int, count: int, prompts: int) -> tuple[int, int]:
    """Prompt rows [lo, hi) of pool member `index` of `count` in a step of `prompts`."""
    n = prompts // count
    return index * n, (index + 1) * n


def send_outputs(
    pools: Pools, transfer: Transfer, values: dict[str, Any], prompts: int, step: str
) -> Moved:
    """Rollout replica: to each trainer of its routes, the prompt rows they share. The
    hand-over's values (features, responses, old logprobs, advantages: `handover_values`)
    go by prompt rows: replica k made prompts [kB/D, (k+1)B/D), trainer g needs
    [gB/T, (g+1)B/T); each overlap travels from k to g as a small pickled header (shapes,
    dtypes, token counts, counted apart from the payload), then the tensors themselves."""
    moved = Moved(step, transfer.what)
    t0 = time.perf_counter()
    roll, train = list(pools.pool_ranks("rollout")), list(pools.pool_ranks("train"))
    a, b = prompt_rows(roll.index(pools.rank), len(roll), prompts)
    for dst in sorted({r.dst for r in transfer.routes if r.src == pools.rank}):
        lo, hi = prompt_rows(train.index(dst), len(train), prompts)
        lo, hi = max(lo, a) - a, min(hi, b) - a
        rows = {k: _rows(v, lo, hi, b - a) for k, v in values.items()}
        for k, v in rows.items():
            n = sum(t.numel() * t.element_size() for t in _tensors([v]))
            moved.values[k] = moved.values.get(k, 0) + n
        header, tensors = _pack(rows)
        box = [header]
        dist.send_object_list(box, dst)
        moved.header_bytes += len(repr(header))
        _post([dist.P2POp(dist.isend, t, dst) for t in tensors if t.numel()])
        moved.routes[(pools.rank, dst)] = sum(t.numel() * t.element_size() for t in tensors)
    dev = next((t.device for t in _tensors(values.values())), torch.device("cpu"))
    _done(dev)
    moved.seconds = time.perf_counter() - t0
    return moved


def recv_outputs(
    pools: Pools, transfer: Transfer, device: torch.device, step: str
) -> tuple[dict[str, Any], Moved]:
    """Trainer: its prompt rows of every value, from the replicas that made them, merged
    in row order."""
    moved = Moved(step, transfer.what)
    t0 = time.perf_counter()
    parts: list[dict[str, Any]] = []
    for src in sorted({r.src for r in transfer.routes if r.dst == pools.rank}):
        box: list[Any] = [None]
        dist.recv_object_list(box, src)
        header = box[0]
        moved.header_bytes += len(repr(header))
        tensors = [torch.empty(s, dtype=_DTYPES[d], device=device) for s, d in header["tensors"]]
        _post([dist.P2POp(dist.irecv, t, src) for t in tensors if t.numel()])
        moved.routes[(src, pools.rank)] = sum(t.numel() * t.element_size() for t in tensors)
        parts.append(_unpack(header, tensors))
    _done(device)
    moved.seconds = time.perf_counter() - t0
    merged = {k: _merge([p[k] for p in parts]) for k in parts[0]} if parts else {}
    return merged, moved


# -- values <-> tensors -------------------------------------------------------------------
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.long,
                               torch.int32, torch.uint8, torch.bool, torch.float64)}  # fmt: skip


def _tensors(values: Iterable[Any]) -> Iterable[torch.Tensor]:
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, Features):
            yield v.values
        elif is_dataclass(v):
            yield from _tensors(getattr(v, f.name) for f in fields(v))


def _row_count(v: Any) -> int:
    if isinstance(v, Features):
        return v.rows
    if isinstance(v, torch.Tensor):
        return v.shape[0]
    return next(iter(_tensors([v]))).shape[0]


def _rows(v: Any, lo: int, hi: int, prompts: int) -> Any:
    """Prompt rows [lo, hi) of a value of `prompts` prompts (per-sample values have G rows
    per prompt)."""
    if v is None:
        return None
    per = _row_count(v) // prompts
    if isinstance(v, Features):
        return v.select(lo * per, hi * per)
    if isinstance(v, torch.Tensor):
        return v[lo * per : hi * per]
    return replace(v, **{f.name: getattr(v, f.name)[lo * per : hi * per] for f in fields(v)})


def _pack(values: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """A picklable header and the tensors (contiguous; bool as uint8: gloo has no bool)."""
    tensors: list[torch.Tensor] = []

    def add(t: torch.Tensor) -> int:
        wire = t.detach().to(torch.uint8) if t.dtype == torch.bool else t.detach()
        tensors.append(wire.contiguous())
        return len(tensors) - 1

    def one(v: Any) -> Any:
        if v is None:
            return ("none",)
        if isinstance(v, torch.Tensor):
            return ("tensor", add(v), str(v.dtype))
        if isinstance(v, Features):
            return ("features", add(v.values), list(v.tokens))
        if type(v).__name__ in _TYPES:
            body = {f.name: one(getattr(v, f.name)) for f in fields(v)}
            return ("fields", type(v).__name__, body)
        raise TypeError(f"the hand-over cannot send a {type(v).__name__}")

    body = {k: one(v) for k, v in values.items()}
    return {"values": body, "tensors": [(tuple(t.shape), str(t.dtype)) for t in tensors]}, tensors


def _unpack(header: dict[str, Any], tensors: list[torch.Tensor]) -> dict[str, Any]:
    def one(spec: Any) -> Any:
        kind = spec[0]
        if kind == "none":
            return None
        if kind == "tensor":
            t = tensors[spec[1]]
            return t.bool() if spec[2] == str(torch.bool) else t
        if kind == "features":
            return Features(tensors[spec[1]], list(spec[2]))
        return _TYPES[spec[1]](**{k: one(s) for k, s in spec[2].items()})

    return {k: one(s) for k, s in header["values"].items()}


def _merge(parts: list[Any]) -> Any:
    first = parts[0]
    if first is None or len(parts) == 1:
        return first
    if isinstance(first, Features):
        return Features.merge(parts)
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    return replace(first, **{f.name: torch.cat([getattr(p, f.name) for p in parts])
                             for f in fields(first)})  # fmt: skip


def planned(transfer: Transfer) -> dict[tuple[int, int], int]:
    """The plan's bytes per (src, dst) route of `transfer`."""
    return {(r.src, r.dst): r.nbytes for r in transfer.routes}


__all__ = [
    "Moved",
    "handover_values",
    "planned",
    "prompt_rows",
    "recv_outputs",
    "recv_weights",
    "send_outputs",
    "send_weights",
]
