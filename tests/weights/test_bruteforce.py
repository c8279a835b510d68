"""The algebra's byte claims, checked by brute force on small shapes.

Every parameter is materialised with unique arange values, sharded the training way
(TP by torch.chunk, then FSDP2's dim-0 chunking; that emulation is checked against real
`fully_shard` below) and the rollout tensors are built the vLLM way, independently of
rollplex.weights. Then every byte the algebra says is local is found at that offset,
every other byte is nowhere in the GPU's training storage, and each class's aliasing
recipe (host + strides, or placements) reproduces the rollout tensor.
"""

from __future__ import annotations

import pytest
import torch

from rollplex.specs.weights import WeightsSpec
from rollplex.weights import Kind, WeightSharing, build_sharing
from rollplex.weights.layouts import storage_order
from rollplex.weights.rebuild import rebuild_plan, shard_homes
from tests.weights.conftest import small_spec

CONFIGS = [  # (train_fsdp, train_tp, rollout_tp, rank_map, storage)
    (1, 1, 1, "auto", "aliasing"),
    (2, 1, 1, "auto", "aliasing"),
    (2, 1, 2, "contiguous", "aliasing"),
    (2, 1, 2, "auto", "fsdp"),
    (4, 1, 2, "strided", "aliasing"),
    (4, 1, 2, "contiguous", "aliasing"),
    (4, 1, 4, "auto", "aliasing"),
    (8, 1, 4, "auto", "aliasing"),
    (8, 1, 2, "auto", "fsdp"),
    (1, 2, 2, "auto", "aliasing"),
    (1, 2, 2, "auto", "fsdp"),
    (1, 2, 1, "auto", "aliasing"),
    (2, 2, 2, "auto", "aliasing"),
    (2, 2, 4, "aligned", "aliasing"),
    (4, 2, 2, "auto", "aliasing"),
]


def full_params(s: WeightSharing) -> dict[str, torch.Tensor]:
    out, base = {}, 0
    for p in s.params.values():
        out[p.name] = torch.arange(base, base + p.numel, dtype=torch.float64).view(p.shape)
        base += p.numel
    return out


def fsdp_chunk(x: torch.Tensor, d: int, i: int) -> torch.Tensor:
    """FSDP2's dim-0 shard: torch.chunk, the trailing ranks possibly empty."""
    chunks = torch.chunk(x, d, dim=0)
    return chunks[i] if i < len(chunks) else x[:0]


def storage(s: WeightSharing, name: str, full: torch.Tensor) -> torch.Tensor:
    """The parameter in the storage order training declares (a permutation of it)."""
    p = s.params[name]
    order = storage_order(p, s.tensors[s.tensor_of[name]].split, s.rollout, s.train)
    if len(order) == 1:
        return full  # FSDP2 shards the parameter as it is
    m = full.reshape(p.rows, -1)
    out = torch.cat([m[b.r0 : b.r1, b.c0 : b.c1] for b in order])
    return out if len(p.shape) > 1 else out.view(-1)


def train_local(s: WeightSharing, full: dict[str, torch.Tensor], gpu: int) -> dict:
    i, j = s.train.coords(gpu)
    out = {}
    for name, p in s.params.items():
        x = storage(s, name, full[name])
        if s.train.tp > 1 and p.tower == "llm" and p.train_split.value != "replicated":
            dim = 1 if p.train_split.value == "row" else 0
            x = torch.chunk(x, s.train.tp, dim=dim)[j]
        out[name] = fsdp_chunk(x, s.train.fsdp, i).contiguous()
    return out


def hf_name(vllm: str) -> str:
    for a, b in (
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("visual.", "model.visual."),
    ):
        if vllm.startswith(a):
            return b + vllm[len(a) :]
    raise AssertionError(vllm)


def vllm_tensor(s: WeightSharing, name: str, full: dict, rank: int) -> torch.Tensor:
    """Rank `rank`'s tensor as vLLM's loaders build it."""
    spec, hf = s.spec, hf_name(name)
    vision = hf.startswith("model.visual.")
    t = s.rollout.tp if (s.rollout.vision_tp or not vision) else 1
    rank = rank if t > 1 else 0
    if "self_attn.qkv_proj." in hf:
        a, kind = hf.split("qkv_proj.")
        hd = spec.head_dim
        q = full[f"{a}q_proj.{kind}"].reshape(spec.num_heads, hd, -1).chunk(t)[rank]
        kv = spec.num_kv_heads
        heads = [rank // (t // kv)] if t > kv else range(rank * kv // t, (rank + 1) * kv // t)
        k = full[f"{a}k_proj.{kind}"].reshape(kv, hd, -1)[list(heads)]
        v = full[f"{a}v_proj.{kind}"].reshape(kv, hd, -1)[list(heads)]
        out = torch.cat([q, k, v]).reshape(-1, q.shape[-1])
        return out.view(-1) if kind == "bias" else out
    if hf.endswith(("attn.qkv.weight", "attn.qkv.bias")):
        w = full[hf]
        heads = spec.vision.num_heads
        x = w.reshape(3, heads, w.shape[0] // 3 // heads, -1).chunk(t, dim=1)[rank]
        return x.reshape(-1) if w.dim() == 1 else x.reshape(-1, w.shape[1])
    if "gate_up_proj" in hf:
        a, kind = hf.split("gate_up_proj.")
        gate, up = full[f"{a}gate_proj.{kind}"], full[f"{a}up_proj.{kind}"]
        return torch.cat([gate.chunk(t)[rank], up.chunk(t)[rank]])
    if hf.endswith(("o_proj.weight", "down_proj.weight", "attn.proj.weight", "mlp.2.weight")):
        return full[hf].chunk(t, dim=1)[rank]
    if hf.endswith(("embed_tokens.weight", "lm_head.weight")):
        w = full[hf]
        padded = -(-w.shape[0] // 64) * 64
        w = torch.cat([w, torch.full((padded - w.shape[0], w.shape[1]), -1.0, dtype=w.dtype)])
        return w.chunk(t)[rank]
    if hf.endswith(("merger.mlp.0.weight", "merger.mlp.0.bias")):
        return full[hf].chunk(t)[rank]
    w = full[hf]
    return w.reshape(w.shape[0], -1) if w.dim() > 2 else w  # patch_embed as vLLM's linear


def check_gpu(s: WeightSharing, full: dict, gpu: int) -> set[Kind]:
    local = train_local(s, full, gpu)
    flat = {n: t.reshape(-1) for n, t in local.items()}
    everything = torch.cat(list(flat.values()))
    item = s.itemsize
    kinds = set()
    for name, p in s.params.items():
        _, pad = s.train_shard(name, gpu)
        assert s.train_shape(name, gpu) == tuple(local[name].shape), name
        chunk = -(-storage(s, name, full[name]).shape[0] // s.train.fsdp)
        if s.train.tp > 1 and p.tower == "llm" and p.train_split.value in ("column", "vocab"):
            chunk = -(-storage(s, name, full[name]).shape[0] // s.train.tp // s.train.fsdp)
        width = local[name].numel() // max(local[name].shape[0], 1) if local[name].dim() else 1
        if local[name].shape[0]:
            assert pad == chunk * width - local[name].numel(), name
    _, rank = s.rollout.rank_of()[gpu]
    for name in s.tensors:
        sh = s.share(name, gpu)
        x = vllm_tensor(s, name, full, rank)
        assert sh.shape == tuple(x.shape), name
        xf = x.reshape(-1)
        covered = torch.zeros(xf.numel(), dtype=torch.bool)
        for r in s.runs(name, gpu):
            d, src, n = r.dst // item, r.src // item, r.nbytes // item
            assert torch.equal(xf[d : d + n], flat[r.param][src : src + n]), (name, r)
            assert not covered[d : d + n].any(), f"{name}: runs overlap"
            covered[d : d + n] = True
        rest = xf[~covered]
        assert not torch.isin(rest, everything).any(), f"{name}: a local byte is not in a run"
        assert sh.local_bytes == int(covered.sum()) * item, name
        assert sh.pad_bytes == int((xf == -1).sum()) * item, name
        assert sh.nbytes == xf.numel() * item
        kinds.add(sh.kind)
        if sh.kind is Kind.IDENTICAL:
            off = sh.host_offset // item
            assert torch.equal(flat[sh.host][off : off + xf.numel()], xf), name
            assert sh.shared_bytes == sh.nbytes
        elif sh.kind is Kind.VIEW and sh.host is not None:
            v = local[sh.host].reshape(-1).as_strided(x.shape, sh.strides, sh.host_offset // item)
            assert torch.equal(v, x), name
        else:
            for pl in sh.placements:  # the whole local shard sits at that offset
                off = pl.offset // item
                assert torch.equal(xf[off : off + pl.nbytes // item], flat[pl.param]), name
            placed = sum(pl.nbytes for pl in sh.placements)
            assert sh.shared_bytes == placed <= sh.local_bytes
            expected = {0: Kind.INCOMPATIBLE, sh.nbytes: Kind.VIEW}.get(placed, Kind.PARTIAL)
            assert sh.kind is expected, name
    return kinds


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "d{}t{}r{}-{}-{}".format(*c))
def test_bytes_claimed_local_are_local_and_the_rest_is_not(config, tied) -> None:
    d, t, r, rank_map, storage_kind = config
    ws = WeightsSpec(
        train_fsdp=d, train_tp=t, rollout_tp=r, rank_map=rank_map, storage=storage_kind
    )
    s = build_sharing(small_spec(tied), ws)
    full = full_params(s)
    for g in range(s.world):
        check_gpu(s, full, g)
    if d * t == 1:  # one GPU: all of it is training storage but vLLM's vocab padding rows
        assert all(s.share(n, 0).rebuild_bytes == s.share(n, 0).pad_bytes for n in s.tensors)


def test_the_checks_cover_every_class() -> None:
    seen = set()
    for d, t, r, rank_map, storage_kind in CONFIGS:
        ws = WeightsSpec(
            train_fsdp=d, train_tp=t, rollout_tp=r, rank_map=rank_map, storage=storage_kind
        )
        s = build_sharing(small_spec(), ws)
        seen |= {s.share(n, g).kind for g in range(s.world) for n in s.tensors}
        seen |= {"strided" for g in range(s.world) for n in s.tensors if s.share(n, g).strides[1:]
                 and s.share(n, g).kind is Kind.VIEW and s.share(n, g).host}  # fmt: skip
    assert seen >= {*Kind, "strided"}


def test_dtype_cast_shares_nothing(small) -> None:
    ws = WeightsSpec(dtype="bfloat16", train_dtype="float32")
    s = build_sharing(small, ws)
    shares = [s.share(n, 0) for n in s.tensors]
    assert all(sh.kind is Kind.INCOMPATIBLE and sh.shared_bytes == 0 for sh in shares)
    assert all(sh.local_bytes == sh.nbytes - sh.pad_bytes for sh in shares)  # cast locally


@pytest.mark.parametrize("config", CONFIGS[::2], ids=lambda c: "d{}t{}r{}-{}-{}".format(*c))
def test_rebuild_plan_fills_exactly_the_bytes_not_shared(config) -> None:
    d, t, r, rank_map, storage_kind = config
    ws = WeightsSpec(
        train_fsdp=d, train_tp=t, rollout_tp=r, rank_map=rank_map, storage=storage_kind
    )
    s = build_sharing(small_spec(), ws)
    full = full_params(s)
    locals_ = [
        {n: v.reshape(-1) for n, v in train_local(s, full, g).items()} for g in range(s.world)
    ]
    item = s.itemsize
    for g in range(s.world):
        homes = shard_homes(s, g)
        _, rank = s.rollout.rank_of()[g]
        for name in s.tensors:
            sh = s.share(name, g)
            xf = vllm_tensor(s, name, full, rank).reshape(-1)
            got = torch.full_like(xf, -1.0)
            for pl in sh.placements:  # in place, by the trainer's allocation
                assert homes[pl.param].inside and homes[pl.param].tensor == name
                off = pl.offset // item
                got[off : off + pl.nbytes // item] = locals_[g][pl.param]
            if sh.kind in (Kind.IDENTICAL, Kind.VIEW) and sh.host:
                assert homes[sh.host].hosts
                got = xf.clone()
            plan = rebuild_plan(s, name, g)
            assert sum(c.nbytes for c in plan) == sh.rebuild_bytes - sh.pad_bytes
            assert sum(c.nbytes for c in plan if c.gpu != g) == sh.remote_bytes
            for c in plan:
                d0, s0, n = c.dst // item, c.src // item, c.nbytes // item
                assert (got[d0 : d0 + n] == -1).all(), f"{name}: copied twice"
                got[d0 : d0 + n] = locals_[c.gpu][c.param][s0 : s0 + n]
            assert torch.equal(got, xf), name
