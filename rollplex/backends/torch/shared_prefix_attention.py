"""Response attention over one prefix K/V per prompt, shared by its G responses (no repeat).

Row b * G + g attends to prompt b's prefix (the G rows' queries folded into one query length,
so the prefix is read once) and causally to its own response, merged by log-sum-exp (exact).
FlexAttention on CUDA, matmul + logsumexp on CPU. It reaches transformers as a `SharedPrefix`
attention mask and a registered dispatcher (`use_shared_prefix`), so checkpoint recompute
sees it. Packed response rows (packed_rows.py) are unpacked to the padded layout for
attention only, and its output packed again.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rollplex.backends.torch.compiled_pieces import merge_for
from rollplex.backends.torch.packed_attention import PackedCausal, packed_causal_attention
from rollplex.backends.torch.packed_rows import PackedRows
from rollplex.engine.phases import first_call

SUFFIX = "+shared_prefix"  # the dispatcher's name is the original implementation's + this


@dataclass(slots=True, eq=False)
class SharedPrefix:
    """What a response forward attends to besides the responses themselves."""

    keys: list[torch.Tensor]  # per decoder layer [B, kv_heads, P, D], one per prompt
    values: list[torch.Tensor]
    prefix_valid: torch.Tensor  # [B, P] bool: the prompt's valid (non-pad) tokens
    response_valid: torch.Tensor  # [N, R] bool: the fed response tokens that are real
    group_size: int  # G rows per prompt: N = B * G
    flex: tuple[Any, Any] | None = None  # CUDA: BlockMasks of part A and part B
    packed: PackedRows | None = None  # the rows arrive packed [1, T]: response_valid's tokens

    @classmethod
    def build(
        cls,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        prefix_valid: torch.Tensor,
        response_valid: torch.Tensor,
        group_size: int,
        flex: bool | None = None,
        packed: bool = False,
    ) -> SharedPrefix:
        """`flex`: attend with compiled FlexAttention (default: when the K/V are on CUDA;
        on CPU flex has neither a backward nor, compiled, an lse). `packed`: the layers run
        on `response_valid`'s tokens packed into one sequence (`packing`)."""
        b, n = prefix_valid.shape[0], response_valid.shape[0]
        if n != b * group_size:
            raise ValueError(f"{n} response rows for {b} prompts x group_size={group_size}")
        keys, values = [k for k, _ in kv], [v for _, v in kv]
        if keys and keys[0].shape[0] != b:
            raise ValueError(f"prefix K/V of {keys[0].shape[0]} rows for {b} prompts")
        prefix_valid = prefix_valid.to(torch.bool)
        response_valid = response_valid.to(torch.bool)
        cuda = bool(keys) and keys[0].is_cuda
        if flex is None:
            flex = cuda
        elif flex and not cuda:
            raise ValueError("SharedPrefix flex=True needs CUDA K/V (CPU flex has no lse)")
        masks = _block_masks(prefix_valid, response_valid, group_size) if flex else None
        packing = PackedRows.of(response_valid) if packed else None
        return cls(keys, values, prefix_valid, response_valid, group_size, masks, packing)

    def masks(self) -> dict[str, SharedPrefix]:
        """The decoder's `attention_mask` argument, keyed by layer type as transformers'
        own mask mapping is (a dict is handed to the layers as is)."""
        return {"full_attention": self, "sliding_attention": self}


def _block_masks(prefix_valid: torch.Tensor, response_valid: torch.Tensor, g: int):
    from torch.nn.attention.flex_attention import create_block_mask

    b, p = prefix_valid.shape
    n, r = response_valid.shape

    def prefix_mod(bi, h, q, kv):
        return prefix_valid[bi, kv]

    def own_mod(ni, h, q, kv):
        return (kv <= q) & response_valid[ni, kv]

    dev = prefix_valid.device
    return (
        create_block_mask(prefix_mod, b, None, g * r, p, device=dev),
        create_block_mask(own_mod, n, None, r, r, device=dev),
    )


def _math_part(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax attention [X, H, Q, D], its lse [X, H, Q]) of q [X, H, Q, D] over k/v
    [X, Hkv, K, D] where `visible` [X, 1, Q or 1, K] holds, in float32. The query heads of
    a K/V head are folded into the query length (transformers' repeat_kv order), so K/V
    are read as they are. Masked scores are finfo.min, not -inf: a row with no visible
    key (an empty response's part B) gets a finite lse that the merge weighs by 0."""
    x, heads, ql, d = q.shape
    kv_heads, kl = k.shape[1], k.shape[2]
    rep = heads // kv_heads
    qf = q.float().reshape(x, kv_heads, rep * ql, d)
    s = (qf @ k.float().transpose(-1, -2) * scale).view(x, kv_heads, rep, ql, kl)
    s = s.masked_fill(~visible.unsqueeze(2), torch.finfo(torch.float32).min)
    lse = s.logsumexp(-1)
    probs = (s - lse.unsqueeze(-1)).exp().view(x, kv_heads, rep * ql, kl)
    out = (probs @ v.float()).view(x, heads, ql, d)
    return out, lse.view(x, heads, ql)


def _flex_part(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    from torch.nn.attention import flex_attention as fa

    kw = dict(block_mask=mask, scale=scale, enable_gqa=True)
    if hasattr(fa, "AuxRequest"):  # torch >= 2.9, where return_lse is deprecated
        out, aux = _flex()(q, k, v, **kw, return_aux=fa.AuxRequest(lse=True))
        return out, aux.lse
    return _flex()(q, k, v, **kw, return_lse=True)  # merge_parts reads them in float32


@functools.cache
def _flex() -> Callable:
    """flex_attention compiled once per process with automatic dynamic shapes: response
    widths, prefix widths and micro-batch rows change from step to step, so after the
    first recompile the kernel takes them as symbols instead of compiling each shape (the
    decode engine's static compile, flex.flex_call, would recompile every step)."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, 64)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 1024)
    # its first call compiles: a logged phase (engine/phases.py)
    return first_call(torch.compile(flex_attention, fullgraph=True), "compile flex attention")


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: SharedPrefix,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q [N, H, R, D] and the rows' own k/v
    [N, Hkv, R, D] (no cache) in, [N, R, H, D] out; packed rows: [1, ., T, D] in and
    [1, T, H, D] out."""
    if dropout or sliding_window:
        raise ValueError(
            "shared-prefix attention has no dropout or sliding window "
            f"(attention_dropout={dropout}, sliding_window={sliding_window})"
        )
    shared = attention_mask
    packing = shared.packed
    if packing is not None:  # [1, H, T, D] -> [N, H, R, D], zeros at the padding
        query, key, value = (
            packing.unpack(x.transpose(1, 2)).transpose(1, 2) for x in (query, key, value)
        )
    n, heads, r, d = query.shape
    g = shared.group_size
    b = n // g
    scale = d**-0.5 if scaling is None else scaling
    pk, pv = shared.keys[module.layer_idx], shared.values[module.layer_idx]
    # part A: the G rows of a prompt as one query sequence over its prefix
    qa = query.view(b, g, heads, r, d).transpose(1, 2).reshape(b, heads, g * r, d)
    if shared.flex is not None:
        out_a, lse_a = _flex_part(qa, pk, pv, shared.flex[0], scale)
        out_b, lse_b = _flex_part(query, key, value, shared.flex[1], scale)
    else:
        out_a, lse_a = _math_part(qa, pk, pv, shared.prefix_valid[:, None, None, :], scale)
        causal = torch.ones(r, r, dtype=torch.bool, device=query.device).tril()
        own = causal[None, None] & shared.response_valid[:, None, None, :]
        out_b, lse_b = _math_part(query, key, value, own, scale)
    out = merge_for(module)(out_a, lse_a, out_b, lse_b, g, query.dtype)
    return (out.contiguous() if packing is None else packing.pack(out)), None


def _dispatcher(base: str) -> Callable:
    def attention(module, query, key, value, attention_mask, **kwargs):
        if isinstance(attention_mask, SharedPrefix):
            return shared_prefix_attention(module, query, key, value, attention_mask, **kwargs)
        if isinstance(attention_mask, PackedCausal):
            return packed_causal_attention(module, query, key, value, attention_mask, **kwargs)
        eager = sys.modules[type(module).__module__].eager_attention_forward
        inner = ALL_ATTENTION_FUNCTIONS.get(base, eager)
        return inner(module, query, key, value, attention_mask, **kwargs)

    return attention


def use_shared_prefix(model: torch.nn.Module) -> str:
    """Route `model`'s language-model attention through the dispatcher (idempotent): a
    `SharedPrefix` mask gets `shared_prefix_attention`, a `PackedCausal` one
    `packed_causal_attention` (packed_attention.py), any other mask the implementation
    the model had, whose mask builder is registered under the new name as well. Returns
    the implementation name now in use."""
    config = model.model.language_model.config
    base = config._attn_implementation or "eager"
    if base.endswith(SUFFIX):
        return base
    name = base + SUFFIX
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, _dispatcher(base))
        if base in ALL_MASK_ATTENTION_FUNCTIONS:
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    config._attn_implementation = name
    return name
