"""One decode forward over the static cache, on the model's own modules and weights: the G
rows of a prompt enter as one sequence of G tokens, so projections, norms, MLP, rotary and
LM head are transformers' calls on [prompts, G, hidden], except the q/k/v projections (one
GEMM, fused_qkv.py) and attention (into and over the shared-prefix cache, attention.py)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from rollplex.engine.attention import attend_shared
from rollplex.engine.cache import SharedPrefixKV
from rollplex.engine.fused_qkv import FusedQKV
from rollplex.engine.phases import first_call
from rollplex.engine.sampling import next_tokens
from rollplex.engine.skinny import (
    MAX_ROWS,
    SPLIT_MAX_ROWS,
    SPLITS,
    skinny_gate_up,
    skinny_linear,
    skinny_partials,
    split_linear,
    sum_partials,
)


def rotary_fn(attn: torch.nn.Module) -> Callable:
    """transformers' rotary application, from the module that defines this attention class.
    Releases that select the M-RoPE sections inside the rotary embedding (5.19) export
    `apply_rotary_pos_emb`; those that select them at application time export
    `apply_multimodal_rotary_pos_emb(..., mrope_section)` and get cos/sin per axis."""
    module = sys.modules[type(attn).__module__]
    multimodal = getattr(module, "apply_multimodal_rotary_pos_emb", None)
    if multimodal is None:
        return module.apply_rotary_pos_emb
    rope = getattr(attn.config, "rope_parameters", None) or attn.config.rope_scaling
    return functools.partial(multimodal, mrope_section=rope["mrope_section"])


def keep_column(kept: torch.Tensor, step: torch.Tensor, h: torch.Tensor) -> None:
    """`h` [B, G, H] into column `step` (a device tensor [1]) of `kept` [rows, W, H]: the
    index is read on the device, so the write is captured into a CUDA graph like the
    cache's. Only the first `rows` (the real ones) are kept: padding rows come last."""
    kept.index_copy_(1, step, h.reshape(-1, 1, h.shape[-1])[: kept.shape[0]])


class DecodeStep:
    """One decode forward of `model` over a shared-prefix cache.

    Each decoder layer runs as three pieces: `before` (the previous layer's MLP residual,
    input norm, q/k/v projections, rotary), the cache write and the attention, `after`
    (output projection, residual, post norm, MLP); `last` adds the last MLP residual in the
    final norm. With `compile` (the CUDA default) the three are torch.compile'd (`before`
    twice: the first layer has no residual to add): a decode step is bound by per-kernel
    latency more than by bandwidth once it is a CUDA graph (eager norms, rotary and
    activations are ~30 small kernels a layer), and fusing them leaves the GEMMs and a few
    fused kernels. One compilation
    serves every layer (transformers' layers are the same code over other parameters) and,
    compiled with dynamic shapes, every row bucket. The cache write stays outside: an
    in-place scatter into a graph input is the one thing not to leave to the compiler.
    `compile` may name a torch.compile mode instead ("max-autotune-no-cudagraphs": Inductor
    times Triton GEMM templates against cuBLAS for each row bucket's skinny GEMMs); a mode
    compiles each bucket's shapes statically, which is what its autotuning is for.
    With `fused_qkv` (the default) the q/k/v projections are one GEMM over `FusedQKV`'s
    stacked copy of their weights. The draw (sampling.next_tokens) is compiled with the
    layers unless `compile_sampler` says otherwise. With `skinny` (CUDA with Triton) steps of
    at most skinny.MAX_ROWS rows run the MLP's gate, up and SiLU as one skinny.py kernel and
    the LM head on its weight-streaming GEMM, the two places it beat cuBLAS on an H200; the
    other projections stay on cuBLAS. With `split_kernel` a cache laid out for "split"
    attention is attended on split_kernel.py's two Triton kernels, and with
    `kernel_writes_kv` (the engine's default with them: 1.00-1.06x faster per step on an
    H200, bench/results/gpu_decode/fusion.md) those kernels also
    write the step's K/V into the cache, two launches a layer fewer."""

    def __init__(
        self,
        model: torch.nn.Module,
        compile: bool | str,
        fused_qkv: bool = True,
        compile_sampler: bool | None = None,
        skinny: bool = False,
        split_kernel: bool = False,
        kernel_writes_kv: bool = False,
        split_gemm: bool = False,
    ) -> None:
        if kernel_writes_kv and not split_kernel:
            raise ValueError("kernel_writes_kv needs split_kernel (its kernel does the write)")
        self.model = model
        self.skinny = skinny
        self.split_gemm = split_gemm
        self.split_kernel = split_kernel
        self.kernel_writes_kv = kernel_writes_kv
        silu = model.config.text_config.hidden_act == "silu"  # what skinny_gate_up computes
        lm = model.model.language_model
        self.rotary = rotary = rotary_fn(lm.layers[0].self_attn)
        self.fused = FusedQKV(lm.layers) if fused_qkv else None
        widths = self.fused.widths if self.fused is not None else ()

        def few(x: torch.Tensor) -> bool:  # guards of the compiled pieces: three graphs at most
            return skinny and x.shape[0] * x.shape[1] <= MAX_ROWS

        def narrow(x: torch.Tensor) -> bool:
            return split_gemm and x.shape[0] * x.shape[1] <= SPLIT_MAX_ROWS

        def settle(h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
            """The last layer's MLP residual added to `h`. Split, it comes as the down
            projection's float32 partials [SPLITS, B, G, H], summed here, inside the norm's
            kernel (SPLITS is a constant, so the adds are unrolled)."""
            if delta.dim() == 4:
                delta = sum_partials(delta.view(SPLITS, *h.shape)).to(h.dtype)
            return h + delta

        def before(layer, h, delta, cos, sin, weight=None, bias=None):
            if delta is not None:  # the last layer's MLP residual, added beside this norm
                h = settle(h, delta)
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            b, g, _ = x.shape
            d = attn.head_dim
            if weight is None:
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            else:
                q, k, v = F.linear(x, weight, bias).split(widths, dim=-1)
            q = q.reshape(b, g, -1, d).transpose(1, 2)  # [B, H, G, D]
            k = k.reshape(b, g, -1, d).transpose(1, 2)  # [B, Hkv, G, D]
            v = v.reshape(b, g, -1, d).transpose(1, 2)
            q, k = rotary(q, k, cos, sin)
            return h, q, k, v

        def after(layer, h, out):
            """(the residual stream after attention, the MLP's output): the next piece adds
            them in its norm's kernel (before, or last), one launch a layer fewer."""
            o = layer.self_attn.o_proj
            h = h + (split_linear(out, o.weight, o.bias, SPLITS) if narrow(out) else o(out))
            x = layer.post_attention_layernorm(h)
            mlp = layer.mlp
            fused_act, split = silu and few(x), narrow(x) and mlp.down_proj.bias is None
            if not (fused_act or split):
                return h, mlp(x)
            if fused_act:
                act = skinny_gate_up(x, mlp.gate_proj.weight, mlp.up_proj.weight)
            else:
                act = mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)  # as Qwen2MLP.forward
            if split:  # summed in the next piece's norm (settle)
                return h, skinny_partials(act, mlp.down_proj.weight, SPLITS).view(-1, *h.shape)
            return h, mlp.down_proj(act)

        def last(norm, h, delta):
            return norm(settle(h, delta))

        def last_kept(norm, h, delta):
            """`last`, also returning the final norm's input (decode once keeps it)."""
            x = settle(h, delta)
            return x, norm(x)

        self.compiled = bool(compile)
        choose = next_tokens
        if compile:
            mode = compile if isinstance(compile, str) else None
            kw = {"dynamic": True} if mode is None else {"dynamic": False, "mode": mode}
            # each piece's first call compiles it: a logged phase (phases.py)
            before = first_call(torch.compile(before, **kw), "compile decode layer (before)")
            after = first_call(torch.compile(after, **kw), "compile decode layer (after)")
            last = first_call(torch.compile(last, **kw), "compile decode final norm")
            last_kept = first_call(torch.compile(last_kept, **kw), "compile decode norm (kept)")
        if bool(compile) if compile_sampler is None else compile_sampler:
            # the draw: ~40 small kernels over [rows] and [rows, vocab] eagerly
            choose = first_call(torch.compile(next_tokens, dynamic=True), "compile sampler")
        self.before, self.after, self.last, self.choose = before, after, last, choose
        self.last_kept = last_kept

    def __call__(
        self,
        cache: SharedPrefixKV,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        step: torch.Tensor,
        kv_len: int,
        kept: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [rows, V] of `tokens` [rows] (rows = prompts * G, prompt-major) at text
        positions `positions` [rows], as response step `step` (a device tensor [1]); their
        K/V are written into `cache`, whose mask must already have this step open. With
        `kept` [layers, rows, W, H] (decode once) each layer's output goes into column
        `step` (`keep_column`), the last one's being the final norm's input."""
        model = self.model
        lm = model.model.language_model
        b, g = cache.prompts, cache.group_size
        h = lm.embed_tokens(tokens).view(b, g, -1)
        # Response tokens are text: the same position on all three M-RoPE axes.
        cos, sin = lm.rotary_emb(h, positions.view(1, b, g).expand(3, b, g))
        slots = cache.slots(step)
        delta = None
        for i, layer in enumerate(lm.layers):
            h, q, k, v = self.before(layer, h, delta, cos, sin, *self.projection(i))
            if kept is not None and i:  # `before` returned layer i's input: i - 1's output
                keep_column(kept[i - 1], step, h)
            out = self.attend(cache, i, layer, q, k, v, slots, kv_len)
            h, delta = self.after(layer, h, out)
        if kept is None:
            h = self.last(lm.norm, h, delta)
        else:
            final, h = self.last_kept(lm.norm, h, delta)
            keep_column(kept[-1], step, final)
        if self.skinny and b * g <= MAX_ROWS:
            return skinny_linear(h, model.lm_head.weight, model.lm_head.bias).view(b * g, -1)
        return model.lm_head(h).view(b * g, -1)

    def attend(
        self,
        cache: SharedPrefixKV,
        i: int,
        layer: torch.nn.Module,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        slots: torch.Tensor,
        kv_len: int,
    ) -> torch.Tensor:
        """Layer i's step K/V into the cache and its attention over it: [B, G, H * D]."""
        in_kernel = self.kernel_writes_kv and cache.split is not None
        if not in_kernel:
            cache.write(i, k, v, slots)
        new_kv = (k, v) if in_kernel else None
        return attend_shared(layer.self_attn, q, cache, i, kv_len, self.split_kernel, new_kv)

    def projection(self, layer: int) -> tuple[torch.Tensor, torch.Tensor | None] | tuple[()]:
        """Layer `layer`'s stacked q/k/v weight and bias, or nothing when not fused."""
        if self.fused is None:
            return ()
        return self.fused.weights[layer], self.fused.biases[layer]
