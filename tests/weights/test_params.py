"""The parameter table computed from a ModelSpec is transformers' Qwen2.5-VL: the same
names, shapes and tying, built on the meta device (no weights allocated)."""

from __future__ import annotations

import pytest
import torch

from rollplex.specs import MODEL_PRESETS
from rollplex.weights import param_table, rollout_tensors
from tests.weights.conftest import small_spec


def _meta_params(spec) -> dict[str, tuple[int, ...]]:
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(spec.to_hf_config())
    return {n: tuple(p.shape) for n, p in model.named_parameters()}  # tied ones once


@pytest.mark.parametrize("name", ["tiny", "qwen2_5_vl_3b", "qwen2_5_vl_32b"])
def test_table_is_transformers_model(name: str) -> None:
    spec = MODEL_PRESETS[name]
    table = {p.name: p.shape for p in param_table(spec)}
    assert table == _meta_params(spec)
    assert sum(p.numel for p in param_table(spec)) == sum(
        torch.Size(s).numel() for s in table.values()
    )


@pytest.mark.parametrize("tied", [False, True])
def test_rollout_tensors_use_every_parameter_once(tied: bool) -> None:
    spec = small_spec(tied)
    used = [part.param for t in rollout_tensors(spec, vision_tp=True) for part in t.parts]
    assert sorted(set(used)) == sorted(p.name for p in param_table(spec))
    qkv = [t for t in rollout_tensors(spec, True) if t.name.endswith("qkv.weight")]
    assert [p.start for p in qkv[0].parts] == [0, 32, 64]  # one HF tensor, three parts
    names = {t.name for t in rollout_tensors(spec, True)}
    assert ("language_model.lm_head.weight" in names) != tied  # tied: vLLM's lm_head is embed
