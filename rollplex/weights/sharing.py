"""WeightSharing: per GPU and rollout tensor, which bytes alias training storage.

Built from a model and the two placements; answers, per (rollout tensor, GPU), a `Share`
(its class, bytes, and how to alias) and the byte `runs` that local training storage holds.
The classes are described in docs/architecture.md (Weights).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum

from rollplex.specs.model import ModelSpec
from rollplex.weights import algebra
from rollplex.weights.layouts import (
    Block,
    LayoutError,
    RolloutPlacement,
    TrainPlacement,
    describe,
    rollout_blocks,
    storage_order,
    train_blocks,
)
from rollplex.weights.params import Param, RolloutTensor, param_table, rollout_tensors

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class Kind(StrEnum):
    IDENTICAL = "identical"
    VIEW = "view"
    PARTIAL = "partial"
    INCOMPATIBLE = "incompatible"


@dataclass(slots=True, frozen=True)
class Placement:
    """The local shard of training parameter `param` lives at byte `offset` of the
    rollout tensor's buffer (the trainer allocates it there)."""

    param: str
    offset: int
    nbytes: int


@dataclass(slots=True, frozen=True)
class ByteRun:
    """Bytes [dst, dst + nbytes) of the rollout tensor equal bytes [src, src + nbytes) of
    `param`'s local training shard (unpadded, contiguous, in the rollout dtype)."""

    dst: int
    param: str
    src: int
    nbytes: int


@dataclass(slots=True, frozen=True)
class Share:
    """One rollout tensor on one GPU."""

    tensor: str
    group: str  # parameter class: the name without its layer index
    gpu: int
    replica: int
    rank: int
    shape: tuple[int, ...]
    kind: Kind
    nbytes: int  # the rollout tensor's size: what a second copy costs on this GPU
    shared_bytes: int  # bytes that are training storage (no extra memory)
    local_bytes: int  # bytes that local training storage holds (aliased or copied)
    pad_bytes: int  # vocab padding rows: zeros no training shard holds
    trainable: bool
    host: str | None = None  # IDENTICAL/strided VIEW: the shard the tensor is a view of
    host_offset: int = 0  # bytes into the host shard
    strides: tuple[int, ...] = ()  # element strides of that view
    placements: tuple[Placement, ...] = ()  # VIEW over adjacent shards, or PARTIAL

    @property
    def rebuild_bytes(self) -> int:
        """Bytes the rollout needs beyond training storage (the rebuild buffer's share)."""
        return self.nbytes - self.shared_bytes

    @property
    def remote_bytes(self) -> int:
        """Bytes that must come from other GPUs on each rebuild."""
        return self.nbytes - self.local_bytes - self.pad_bytes


def contiguous_ranks(world: int, tp: int) -> tuple[tuple[int, ...], ...]:
    """Replica k on GPUs [k*tp, (k+1)*tp): vLLM's default placement."""
    return tuple(tuple(range(k * tp, (k + 1) * tp)) for k in range(world // tp))


def strided_ranks(world: int, tp: int) -> tuple[tuple[int, ...], ...]:
    """Replica k on GPUs k, k+R, k+2R, ... (R = world/tp): rollout rank r sits on the GPUs
    that hold FSDP chunks [r*R, (r+1)*R), the rows that rank needs when FSDP and TP
    boundaries coincide."""
    reps = world // tp
    return tuple(tuple(k + r * reps for r in range(tp)) for k in range(reps))


class WeightSharing:
    """The layout algebra for one model and one pair of placements."""

    def __init__(
        self,
        spec: ModelSpec,
        train: TrainPlacement,
        rollout: RolloutPlacement,
        dtype: str = "bfloat16",
        train_dtype: str = "bfloat16",
        tensors: list[RolloutTensor] | None = None,
    ) -> None:
        """`tensors`: the rollout's tensors (default: vLLM's, `rollout_tensors`; the torch
        rollout passes `torch_rollout_tensors`)."""
        self.spec, self.train, self.rollout = spec, train, rollout
        self.rank_map = "explicit"  # how the replicas were chosen (build_sharing labels it)
        self.layouts = describe(train, rollout)
        _check_ranks(train, rollout, self.layouts)
        self.itemsize = DTYPE_BYTES[dtype]
        self.aliasable = dtype == train_dtype  # a cast cannot share bytes
        self.params: dict[str, Param] = {p.name: p for p in param_table(spec)}
        if tensors is None:
            tensors = rollout_tensors(spec, rollout.vision_tp)
        self.tensors: dict[str, RolloutTensor] = {t.name: t for t in tensors}
        self.tensor_of = {p: t.name for t in self.tensors.values() for p in t.params}
        for heads, proj in ((spec.num_heads, "q_proj"), (spec.num_kv_heads, "k_proj")):
            if heads % train.tp:  # torchtitan's TP gives each rank whole heads
                name = f"model.language_model.layers.0.self_attn.{proj}.weight"
                raise LayoutError(f"{self.where(name)}: training TP {train.tp} does not divide "
                                  f"its {heads} heads")  # fmt: skip
        self._ranks = rollout.rank_of()
        self._train: dict[tuple[str, int], tuple[tuple[Block, ...], int]] = {}
        self._groups: dict[str, tuple[str, int]] = {}  # class -> (representative, count)
        for t in self.tensors.values():
            rep, n = self._groups.get(t.group, (t.name, 0))
            self._groups[t.group] = (rep, n + 1)
        self._param_groups: dict[str, tuple[str, int]] = {}
        for name in self.params:
            key = re.sub(r"\.(layers|blocks)\.\d+\.", ".", name)
            rep, n = self._param_groups.get(key, (name, 0))
            self._param_groups[key] = (rep, n + 1)

    @property
    def world(self) -> int:
        return self.train.world

    def where(self, name: str) -> str:
        return f"{name} [{self.layouts}]"  # how LayoutErrors name the tensor and layouts

    # -- the two layouts -------------------------------------------------------------
    def train_shard(self, param: str, gpu: int) -> tuple[tuple[Block, ...], int]:
        """`param`'s local training shard on `gpu` (blocks in memory order) and the
        FSDP2 padding elements its all-gather adds."""
        key = (param, gpu)
        if key not in self._train:
            p = self.params[param]
            t = self.tensors[self.tensor_of[param]]
            order = storage_order(p, t.split, self.rollout, self.train)
            self._train[key] = train_blocks(p, gpu, self.train, order, self.where(param))
        return self._train[key]

    def train_shape(self, param: str, gpu: int) -> tuple[int, ...]:
        """Shape of the local shard tensor (unpadded)."""
        p = self.params[param]
        blocks, _ = self.train_shard(param, gpu)
        return _shape(blocks, p.shape)

    def rollout_shard(self, tensor: str, gpu: int) -> tuple[Block, ...]:
        t = self.tensors[tensor]
        _, rank = self._ranks[gpu]
        return rollout_blocks(t, rank, self.rollout.tp_for(t), self.where(tensor))

    # -- the algebra -----------------------------------------------------------------
    def share(self, tensor: str, gpu: int) -> Share:
        t = self.tensors[tensor]
        replica, rank = self._ranks[gpu]
        x = self.rollout_shard(tensor, gpu)
        size = algebra.numel(x)
        pad = sum(b.numel for b in x if b.param is None)
        chunks = {p: self.train_shard(p, gpu)[0] for p in t.params}
        local = sum(algebra.overlap(x, c) for c in chunks.values())
        shape = (sum(b.r1 - b.r0 for b in x), *((x[0].width,) if t.tail else ()))
        b = self.itemsize
        common = dict(
            tensor=tensor, group=t.group, gpu=gpu, replica=replica, rank=rank, shape=shape,
            nbytes=size * b, local_bytes=local * b, pad_bytes=pad * b, trainable=t.trainable,
        )  # fmt: skip
        if not self.aliasable:
            return Share(kind=Kind.INCOMPATIBLE, shared_bytes=0, **common)
        for p, c in chunks.items():
            off = algebra.locate(c, x)
            if off is not None:  # a contiguous range of one local shard
                return Share(
                    kind=Kind.IDENTICAL, shared_bytes=size * b, host=p, host_offset=off * b,
                    strides=_contiguous(shape), **common,
                )  # fmt: skip
            view = algebra.strided_view(c, x)
            if view is not None:  # a 2-D sub-block of one local shard
                off, stride = view
                return Share(
                    kind=Kind.VIEW, shared_bytes=size * b, host=p, host_offset=off * b,
                    strides=(stride, 1), **common,
                )  # fmt: skip
        placed = []
        for p, c in chunks.items():
            off = algebra.locate(x, c)
            if off is not None:
                placed.append(Placement(p, off * b, algebra.numel(c) * b))
        covered = sum(pl.nbytes for pl in placed)
        kind = Kind.VIEW if covered == size * b else Kind.PARTIAL if covered else Kind.INCOMPATIBLE
        return Share(kind=kind, shared_bytes=covered, placements=tuple(placed), **common)

    def runs(self, tensor: str, gpu: int) -> list[ByteRun]:
        """Every byte range of the rollout tensor that local training storage holds."""
        x = self.rollout_shard(tensor, gpu)
        b = self.itemsize
        out = []
        for p in self.tensors[tensor].params:
            chunk, _ = self.train_shard(p, gpu)
            out += [ByteRun(r.dst * b, p, r.src * b, r.n * b) for r in algebra.runs(x, chunk)]
        return sorted(out, key=lambda r: r.dst)

    def shares(self, gpu: int) -> list[Share]:
        return [self.share(name, gpu) for name in self.tensors]

    def class_shares(self, gpu: int) -> list[tuple[Share, int]]:
        """One Share per parameter class (layers have equal shapes), with the class count."""
        return [(self.share(rep, gpu), n) for rep, n in self._groups.values()]

    def train_bytes(self, gpu: int) -> int:
        """Local training storage in the rollout dtype, FSDP padding included."""
        total = 0
        for p, n in self._param_groups.values():  # layers of a class have equal shapes
            blocks, pad = self.train_shard(p, gpu)
            total += (algebra.numel(blocks) + pad) * n
        return total * self.itemsize

    def param_bytes(self) -> int:
        return sum(p.numel for p in self.params.values()) * self.itemsize


def _shape(blocks: tuple[Block, ...], full: tuple[int, ...]) -> tuple[int, ...]:
    rows = sum(b.r1 - b.r0 for b in blocks)
    if len(full) == 1:
        return (rows,)
    width = blocks[0].width if blocks else math.prod(full[1:])
    return (rows, *full[1:]) if width == math.prod(full[1:]) else (rows, width)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _check_ranks(train: TrainPlacement, rollout: RolloutPlacement, layouts: str) -> None:
    world = train.world
    gpus = [g for rep in rollout.replicas for g in rep]
    if world % rollout.tp:
        raise LayoutError(
            f"rollout TP {rollout.tp} does not divide the {world} training GPUs [{layouts}]"
        )
    bad = [rep for rep in rollout.replicas if len(rep) != rollout.tp]
    if bad:
        raise LayoutError(f"rank map: replica {list(bad[0])} has {len(bad[0])} GPUs, "
                          f"rollout TP is {rollout.tp} [{layouts}]")  # fmt: skip
    if sorted(gpus) != list(range(world)):
        raise LayoutError(
            f"rank map must place each of the {world} training GPUs 0..{world - 1} exactly "
            f"once (colocated rollout); got {sorted(gpus)} [{layouts}]"
        )
