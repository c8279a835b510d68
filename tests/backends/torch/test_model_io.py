"""build / save / load: deterministic init, exact round trip, HF-readable files, and clear
errors (that leave the folder untouched) for corrupt or mismatched checkpoints."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import Qwen2_5_VLForConditionalGeneration

from rollplex.backends.torch.full_forward import full_logits
from rollplex.backends.torch.model import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    build_model,
    load_model,
    save_model,
    set_trainable,
)
from rollplex.specs.model import ModelSpec

RESPONSES = torch.tensor([[9, 10, 2], [11, 2, 0]])
LENGTHS = torch.tensor([3, 2])


def _variant(spec: ModelSpec, **changes) -> ModelSpec:
    # Through the constructor (not model_copy), so validation and derived configs are fresh.
    return ModelSpec(**{**spec.model_dump(), **changes})


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return full_logits(model, batch, RESPONSES, LENGTHS, group_size=1)


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_build_is_deterministic_and_leaves_global_rng(spec):
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b, c = build_model(spec, 0), build_model(spec, 0), build_model(spec, 1)
    assert torch.equal(torch.random.get_rng_state(), before)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["lm_head.weight"], sc["lm_head.weight"])


def test_round_trip_identical_logits(spec, batch, tmp_path):
    model = build_model(spec, 0)
    save_model(model, spec, tmp_path)
    assert {CONFIG_FILE, WEIGHTS_FILE} <= {p.name for p in tmp_path.iterdir()}
    loaded = load_model(tmp_path, spec=spec)
    assert all(p.is_leaf and p.requires_grad and not p.is_meta for p in loaded.parameters())
    assert not any(b.is_meta for b in loaded.buffers())  # rotary inv_freq rebuilt
    assert torch.equal(_logits(model, batch), _logits(loaded, batch))
    # Hub names on disk, so transformers' own loader reads the folder too.
    with safe_open(str(tmp_path / WEIGHTS_FILE), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "visual.merger.ln_q.weight" in names
    hf = Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert torch.equal(_logits(model, batch), _logits(hf, batch))


def test_tied_embeddings_round_trip(spec, batch, tmp_path):
    tied = _variant(spec, tie_word_embeddings=True)
    model = build_model(tied, 2)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    save_model(model, tied, tmp_path)
    with safe_open(str(tmp_path / WEIGHTS_FILE), "pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    loaded = load_model(tmp_path, spec=tied)
    assert loaded.lm_head.weight is loaded.get_input_embeddings().weight
    assert torch.equal(_logits(model, batch), _logits(loaded, batch))


@pytest.mark.parametrize("corrupt", ["truncated", "garbage"])
def test_corrupt_weights_raise_and_leave_folder(spec, tmp_path, corrupt):
    save_model(build_model(spec, 0), spec, tmp_path)
    weights = tmp_path / WEIGHTS_FILE
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if corrupt == "truncated" else b"\x07" * 64)
    before = _snapshot(tmp_path)
    with pytest.raises(CheckpointError, match=f"{WEIGHTS_FILE}: not a readable safetensors"):
        load_model(tmp_path)
    assert _snapshot(tmp_path) == before


def test_config_from_another_model_names_the_tensor(spec, tmp_path):
    other = _variant(spec, intermediate_size=192)
    save_model(build_model(other, 0), other, tmp_path / "other")
    ours = tmp_path / "ours"
    save_model(build_model(spec, 0), spec, ours)
    (ours / CONFIG_FILE).write_bytes((tmp_path / "other" / CONFIG_FILE).read_bytes())
    before = _snapshot(ours)
    with pytest.raises(
        CheckpointError,
        match=r"mlp\.gate_proj\.weight has shape \(256, 128\) but config\.json implies "
        r"\(192, 128\)",
    ):
        load_model(ours)
    assert _snapshot(ours) == before


def test_spec_mismatch_names_the_field(spec, tmp_path):
    save_model(build_model(spec, 0), spec, tmp_path)
    with pytest.raises(
        CheckpointError, match=r"vision_config\.depth: config\.json has 2, spec 'tiny' has 3"
    ):
        load_model(tmp_path, spec=_variant(spec, vision={**spec.vision.model_dump(), "depth": 3}))
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match="model_type"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="does not match spec"):
        save_model(build_model(spec, 0), _variant(spec, num_layers=3), tmp_path / "x")


def test_set_trainable_freezes_tower_not_merger(spec):
    model = build_model(spec, 0)
    set_trainable(model, spec)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith("model.visual.") for n in frozen)
    assert not any(".merger." in n for n in frozen)
    set_trainable(model, _variant(spec, trainable_vision=True))
    assert all(p.requires_grad for p in model.parameters())
