"""The parameters of a Qwen2.5-VL model, and the tensors a vLLM-style rollout builds from them.

Torch-free, from a ModelSpec: `param_table` lists transformers' parameters (tested against the
meta-device model), `rollout_tensors` vLLM's after its loader fuses them (`qkv_proj`,
`gate_up_proj`, the patch embed as a linear, a tied `lm_head`). Every tensor is a 2-D matrix:
rows = dim 0, cols = the rest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum

from rollplex.specs.model import ModelSpec

VOCAB_PAD = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE: vocab rows are padded to a multiple of it


class Split(StrEnum):
    """How a tensor is split across tensor-parallel ranks."""

    COLUMN = "column"  # output rows split (q/k/v, gate/up, merger mlp.0, their biases)
    ROW = "row"  # input cols split (o_proj, down_proj, vision proj, merger mlp.2)
    VOCAB = "vocab"  # vocab rows split, padded to a multiple of 64 first (embed, lm_head)
    REPLICATED = "replicated"  # whole on every rank (norms, row-parallel biases, patch_embed)


@dataclass(slots=True, frozen=True)
class Param:
    """One transformers parameter (a tied lm_head is not listed: it is the embedding)."""

    name: str
    shape: tuple[int, ...]
    tower: str  # "llm" or "vision"
    train_split: Split  # the training TP plan (torchtitan's, for the LLM; vision: replicated)
    trainable: bool

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(slots=True, frozen=True)
class Part:
    """Rows [start, start + rows) of `param` inside a rollout tensor, split per rank as
    `units` heads of rows/units rows each. `replicable`: vLLM gives each rank one whole
    unit when the TP degree exceeds the units (KV heads); otherwise units % tp must be 0."""

    param: str
    start: int
    rows: int
    units: int
    replicable: bool = False
    what: str = "rows"  # names the units in errors: "query heads", "KV heads", "rows"


@dataclass(slots=True, frozen=True)
class RolloutTensor:
    """One tensor of the rollout model; a rank holds, stacked along dim 0, its share of
    each part in order (one part unless fused)."""

    name: str  # vLLM's parameter name
    split: Split
    parts: tuple[Part, ...]
    cols: int  # width of the 2-D view (equal for all parts)
    tail: tuple[int, ...]  # shape[1:] of the rollout tensor ((hidden,) or () for 1-D)
    tower: str
    trainable: bool

    @property
    def group(self) -> str:
        """The parameter class: the name without its layer/block index."""
        return re.sub(r"\.(layers|blocks)\.\d+\.", ".", self.name)

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.param for p in self.parts))


def _p(name: str, shape: tuple[int, ...], tower: str, split: Split, trainable: bool) -> Param:
    return Param(name, shape, tower, split, trainable)


def param_table(spec: ModelSpec) -> list[Param]:
    """Every parameter of transformers' Qwen2.5-VL built from `spec`, in module order."""
    h, hd, kv = spec.hidden_size, spec.head_dim, spec.kv_dim
    v, vt = spec.vision, spec.trainable_vision
    vh, vi = v.hidden_size, v.intermediate_size
    out: list[Param] = []

    def vis(name: str, shape: tuple[int, ...]) -> None:
        out.append(_p(f"model.visual.{name}", shape, "vision", Split.REPLICATED, vt))

    vis("patch_embed.proj.weight", (vh, v.in_channels, v.temporal_patch_size, *[v.patch_size] * 2))
    for b in range(v.depth):
        for n, s in (
            ("norm1.weight", (vh,)),
            ("norm2.weight", (vh,)),
            ("attn.qkv.weight", (3 * vh, vh)),
            ("attn.qkv.bias", (3 * vh,)),
            ("attn.proj.weight", (vh, vh)),
            ("attn.proj.bias", (vh,)),
            ("mlp.gate_proj.weight", (vi, vh)),
            ("mlp.gate_proj.bias", (vi,)),
            ("mlp.up_proj.weight", (vi, vh)),
            ("mlp.up_proj.bias", (vi,)),
            ("mlp.down_proj.weight", (vh, vi)),
            ("mlp.down_proj.bias", (vh,)),
        ):
            vis(f"blocks.{b}.{n}", s)
    m = vh * v.merge_factor
    vis("merger.ln_q.weight", (vh,))
    vis("merger.mlp.0.weight", (m, m))
    vis("merger.mlp.0.bias", (m,))
    vis("merger.mlp.2.weight", (v.out_hidden_size, m))
    vis("merger.mlp.2.bias", (v.out_hidden_size,))

    def llm(name: str, shape: tuple[int, ...], split: Split) -> None:
        out.append(_p(f"model.language_model.{name}", shape, "llm", split, True))

    col, row, rep = Split.COLUMN, Split.ROW, Split.REPLICATED
    llm("embed_tokens.weight", (spec.vocab_size, h), Split.VOCAB)
    for i in range(spec.num_layers):
        for n, s, sp in (
            ("self_attn.q_proj.weight", (spec.num_heads * hd, h), col),
            ("self_attn.q_proj.bias", (spec.num_heads * hd,), col),
            ("self_attn.k_proj.weight", (kv, h), col),
            ("self_attn.k_proj.bias", (kv,), col),
            ("self_attn.v_proj.weight", (kv, h), col),
            ("self_attn.v_proj.bias", (kv,), col),
            ("self_attn.o_proj.weight", (h, spec.num_heads * hd), row),
            ("mlp.gate_proj.weight", (spec.intermediate_size, h), col),
            ("mlp.up_proj.weight", (spec.intermediate_size, h), col),
            ("mlp.down_proj.weight", (h, spec.intermediate_size), row),
            ("input_layernorm.weight", (h,), rep),
            ("post_attention_layernorm.weight", (h,), rep),
        ):
            llm(f"layers.{i}.{n}", s, sp)
    llm("norm.weight", (h,), rep)
    if not spec.tie_word_embeddings:
        out.append(_p("lm_head.weight", (spec.vocab_size, h), "llm", Split.VOCAB, True))
    return out


def torch_rollout_tensors(spec: ModelSpec) -> list[RolloutTensor]:
    """The tensors of the torch rollout (`backends/fsdp/share.py`): transformers' own
    parameters, unfused and under their own names, split by torch's Qwen2 TP plan
    (`parallelize_module`): q/k/v/gate/up (and q/k/v biases) and embed/lm_head
    column-parallel (`Shard(0)`, even splits: torch's chunks have no vocab padding),
    o/down row-parallel (`Shard(1)`), norms and the whole vision tower replicated. A tied
    lm_head is the embedding, as in `param_table`."""
    out: list[RolloutTensor] = []
    for p in param_table(spec):
        units, what, split = p.rows, "rows", p.train_split
        if p.tower == "vision":
            split = Split.REPLICATED
        elif split is Split.VOCAB:
            split, what = Split.COLUMN, "vocab rows"
        elif ".q_proj." in p.name:
            units, what = spec.num_heads, "query heads"
        elif ".k_proj." in p.name or ".v_proj." in p.name:
            units, what = spec.num_kv_heads, "KV heads"
        tail = (p.cols,) if len(p.shape) > 1 else ()
        part = Part(p.name, 0, p.rows, units, False, what)
        out.append(RolloutTensor(p.name, split, (part,), p.cols, tail, p.tower, p.trainable))
    return out


def rollout_tensors(spec: ModelSpec, vision_tp: bool) -> list[RolloutTensor]:
    """vLLM's tensors, each naming the transformers rows it stacks. `vision_tp=False` is
    vLLM's `mm_encoder_tp_mode="data"`: the vision tower is replicated on every rank."""
    hd, v = spec.head_dim, spec.vision
    vh = v.hidden_size
    table = {p.name: p for p in param_table(spec)}
    out: list[RolloutTensor] = []

    def add(name: str, split: Split, parts: list[Part]) -> None:
        first = table[parts[0].param]
        tower = first.tower
        if tower == "vision" and not vision_tp:
            split = Split.REPLICATED
        tail = (first.cols,) if len(first.shape) > 1 else ()
        out.append(
            RolloutTensor(name, split, tuple(parts), first.cols, tail, tower, first.trainable)
        )

    def whole(hf: str) -> Part:
        return Part(hf, 0, table[hf].rows, table[hf].rows)

    pv, vv = "model.visual.", "visual."
    add(f"{vv}patch_embed.proj.weight", Split.REPLICATED, [whole(f"{pv}patch_embed.proj.weight")])
    for b in range(v.depth):
        src, dst = f"{pv}blocks.{b}.", f"{vv}blocks.{b}."
        add(f"{dst}norm1.weight", Split.REPLICATED, [whole(f"{src}norm1.weight")])
        add(f"{dst}norm2.weight", Split.REPLICATED, [whole(f"{src}norm2.weight")])
        for kind in ("weight", "bias"):
            qkv = f"{src}attn.qkv.{kind}"  # transformers keeps it fused as [q; k; v]
            heads = [Part(qkv, i * vh, vh, v.num_heads, what="vision heads") for i in range(3)]
            add(f"{dst}attn.qkv.{kind}", Split.COLUMN, heads)
        add(f"{dst}attn.proj.weight", Split.ROW, [whole(f"{src}attn.proj.weight")])
        add(f"{dst}attn.proj.bias", Split.REPLICATED, [whole(f"{src}attn.proj.bias")])
        for kind in ("weight", "bias"):
            gu = [whole(f"{src}mlp.gate_proj.{kind}"), whole(f"{src}mlp.up_proj.{kind}")]
            add(f"{dst}mlp.gate_up_proj.{kind}", Split.COLUMN, gu)
        add(f"{dst}mlp.down_proj.weight", Split.ROW, [whole(f"{src}mlp.down_proj.weight")])
        add(f"{dst}mlp.down_proj.bias", Split.REPLICATED, [whole(f"{src}mlp.down_proj.bias")])
    add(f"{vv}merger.ln_q.weight", Split.REPLICATED, [whole(f"{pv}merger.ln_q.weight")])
    add(f"{vv}merger.mlp.0.weight", Split.COLUMN, [whole(f"{pv}merger.mlp.0.weight")])
    add(f"{vv}merger.mlp.0.bias", Split.COLUMN, [whole(f"{pv}merger.mlp.0.bias")])
    add(f"{vv}merger.mlp.2.weight", Split.ROW, [whole(f"{pv}merger.mlp.2.weight")])
    add(f"{vv}merger.mlp.2.bias", Split.REPLICATED, [whole(f"{pv}merger.mlp.2.bias")])

    pl, vl = "model.language_model.", "language_model.model."
    add(f"{vl}embed_tokens.weight", Split.VOCAB, [whole(f"{pl}embed_tokens.weight")])
    for i in range(spec.num_layers):
        src, dst = f"{pl}layers.{i}.", f"{vl}layers.{i}."
        for kind in ("weight", "bias"):
            a = f"{src}self_attn."
            parts = [
                Part(
                    f"{a}q_proj.{kind}",
                    0,
                    spec.num_heads * hd,
                    spec.num_heads,
                    False,
                    "query heads",
                ),
                Part(f"{a}k_proj.{kind}", 0, spec.kv_dim, spec.num_kv_heads, True, "KV heads"),
                Part(f"{a}v_proj.{kind}", 0, spec.kv_dim, spec.num_kv_heads, True, "KV heads"),
            ]
            add(f"{dst}self_attn.qkv_proj.{kind}", Split.COLUMN, parts)
        add(f"{dst}self_attn.o_proj.weight", Split.ROW, [whole(f"{src}self_attn.o_proj.weight")])
        gu = [whole(f"{src}mlp.gate_proj.weight"), whole(f"{src}mlp.up_proj.weight")]
        add(f"{dst}mlp.gate_up_proj.weight", Split.COLUMN, gu)
        add(f"{dst}mlp.down_proj.weight", Split.ROW, [whole(f"{src}mlp.down_proj.weight")])
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            add(f"{dst}{n}", Split.REPLICATED, [whole(f"{src}{n}")])
    add(f"{vl}norm.weight", Split.REPLICATED, [whole(f"{pl}norm.weight")])
    if not spec.tie_word_embeddings:  # tied: vLLM's lm_head is embed_tokens itself
        add("language_model.lm_head.weight", Split.VOCAB, [whole("lm_head.weight")])
    return out
