"""The decode engine: a static shared-prefix KV cache, CUDA graphs, Triton kernels and an
on-device sampler, over a transformers Qwen2.5-VL. Entry point: `session.DecodeEngine`
(`engine.start(prefix_forward(...), G, R, ...)`, then `advance(k)` / `result()`).
Submodules load on demand, so `phases` and `triton_support` import no torch.
"""
