"""Totals over the real model sizes: one GPU shares everything, the grid adds up to the
parameter bytes, no GPU shares more than it stores, and 72B is counted fast."""

from __future__ import annotations

import time

import pytest

from rollplex.specs import MODEL_PRESETS
from rollplex.specs.weights import WeightsSpec
from rollplex.weights import build_sharing, param_table, tally
from rollplex.weights.params import VOCAB_PAD

SIZES = ["qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen2_5_vl_32b", "qwen2_5_vl_72b"]


@pytest.mark.parametrize("name", SIZES)
def test_one_gpu_shares_everything(name: str) -> None:
    report = tally(build_sharing(MODEL_PRESETS[name], WeightsSpec()))
    s = report.summary()
    assert s["shared_fraction"] == 1.0
    assert s["rebuild_bytes_per_gpu"] == 0
    assert s["full_copy_bytes_per_gpu"] == s["param_bytes"] == MODEL_PRESETS[name].param_count() * 2


def replica_bytes(spec, tp: int, vision_tp: bool) -> int:
    """A rollout replica's bytes, counted by hand: every parameter once, plus the copies
    vLLM keeps: replicated tensors on every rank, KV heads repeated past the KV count,
    vocab rows padded to 64."""
    total = 0
    for p in param_table(spec):
        n = p.numel * 2
        vision = p.name.startswith("model.visual.")
        norm = p.name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight"))
        whole = ("attn.proj.bias", "down_proj.bias", "mlp.2.bias", "patch_embed.proj.weight")
        replicated = norm or (vision and (p.name.endswith(whole) or not vision_tp))
        if replicated:
            n *= tp
        elif p.name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            n = n * max(tp, spec.num_kv_heads) // spec.num_kv_heads
        elif p.name.endswith(("embed_tokens.weight", "lm_head.weight")):
            padded = -(-spec.vocab_size // VOCAB_PAD) * VOCAB_PAD
            n = padded * spec.hidden_size * 2
        total += n
    return total


@pytest.mark.parametrize("fsdp", [8, 16, 32])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_grid_adds_up_to_the_parameters(fsdp: int, tp: int) -> None:
    spec = MODEL_PRESETS["qwen2_5_vl_32b"]
    sharing = build_sharing(spec, WeightsSpec(train_fsdp=fsdp, rollout_tp=tp))
    report = tally(sharing)
    replicas = fsdp // tp
    full = sum(t.full for t in report.per_gpu)
    assert full == replicas * replica_bytes(spec, tp, sharing.rollout.vision_tp)
    assert sum(t.shared + t.rebuild for t in report.per_gpu) == full
    assert sum(t.full for t in report.per_class.values()) == full
    for g, t in enumerate(report.per_gpu):
        assert t.shared <= t.local <= t.full
        assert t.shared <= sharing.train_bytes(g)  # a training byte is shared at most once
    # a GPU holds 1/fsdp of each tensor and needs 1/tp of it: the bound of local sharing
    assert report.summary()["shared_fraction"] <= min(1.0, tp / fsdp) + 0.02


def test_auto_rank_map_is_at_least_as_good_as_vllms_default() -> None:
    spec = MODEL_PRESETS["qwen2_5_vl_32b"]
    got = {}
    for rank_map in ("auto", "contiguous"):
        ws = WeightsSpec(train_fsdp=8, rollout_tp=4, rank_map=rank_map)
        got[rank_map] = tally(build_sharing(spec, ws)).summary()["shared_fraction"]
    assert got["auto"] >= got["contiguous"]
    assert got["auto"] == pytest.approx(0.5, abs=0.01)  # FSDP chunk = half a rollout shard


def test_72b_on_64_gpus_is_counted_in_under_two_seconds() -> None:
    # CPU time of this process: other jobs on the shared cores do not count
    start = time.process_time()
    ws = WeightsSpec(train_fsdp=8, train_tp=8, rollout_tp=4)
    tally(build_sharing(MODEL_PRESETS["qwen2_5_vl_72b"], ws)).summary()
    assert time.process_time() - start < 2.0
