"""What the runtime does with a WeightSharing after an optimizer step (`weight_sync`).

`shard_homes(sharing, gpu)`: where each training shard is allocated (inside a rollout
tensor's buffer, hosting a view, or on its own). `rebuild_plan(sharing, tensor, gpu)`: the
copies that fill every byte the training storage does not hold in place, from the local
shard where it can, else from the lowest-numbered GPU that holds the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollplex.weights import algebra
from rollplex.weights.sharing import Kind, WeightSharing


@dataclass(slots=True, frozen=True)
class Home:
    """Where `param`'s local training shard lives on a GPU."""

    param: str
    tensor: str | None  # the rollout tensor it belongs to (None: used by none in place)
    inside: bool  # True: allocated at `offset` inside that tensor's buffer
    offset: int  # bytes into the buffer (inside) or, hosting a view, 0
    hosts: bool  # the rollout tensor is a view of this shard


@dataclass(slots=True, frozen=True)
class Copy:
    """Bytes [dst, dst + nbytes) of the rollout tensor <- bytes [src, src + nbytes) of
    `param`'s training shard on `gpu` (unpadded, contiguous, rollout dtype)."""

    dst: int
    gpu: int
    param: str
    src: int
    nbytes: int


def shard_homes(sharing: WeightSharing, gpu: int) -> dict[str, Home]:
    homes = {p: Home(p, None, False, 0, False) for p in sharing.params}
    for name in sharing.tensors:
        sh = sharing.share(name, gpu)
        if sh.host is not None and sh.kind in (Kind.IDENTICAL, Kind.VIEW):
            homes[sh.host] = Home(sh.host, name, False, 0, True)
        for pl in sh.placements:
            homes[pl.param] = Home(pl.param, name, True, pl.offset, False)
    return homes


def _subtract(need: list[tuple[int, int]], a: int, b: int) -> tuple[list, list]:
    """Split `need` (sorted disjoint intervals) by [a, b): (what is left, what was cut)."""
    left, cut = [], []
    for s, e in need:
        if e <= a or b <= s:
            left.append((s, e))
            continue
        if s < a:
            left.append((s, a))
        if b < e:
            left.append((b, e))
        cut.append((max(s, a), min(e, b)))
    return left, cut


def rebuild_plan(
    sharing: WeightSharing, tensor: str, gpu: int, in_place: bool = True
) -> list[Copy]:
    """`in_place=False`: the rollout cannot place training shards inside its buffers
    (the torch rollout over FSDP2's own storage), so every byte of a tensor that is not
    an identical/view alias is copied, PARTIAL placements included."""
    sh = sharing.share(tensor, gpu)
    if sh.kind in (Kind.IDENTICAL, Kind.VIEW) and (in_place or sh.host is not None):
        return []
    b = sharing.itemsize
    x = sharing.rollout_shard(tensor, gpu)
    need, base = [], 0
    for blk in x:  # every byte but vLLM's padding rows
        if blk.param is not None:
            need.append((base * b, (base + blk.numel) * b))
        base += blk.numel
    for pl in sh.placements if in_place else ():  # in place: nothing to copy
        need, _ = _subtract(need, pl.offset, pl.offset + pl.nbytes)
    copies = []
    for g in [gpu, *(h for h in range(sharing.world) if h != gpu)]:
        for p in sharing.tensors[tensor].params:
            chunk, _ = sharing.train_shard(p, g)
            for r in algebra.runs(x, chunk):
                need, cut = _subtract(need, r.dst * b, (r.dst + r.n) * b)
                copies += [Copy(s, g, p, r.src * b + s - r.dst * b, e - s) for s, e in cut]
            if not need:
                return sorted(copies, key=lambda c: c.dst)
    if need:  # every parameter byte lives on some training GPU
        raise AssertionError(f"{sharing.where(tensor)}: bytes {need[:3]} held by no GPU")
    return sorted(copies, key=lambda c: c.dst)
