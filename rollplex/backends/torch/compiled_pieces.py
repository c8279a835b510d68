"""torch.compile the elementwise pieces of the LLM's decoder layers for the trainer's,
reference's and critic's forwards: each layer's two RMSNorms and its SwiGLU MLP, the final
norm, and shared-prefix attention's log-sum-exp merge.

Those forwards run transformers' layers eagerly, where an RMSNorm is six kernels and as
many autograd nodes; the measured 3B backward left the GPU idle over half its window
(bench/results/gpu_profile/kernels_qwen2_5_vl_3b_rollplex_h100.md). Compiled with dynamic
shapes, one compilation per piece serves every layer (the weights are inputs) and every
width. The decode engine calls the same modules (the rollout aliases the trainer's): under
its own torch.compile, or while it captures a CUDA graph, a piece runs its class's forward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import MethodType
from typing import Any

import torch

from rollplex.engine.phases import first_call
from rollplex.engine.prefix import Model

COMPILED_MERGE = "rollplex_compiled_merge"  # set on each self_attn whose merge is compiled
# torch.compile's backend. The CPU tests set "aot_eager" (dynamo and AOTAutograd, the
# autograd graphs the GPU runs, without Inductor's C++ build: 40 s a cold CI run).
BACKEND = "inductor"


def compile_text_pieces(model: Model) -> Model:
    """Run `model`'s norms and SiLU MLPs compiled (in place; parameter names unchanged, and
    `copy.deepcopy` rebinds them to the copy). A model whose MLP activation is not SiLU keeps
    its MLPs eager."""
    lm = model.model.language_model
    silu = getattr(lm.config, "hidden_act", None) == "silu"
    pieces = [lm.norm]
    for layer in lm.layers:
        pieces += [layer.input_layernorm, layer.post_attention_layernorm]
        pieces += [layer.mlp] if silu else []
        setattr(layer.self_attn, COMPILED_MERGE, True)
    for module in pieces:
        module.forward = MethodType(_forward, module)
    return model


def eager_text_pieces(model: Model) -> Model:
    """Undo `compile_text_pieces` (for A/B measurement)."""
    lm = model.model.language_model
    for module in lm.modules():
        own = vars(module).get("forward")
        if isinstance(own, MethodType) and own.__func__ is _forward:
            del module.forward
        if hasattr(module, COMPILED_MERGE):
            delattr(module, COMPILED_MERGE)
    return model


def _forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    eager = type(self).forward
    if torch.compiler.is_compiling() or (
        torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    ):
        return eager(self, *args, **kwargs)  # the engine's own compile or graph capture
    return _compiled(type(self))(self, *args, **kwargs)


@functools.cache
def _compiled(cls: type) -> Callable[..., Any]:
    compiled = torch.compile(cls.forward, dynamic=True, backend=BACKEND)
    return first_call(compiled, f"compile {cls.__name__}")


def merge_parts(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
    group: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Shared-prefix attention's two parts merged by log-sum-exp (exact): part A over the
    prefix [B, H, G * R, D] (lse [B, H, G * R]), part B over each row's own response
    [N, H, R, D] (lse [N, H, R]), merged in float32; [N, R, H, D] in `dtype` out."""
    n, heads, r, d = out_b.shape
    b = n // group
    out_a, lse_a, out_b, lse_b = (x.float() for x in (out_a, lse_a, out_b, lse_b))
    out_a = out_a.view(b, heads, group, r, d).transpose(1, 2).reshape(n, heads, r, d)
    lse_a = lse_a.view(b, heads, group, r).transpose(1, 2).reshape(n, heads, r)
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a * (lse_a - lse).exp().unsqueeze(-1) + out_b * (lse_b - lse).exp().unsqueeze(-1)
    return out.to(dtype).transpose(1, 2)


@functools.cache
def compiled_merge() -> Callable[..., torch.Tensor]:
    compiled = torch.compile(merge_parts, dynamic=True, backend=BACKEND)
    return first_call(compiled, "compile attention merge")


def merge_for(module: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The merge an attention module runs: compiled where `compile_text_pieces` marked it."""
    return compiled_merge() if getattr(module, COMPILED_MERGE, False) else merge_parts
