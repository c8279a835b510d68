"""The vision tower's attention over all windows in one varlen call.

`VARLEN` registers torch's varlen flash kernel with transformers' AttentionInterface under
a "flash" name (which routes the tower through `cu_seqlens`), for the vision config only.
Where the kernel cannot run (CPU, float32) it attends window by window with SDPA, exactly as
transformers' non-flash path does.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from rollplex.backends.torch.by_identity import ByIdentity
from rollplex.engine.phases import first_forward

VARLEN = "flash_varlen_torch"  # "flash" in the name: transformers then passes cu_seqlens
_KERNEL_DTYPES = (torch.bfloat16, torch.float16)


def _kernel() -> Any | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch older than the varlen API
        return None
    return varlen_attn


def uses_kernel(x: torch.Tensor) -> bool:
    """The one-call kernel serves `x` (else windows are attended one SDPA call each)."""
    return x.is_cuda and x.dtype in _KERNEL_DTYPES and _kernel() is not None


# cu_seqlens tensor -> its longest window: transformers hands every block of one tower
# forward the same cu_seqlens tensor (one for windows, one for whole images), and releases
# before 5.19 derive the longest window again in each block, a host sync each (32 a
# forward at 7B); this derives it once per tensor.
_LONGEST: ByIdentity[int] = ByIdentity()


@torch.compiler.disable  # host-side bookkeeping; compiled blocks break here, as at int()
def _longest(cu_seqlens: torch.Tensor) -> int:
    return _LONGEST.get_or_make(cu_seqlens, lambda: int((cu_seqlens[1:] - cu_seqlens[:-1]).max()))


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of (1, heads, tokens, dim) q/k/v within the windows `cu_seq_lens_q`
    bounds; returns (1, tokens, heads, dim), as transformers' flash path expects."""
    if cu_seq_lens_q is None or attention_mask is not None or dropout:
        raise ValueError(
            f"{VARLEN} serves the vision tower's windows only (cu_seqlens, no mask, no "
            "dropout); the language model must use another attention implementation"
        )
    cu_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    if uses_kernel(query):
        q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
        longest_q = max_length_q if isinstance(max_length_q, int) else _longest(cu_seq_lens_q)
        longest_k = max_length_k if isinstance(max_length_k, int) else _longest(cu_k)
        cu_q, cu_k = cu_seq_lens_q.to(torch.int32), cu_k.to(torch.int32)
        out = _kernel()(q, k, v, cu_q, cu_k, longest_q, longest_k, scale=scaling)
        return out.unsqueeze(0), None
    bounds = cu_seq_lens_q.tolist()
    outs = [
        F.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], scale=scaling
        ).transpose(1, 2)
        for a, b in itertools.pairwise(bounds)
    ]
    return torch.cat(outs, dim=1), None


AttentionInterface.register(VARLEN, varlen_attention)


def use_varlen_vision(model: torch.nn.Module) -> torch.nn.Module:
    """Route `model`'s vision tower through `varlen_attention` (the LLM keeps its own)."""
    model.config.vision_config._attn_implementation = VARLEN
    return model


def compile_vision_blocks(model: torch.nn.Module) -> torch.nn.Module:
    """torch.compile each vision block in place (parameter names unchanged): with attention
    in one varlen call per block, the rest of a block (rotary, RMSNorm, SwiGLU, residuals at
    1,280 wide) is eager elementwise kernels around small GEMMs; compiled, they fuse. One
    compilation serves all blocks (same code over other parameters) and, with dynamic
    shapes, every batch; the varlen call itself stays an opaque op."""
    tower = getattr(getattr(model, "model", model), "visual", model)
    for block in tower.blocks:
        block.compile(dynamic=True)
    first_forward(tower, "compile vision tower (its first forward)")  # a logged phase
    return model
