"""The rebuild of the rollout tensors that are not training storage (the `weight_sync` of
`rollout_sync=share`), compiled once from the layout algebra's rebuild plans.

Every rank computes every GPU's `rebuild_plan`, so senders and receivers agree on the order
without metadata; constant-stride runs fold into one strided copy; bytes move by
`all_to_all_single` per bucket of tensors (bounded staging), local bytes by local copies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rollplex.weights import Copy, WeightSharing, rebuild_plan

BUCKET_BYTES = 256 << 20  # staging per all_to_all: bounded, yet few calls for a 3B model


@dataclass(slots=True, frozen=True)
class Strided:
    """`count` runs of `n` elements: dst[d0 + i*ds : +n] <- src[s0 + i*ss : +n]."""

    tensor: str  # destination rollout tensor
    param: str  # source training shard
    d0: int
    s0: int
    n: int
    count: int
    ds: int
    ss: int

    @property
    def numel(self) -> int:
        return self.n * self.count

    def dst(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.as_strided((self.count, self.n), (self.ds, 1), flat.storage_offset() + self.d0)

    def src(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.as_strided((self.count, self.n), (self.ss, 1), flat.storage_offset() + self.s0)


def fold(tensor: str, copies: Sequence[Copy], itemsize: int) -> list[Strided]:
    """Copies (bytes, sorted by dst) -> strided groups (elements)."""
    out: list[Strided] = []
    for c in copies:
        d, s, n = c.dst // itemsize, c.src // itemsize, c.nbytes // itemsize
        if out:
            g = out[-1]
            if g.param == c.param and g.n == n:
                if g.count == 1 and d > g.d0 and s >= g.s0:
                    out[-1] = Strided(tensor, c.param, g.d0, g.s0, n, 2, d - g.d0, s - g.s0)
                    continue
                if d == g.d0 + g.count * g.ds and s == g.s0 + g.count * g.ss:
                    out[-1] = Strided(tensor, c.param, g.d0, g.s0, n, g.count + 1, g.ds, g.ss)
                    continue
        out.append(Strided(tensor, c.param, d, s, n, 1, n, n))
    return out


@dataclass(slots=True)
class Bucket:
    local: list[Strided]  # runs this rank copies from its own shards
    send: list[list[Strided]]  # per destination rank: runs read from my shards, in order
    recv: list[list[Strided]]  # per source rank: runs written into my tensors, in order
    remote: bool = False  # some rank receives in this bucket (the same on every rank)

    def sizes(self, runs: list[list[Strided]]) -> list[int]:
        return [sum(r.numel for r in rs) for rs in runs]


class Exchange:
    """The compiled rebuild for rank `rank`: `run(shards, slots)` fills every rebuilt
    tensor (`slots[tensor]`, a contiguous slice of the rebuild buffer) from the training
    shards (`shards[param]`, contiguous, compute dtype) of all ranks."""

    def __init__(
        self,
        sharing: WeightSharing,
        rank: int,
        rebuilt: Callable[[str, int], bool],
        group: dist.ProcessGroup | None = None,
        bucket_bytes: int = BUCKET_BYTES,
        in_place: bool = False,
    ) -> None:
        """`in_place`: the training shards the algebra places inside rebuilt tensors
        (PARTIAL) already live there (the rollout's own bf16 compute copy): skip them."""
        self.rank, self.group, world = rank, group, sharing.world
        b = sharing.itemsize
        self.buckets: list[Bucket] = []
        bucket, size = self._new(world), 0
        for name in sharing.tensors:
            for g in range(world):
                if not rebuilt(name, g):
                    continue
                plan = rebuild_plan(sharing, name, g, in_place=in_place)
                bucket.remote |= any(c.gpu != g for c in plan)
                for src in range(world):
                    if src != rank and g != rank:
                        continue
                    runs = fold(name, [c for c in plan if c.gpu == src], b)
                    if src == g:
                        bucket.local += runs
                    elif g == rank:
                        bucket.recv[src] += runs
                    else:
                        bucket.send[g] += runs
            size += sharing.share(name, 0).nbytes * world  # the same on every rank
            if size >= bucket_bytes:
                self.buckets.append(bucket)
                bucket, size = self._new(world), 0
        self.buckets.append(bucket)
        self.sent = sum(sum(bk.sizes(bk.send)) for bk in self.buckets) * b
        self.received = sum(sum(bk.sizes(bk.recv)) for bk in self.buckets) * b
        self.copied = sum(r.numel for bk in self.buckets for r in bk.local) * b

    @staticmethod
    def _new(world: int) -> Bucket:
        return Bucket([], [[] for _ in range(world)], [[] for _ in range(world)])

    def run(self, shards: Mapping[str, torch.Tensor], slots: Mapping[str, torch.Tensor]) -> None:
        for bk in self.buckets:
            for r in bk.local:
                r.dst(slots[r.tensor]).copy_(r.src(shards[r.param]))
            if not bk.remote:
                continue  # every rank skips it alike: `remote` is global arithmetic
            send_sizes, recv_sizes = bk.sizes(bk.send), bk.sizes(bk.recv)
            ref = next(iter(shards.values()))
            send = torch.empty(sum(send_sizes), dtype=ref.dtype, device=ref.device)
            recv = torch.empty(sum(recv_sizes), dtype=ref.dtype, device=ref.device)
            o = 0
            for runs in bk.send:
                for r in runs:
                    send[o : o + r.numel].view(r.count, r.n).copy_(r.src(shards[r.param]))
                    o += r.numel
            dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=self.group)
            o = 0
            for runs in bk.recv:
                for r in runs:
                    r.dst(slots[r.tensor]).copy_(recv[o : o + r.numel].view(r.count, r.n))
                    o += r.numel
