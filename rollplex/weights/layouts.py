"""The two placements of the weights, as blocks of each parameter's 2-D view.

Training: FSDP2 (optionally with TP, torchtitan's plan and mesh) in `train_blocks`, with the
aliasing storage order of `storage_order`; rollout: vLLM TP per replica in `rollout_blocks`.
tests/weights checks the training side against real `fully_shard`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollplex.weights.params import VOCAB_PAD, Param, RolloutTensor, Split


class LayoutError(ValueError):
    """A placement the algebra cannot serve; the message names the parameter and layouts."""


@dataclass(slots=True, frozen=True)
class Block:
    """Rows [r0, r1) x cols [c0, c1) of `param`'s 2-D view, stored row-major.
    `param=None` is padding (zeros that no parameter holds)."""

    param: str | None
    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def width(self) -> int:
        return self.c1 - self.c0

    @property
    def numel(self) -> int:
        return (self.r1 - self.r0) * (self.c1 - self.c0)


def normalize(blocks: list[Block]) -> tuple[Block, ...]:
    """Drop empty blocks and merge neighbours that continue each other in memory."""
    out: list[Block] = []
    for b in blocks:
        if b.numel == 0:
            continue
        if out:
            a = out[-1]
            if (a.param, a.c0, a.c1, a.r1) == (b.param, b.c0, b.c1, b.r0):
                out[-1] = Block(a.param, a.r0, b.r1, a.c0, a.c1)
                continue
        out.append(b)
    return tuple(out)


@dataclass(slots=True, frozen=True)
class TrainPlacement:
    fsdp: int
    tp: int = 1
    aliasing_storage: bool = True  # False: plain FSDP2 (every parameter in its own order)

    @property
    def world(self) -> int:
        return self.fsdp * self.tp

    def coords(self, gpu: int) -> tuple[int, int]:
        """(dp rank, tp rank) of a GPU."""
        return divmod(gpu, self.tp)


@dataclass(slots=True, frozen=True)
class RolloutPlacement:
    tp: int
    replicas: tuple[tuple[int, ...], ...]  # replica k: the GPU of each TP rank, in rank order
    vision_tp: bool = True  # False: vLLM's mm_encoder_tp_mode="data" (vision replicated)

    def rank_of(self) -> dict[int, tuple[int, int]]:
        """GPU -> (replica, TP rank)."""
        return {g: (k, r) for k, gpus in enumerate(self.replicas) for r, g in enumerate(gpus)}

    def tp_for(self, tensor: RolloutTensor) -> int:
        return 1 if tensor.split is Split.REPLICATED else self.tp


def describe(train: TrainPlacement, rollout: RolloutPlacement) -> str:
    mapping = " ".join("[" + ",".join(map(str, r)) + "]" for r in rollout.replicas)
    vision = "tp" if rollout.vision_tp else "replicated"
    return (
        f"train fsdp={train.fsdp} tp={train.tp}; rollout tp={rollout.tp} "
        f"replicas={mapping} vision={vision}"
    )


def _even(n: int, k: int, what: str, where: str) -> int:
    """n / k, or a LayoutError saying who cannot split what (`where` names the tensor,
    the layouts and the split)."""
    if n % k:
        raise LayoutError(f"{where}: {k} does not divide {n} {what}")
    return n // k


def storage_order(
    param: Param, rollout_split: Split, rollout: RolloutPlacement, train: TrainPlacement
) -> tuple[Block, ...]:
    """The blocks of the full parameter, stacked along dim 0 in the order training
    stores them (all of one width). FSDP2 shards this stacked matrix by rows."""
    whole = (Block(param.name, 0, param.rows, 0, param.cols),)
    tp_sharded = train.tp > 1 and param.tower == "llm" and param.train_split is not Split.REPLICATED
    if not train.aliasing_storage or tp_sharded:
        return whole
    t = rollout.tp if (rollout.vision_tp or param.tower == "llm") else 1
    if t == 1:
        return whole
    if param.name.endswith(("attn.qkv.weight", "attn.qkv.bias")) and param.rows % (3 * t) == 0:
        third = param.rows // 3  # [q; k; v] -> [q_0; k_0; v_0; q_1; ...]
        n = third // t
        return tuple(
            Block(param.name, p * third + r * n, p * third + (r + 1) * n, 0, param.cols)
            for r in range(t)
            for p in range(3)
        )
    if rollout_split is Split.ROW and len(param.shape) == 2 and param.cols % t == 0:
        n = param.cols // t  # column blocks stacked: block r is rollout rank r's tensor
        return tuple(Block(param.name, 0, param.rows, r * n, (r + 1) * n) for r in range(t))
    return whole


def train_blocks(
    param: Param, gpu: int, train: TrainPlacement, order: tuple[Block, ...], where: str
) -> tuple[tuple[Block, ...], int]:
    """The GPU's local shard of `param` as blocks in memory order, and the FSDP2 padding
    (elements) its all-gather adds."""
    i, j = train.coords(gpu)
    width = order[0].width
    rows = sum(b.r1 - b.r0 for b in order)  # rows of the stacked storage matrix
    r0, r1, c0, c1 = 0, rows, 0, width  # the TP-local region of it
    if train.tp > 1 and param.tower == "llm":
        if param.train_split in (Split.COLUMN, Split.VOCAB):
            n = _even(rows, train.tp, "rows", f"{where}: training TP Shard(0)")
            r0, r1 = j * n, (j + 1) * n
        elif param.train_split is Split.ROW:
            n = _even(width, train.tp, "cols", f"{where}: training TP Shard(1)")
            c0, c1 = j * n, (j + 1) * n
    n = r1 - r0
    chunk = -(-n // train.fsdp)  # FSDP2: torch.chunk sizes, trailing ranks short or empty
    a, b = min(i * chunk, n), min((i + 1) * chunk, n)
    pad = (chunk - (b - a)) * (c1 - c0)
    r0, r1 = r0 + a, r0 + b
    blocks: list[Block] = []
    base = 0
    for o in order:  # storage rows [base, base + o.rows) hold o
        s, e = max(r0, base), min(r1, base + o.r1 - o.r0)
        if s < e:
            blocks.append(Block(param.name, o.r0 + s - base, o.r0 + e - base, o.c0 + c0, o.c0 + c1))
        base += o.r1 - o.r0
    return normalize(blocks), pad


def rollout_blocks(tensor: RolloutTensor, rank: int, tp: int, where: str) -> tuple[Block, ...]:
    """Rank `rank`'s share of `tensor` as blocks in memory order (vLLM's layout)."""
    w = tensor.cols
    if tensor.split is Split.REPLICATED or (tp == 1 and tensor.split is not Split.VOCAB):
        blocks = [Block(p.param, p.start, p.start + p.rows, 0, w) for p in tensor.parts]
    elif tensor.split is Split.ROW:
        (part,) = tensor.parts
        n = _even(w, tp, "input cols", f"{where}: row-parallel rollout TP")
        blocks = [Block(part.param, 0, part.rows, rank * n, (rank + 1) * n)]
    elif tensor.split is Split.VOCAB:
        (part,) = tensor.parts
        vocab = part.rows
        padded = -(-vocab // VOCAB_PAD) * VOCAB_PAD
        n = _even(padded, tp, f"padded vocab rows (vocab {vocab})", f"{where}: rollout TP")
        a, b = rank * n, (rank + 1) * n
        blocks = [Block(part.param, min(a, vocab), min(b, vocab), 0, w)]
        blocks.append(Block(None, max(a, vocab), max(b, vocab), 0, w))
    else:
        blocks = []
        for p in tensor.parts:
            per_unit = p.rows // p.units
            if tp > p.units and p.replicable:
                _even(tp, p.units, f"rollout TP ranks ({p.what} of {p.param} are "
                      "replicated only when the ranks are a multiple of them)",
                      f"{where}: {p.units} {p.what}")  # fmt: skip
                u0 = rank // (tp // p.units)
                u1 = u0 + 1
            else:
                n = _even(p.units, tp, f"{p.what} of {p.param}", f"{where}: rollout TP")
                u0, u1 = rank * n, (rank + 1) * n
            blocks.append(Block(p.param, p.start + u0 * per_unit, p.start + u1 * per_unit, 0, w))
    return normalize(blocks)
