"""One decode forward over the static cache, on the model's own modules and weights.

The G rows of a prompt enter the decoder as one sequence of G tokens (batch = prompts),
so every projection, norm, MLP, the rotary embedding and the LM head are transformers'
module calls on [prompts, G, hidden]. Only the attention call differs from
`Qwen2_5_VLAttention.forward`: its K/V go into the shared-prefix cache (cache.py) instead
of a transformers Cache, and attention runs over the whole group at once:
- "flex" (the CUDA default): FlexAttention's split-KV decoding kernel (flex.py);
- "sdpa": SDPA with the query heads of each K/V head folded into the query length.
  transformers' own SDPA path would `repeat_kv` the whole cache for GQA whenever a mask is
  given (on CUDA), reading it `heads / kv_heads` times over; the fold reads it once.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from rollplex.backends.torch.engine import flex
from rollplex.backends.torch.engine.cache import SharedPrefixKV


def _rotary(attn: torch.nn.Module, q, k, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary application, from the module that defines this attention class.
    Releases that select the M-RoPE sections inside the rotary embedding (5.19) export
    `apply_rotary_pos_emb`; those that select them at application time export
    `apply_multimodal_rotary_pos_emb(..., mrope_section)` and get cos/sin per axis."""
    module = sys.modules[type(attn).__module__]
    multimodal = getattr(module, "apply_multimodal_rotary_pos_emb", None)
    if multimodal is None:
        return module.apply_rotary_pos_emb(q, k, cos, sin)
    rope = getattr(attn.config, "rope_parameters", None) or attn.config.rope_scaling
    return multimodal(q, k, cos, sin, rope["mrope_section"])


def _attention(
    attn: torch.nn.Module,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: SharedPrefixKV,
    layer: int,
    slots: torch.Tensor,
    kv_len: int,
) -> torch.Tensor:
    b, g, _ = x.shape
    d = attn.head_dim
    q = attn.q_proj(x).view(b, g, -1, d).transpose(1, 2)  # [B, H, G, D]
    k = attn.k_proj(x).view(b, g, -1, d).transpose(1, 2)  # [B, Hkv, G, D]
    v = attn.v_proj(x).view(b, g, -1, d).transpose(1, 2)
    q, k = _rotary(attn, q, k, cos, sin)
    cache.write(layer, k, v, slots)
    heads, kv_heads = q.shape[1], k.shape[1]
    scale = getattr(attn, "scaling", d**-0.5)
    if cache.flex is not None:
        out = flex.attend(q, cache.keys[layer], cache.values[layer], cache.flex, scale)
        return attn.o_proj(out.transpose(1, 2).reshape(b, g, heads * d))
    # Query head j * rep + r reads K/V head j (transformers' repeat_kv order): fold r into
    # the query length, as rows r * G + g.
    q = q.reshape(b, kv_heads, (heads // kv_heads) * g, d)
    out = F.scaled_dot_product_attention(
        q,
        cache.keys[layer][:, :, :kv_len],
        cache.values[layer][:, :, :kv_len],
        attn_mask=cache.mask[..., :kv_len],
        scale=scale,
    )
    # reshape, not view: a CUDA kernel may return the heads strided inside the query dim
    out = out.reshape(b, heads, g, d).transpose(1, 2).reshape(b, g, heads * d)
    return attn.o_proj(out)


def decode_logits(
    model: torch.nn.Module,
    cache: SharedPrefixKV,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    step: torch.Tensor,
    kv_len: int,
) -> torch.Tensor:
    """Logits [rows, V] of `tokens` [rows] (rows = prompts * G, prompt-major) at text
    positions `positions` [rows], as response step `step` (a device tensor [1]); their K/V
    are written into `cache`, whose mask must already have this step open."""
    lm = model.model.language_model
    b, g = cache.prompts, cache.group_size
    h = lm.embed_tokens(tokens).view(b, g, -1)
    # Response tokens are text: the same position on all three M-RoPE axes.
    cos, sin = lm.rotary_emb(h, positions.view(1, b, g).expand(3, b, g))
    slots = cache.slots(step)
    for i, layer in enumerate(lm.layers):
        h = h + _attention(
            layer.self_attn, layer.input_layernorm(h), cos, sin, cache, i, slots, kv_len
        )
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(lm.norm(h)).view(b * g, -1)
