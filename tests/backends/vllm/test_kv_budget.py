"""The engine's KV cache is the plan's pool (backends/vllm/build.kv_budget); no vLLM needed."""

from __future__ import annotations

from rollplex.backends.vllm.build import kv_budget
from rollplex.specs import MODEL_PRESETS
from rollplex.specs.vllm import VllmSpec

M3B = MODEL_PRESETS["qwen2_5_vl_3b"]  # bf16: the plan sizes pools in 2-byte K/V


def test_no_plan_keeps_the_spec():
    spec = VllmSpec(kv_cache_bytes=3 << 30)
    assert kv_budget(M3B, spec, None) == 3 << 30


def test_plan_pool_is_passed_in_the_engine_dtype():
    planned = 10 << 30
    assert kv_budget(M3B, VllmSpec(dtype="bfloat16"), planned) == planned
    assert kv_budget(M3B, VllmSpec(dtype="float32"), planned) == 2 * planned


def test_never_below_one_max_model_len_sequence():
    spec = VllmSpec(dtype="bfloat16", max_model_len=4096)
    one_sequence = 2 * 4096 * M3B.kv_bytes_per_token()  # with vLLM's layout margin
    assert kv_budget(M3B, spec, 1 << 20) == one_sequence
    assert kv_budget(M3B, spec, one_sequence + 1) == one_sequence + 1
