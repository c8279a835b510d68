"""PromptRenderer: chat template, placeholder expansion, image and video pixels."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    smart_resize as hf_smart_resize,
)

from rollplex.backends.torch.tokenizer import build_image_processor
from rollplex.data import Sample
from rollplex.data.prompts import collate_prompts
from rollplex.data.render import PromptRenderer, RenderError, smart_resize
from rollplex.specs.model import MODEL_PRESETS

SPEC = MODEL_PRESETS["tiny"]


def _image(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _renderer(tokenizer, processor, **kw) -> PromptRenderer:
    return PromptRenderer(tokenizer, processor, SPEC, **kw)


def _runs(ids: list[int], token: int) -> list[int]:
    """Lengths of the runs of `token` in ids."""
    runs, n = [], 0
    for i in [*ids, -1]:
        if i == token:
            n += 1
        elif n:
            runs, n = [*runs, n], 0
    return runs


def test_image_placeholder_expands_in_place(tokenizer, processor):
    st = SPEC.special_tokens
    img = _image(100, 60, 0)
    r = _renderer(tokenizer, processor, template="Q: {problem} Answer briefly.")
    p = r.encode(Sample("s:0", "What colour is <image> the shape?", "red", images=(img,)))
    ids = p.input_ids.tolist()
    want = processor(images=img, return_tensors="pt")
    assert torch.equal(p.pixel_values, want["pixel_values"])
    assert torch.equal(p.image_grid_thw, want["image_grid_thw"])
    n = int(p.image_grid_thw.prod()) // 4
    assert _runs(ids, st.image_token_id) == [n]
    # The chat text, with the pad run collapsed to one, is the chat template's rendering.
    collapsed = [i for k, i in enumerate(ids) if i != st.image_token_id or ids[k - 1] != i]
    text = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Q: What colour is <|vision_start|><|image_pad|><|vision_end|> the shape? "
        "Answer briefly.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(collapsed) == text
    start = ids.index(st.image_token_id)
    assert ids[start - 1] == st.vision_start_token_id
    assert ids[start + n] == st.vision_end_token_id
    assert p.mm_token_type_ids.tolist() == [int(i == st.image_token_id) for i in ids]
    assert p.video_grid_thw is None and p.pixel_values_videos is None


def test_no_placeholder_puts_visuals_first_and_system_prompt(tokenizer, processor):
    st = SPEC.special_tokens
    imgs = (_image(56, 56, 1), _image(28, 84, 2))
    r = _renderer(tokenizer, processor, system_prompt="Be brief.")
    p = r.encode(Sample("s:1", "What colour is the shape?", "red", images=imgs))
    text = tokenizer.decode(p.input_ids.tolist())
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert text.index("<|vision_end|>") < text.index("What colour")
    grids = p.image_grid_thw.tolist()
    assert grids == [[1, 4, 4], [1, 6, 2]]  # in sample order, each at its own size
    assert _runs(p.input_ids.tolist(), st.image_token_id) == [4, 3]


def test_max_pixels_bounds_images(tokenizer, processor):
    small = _renderer(tokenizer, processor, max_pixels=28 * 28)
    p = small.encode(Sample("s:2", "<image>", "x", images=(_image(112, 112, 3),)))
    assert p.image_grid_thw.tolist() == [[1, 2, 2]]  # one merged token
    with pytest.raises(RenderError, match="below one merged token"):
        _renderer(tokenizer, processor, max_pixels=100)


def test_video_frames_pad_to_temporal_patch_and_expand(tokenizer, processor):
    st = SPEC.special_tokens
    frames = tuple(_image(60, 60, 10 + k) for k in range(3))
    r = _renderer(tokenizer, processor, video_max_pixels=56 * 56, video_fps=4.0)
    p = r.encode(Sample("s:3", "Where does it move? <video>", "left", video=frames))
    assert p.video_grid_thw.tolist() == [[2, 4, 4]]  # 3 frames -> 4 -> 2 temporal patches
    assert p.pixel_values_videos.shape == (32, 3 * 2 * 14 * 14)
    torch.testing.assert_close(p.second_per_grid_ts, torch.tensor([0.5]))  # 2 / 4 fps
    assert _runs(p.input_ids.tolist(), st.video_token_id) == [8]
    assert p.mm_token_type_ids.tolist() == [
        2 * int(i == st.video_token_id) for i in p.input_ids.tolist()
    ]
    assert p.pixel_values is None and p.image_grid_thw is None
    # The padding frame repeats the last one: the second temporal patch's two slots agree.
    last = p.pixel_values_videos[16:].view(16, 3, 2, 14, 14)
    assert torch.equal(last[:, :, 0], last[:, :, 1])


def test_video_of_one_repeated_image_matches_the_image_processor(tokenizer, processor):
    img = _image(56, 56, 4)
    r = _renderer(tokenizer, processor, video_max_pixels=56 * 56)
    p = r.encode(Sample("s:4", "<video>", "x", video=(img, img)))
    want = processor(images=img, return_tensors="pt")
    assert torch.equal(p.video_grid_thw, want["image_grid_thw"])
    assert torch.equal(p.pixel_values_videos, want["pixel_values"])


def test_video_layout_is_qwens(tokenizer, processor):
    """Two different frames against Qwen's documented video patch layout, written out
    from transformers' Qwen2-VL video processor on normalised frames."""
    frames = (_image(56, 84, 5), _image(56, 84, 6))
    r = _renderer(tokenizer, processor, video_max_pixels=56 * 84)
    p = r.encode(Sample("s:5", "<video>", "x", video=frames))
    mean = np.array(processor.image_mean)[:, None, None]
    std = np.array(processor.image_std)[:, None, None]
    x = np.stack([(np.asarray(f).transpose(2, 0, 1) / 255.0 - mean) / std for f in frames])
    t, c, h, w = x.shape
    ps, m, tp = 14, 2, 2
    x = x.reshape(t // tp, tp, c, h // ps // m, m, ps, w // ps // m, m, ps)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(-1, c * tp * ps * ps)
    assert p.video_grid_thw.tolist() == [[1, 6, 4]]
    torch.testing.assert_close(
        p.pixel_values_videos, torch.from_numpy(x).float(), atol=1e-5, rtol=0
    )


def test_video_size_follows_qwen_vl_utils(tokenizer, processor):
    r = _renderer(tokenizer, processor)
    # qwen-vl-utils' bounds: at least 128 merged tokens per frame, at most 768.
    h, w = r.video_size(64, 64, 8)
    assert h % 28 == 0 and w % 28 == 0 and 128 * 784 <= h * w <= 768 * 784
    assert r.video_size(448, 896, 8) == hf_smart_resize(448, 896, 28, 128 * 784, 768 * 784)
    capped = _renderer(tokenizer, processor, video_max_pixels=84 * 84)
    assert capped.video_size(64, 64, 8) == (84, 84)
    for hw in [(60, 100), (333, 500), (1080, 1920)]:
        assert smart_resize(*hw, 28, 784, 12544) == hf_smart_resize(*hw, 28, 784, 12544)


def test_mixed_batch_collates(tokenizer, processor):
    r = _renderer(tokenizer, processor, video_max_pixels=56 * 56)
    samples = [
        Sample("a", "<video> move?", "left", video=(_image(56, 56, 7),) * 4),
        Sample("b", "colour?", "red", images=(_image(56, 56, 8), _image(28, 28, 9))),
        Sample("c", "just text", "x"),
    ]
    batch = r.encode_batch(samples)
    assert batch.image_counts.tolist() == [0, 2, 0] and batch.video_counts.tolist() == [1, 0, 0]
    assert batch.patches_per_prompt() == [32, 16 + 4, 0]
    assert batch.image_grid_thw.tolist() == [[1, 4, 4], [1, 2, 2]]
    assert batch.video_grid_thw.tolist() == [[2, 4, 4]]
    sel = batch.select(1, 3)
    assert sel.video_grid_thw.shape == (0, 3) and sel.pixel_values.shape[0] == 20
    rep = batch.repeat(2)
    assert rep.video_counts.tolist() == [1, 1, 0, 0, 0, 0]
    assert rep.pixel_values_videos.shape[0] == 64 and rep.second_per_grid_ts.shape == (2,)
    values, grids, counts = batch.visual_rows()
    assert counts == [1, 2, 0] and grids.tolist() == [[2, 4, 4], [1, 4, 4], [1, 2, 2]]
    assert torch.equal(values[:32], batch.pixel_values_videos)
    assert torch.equal(values[32:], batch.pixel_values)


@pytest.mark.parametrize("kind", ["video", "images"])
def test_one_modality_batch_gives_its_pixels_without_a_copy(tokenizer, processor, kind):
    r = _renderer(tokenizer, processor, video_max_pixels=56 * 56)
    if kind == "video":
        samples = [
            Sample(f"v{i}", "<video> move?", "left", video=(_image(56, 56, i),) * 4)
            for i in range(3)
        ]
    else:
        samples = [
            Sample(f"i{i}", "<image> colour?", "red", images=(_image(56, 56, i),)) for i in range(3)
        ]
    batch = r.encode_batch([*samples, Sample("t", "just text", "x")])
    own = batch.pixel_values_videos if kind == "video" else batch.pixel_values
    grid = batch.video_grid_thw if kind == "video" else batch.image_grid_thw
    values, grids, counts = batch.visual_rows()
    assert counts == [1, 1, 1, 0]
    assert values.data_ptr() == own.data_ptr() and torch.equal(grids, grid)


@pytest.mark.parametrize(
    ("sample", "match"),
    [
        (Sample("u:1", "<image> and <image>", "x", images=(_image(28, 28, 0),)), "placeholders"),
        (Sample("u:2", "<image>", "x"), "placeholders"),
        (
            Sample("u:3", "x", "x", images=(_image(28, 28, 0),), video=(_image(28, 28, 0),)),
            "one kind",
        ),
        (Sample("u:4", "x", "x", video=(_image(28, 28, 0), _image(56, 28, 0))), "differ in size"),
        (Sample("u:5", "x", "x", video=()), "no frames"),
    ],
)
def test_bad_samples_name_the_sample(tokenizer, processor, sample, match):
    with pytest.raises(RenderError, match=f"{sample.uid!r}.*{match}|{match}.*{sample.uid!r}"):
        _renderer(tokenizer, processor).encode(sample)


def test_bad_settings(tokenizer, processor):
    with pytest.raises(RenderError, match="problem"):
        _renderer(tokenizer, processor, template="no slot")
    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(RenderError, match="chat_template"):
        PromptRenderer(bare, processor, SPEC)
    other = build_image_processor(
        SPEC.model_copy(update={"vision": SPEC.vision.model_copy(update={"patch_size": 7})})
    )
    with pytest.raises(RenderError, match="patch"):
        PromptRenderer(tokenizer, other, SPEC)
    # A template that does not render image parts is caught, not silently mis-expanded.
    plain = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(RenderError, match="pad ids"):
        PromptRenderer(plain, processor, SPEC).encode(
            Sample("u:6", "x", "x", images=(_image(28, 28, 0),))
        )


def test_collate_refuses_inconsistent_prompts(tokenizer, processor):
    r = _renderer(tokenizer, processor)
    p = r.encode(Sample("v", "<image>", "x", images=(_image(28, 28, 0),)))
    with pytest.raises(ValueError, match="prompt 0: image grids hold 4 patches, pixels 3"):
        collate_prompts([replace(p, pixel_values=p.pixel_values[:3])], pad_id=0)
    with pytest.raises(ValueError, match="prompt 1: holds images and a video"):
        collate_prompts(
            [p, replace(p, pixel_values_videos=p.pixel_values, video_grid_thw=p.image_grid_thw)], 0
        )


def test_renders_the_synthetic_sources(tokenizer, processor):
    """Samples of the data sources render: image prompts at the image's size, video
    prompts with one temporal patch per two frames."""
    from rollplex.data import build_source
    from rollplex.specs.data import DataSpec

    r = _renderer(tokenizer, processor, max_pixels=84 * 84, video_max_pixels=84 * 84)
    images = build_source(DataSpec(source="synthetic"), "train", seed=0).batch(0, 2)
    batch = r.encode_batch(images)
    assert batch.image_grid_thw.tolist() == [[1, 6, 6]] * 2
    assert (batch.mm_token_type_ids == 1).sum(1).tolist() == [9, 9]
    videos = build_source(DataSpec(source="synthetic_video"), "train", seed=0, frames=4)
    batch = r.encode_batch(videos.batch(0, 2))
    assert batch.video_grid_thw.tolist() == [[2, 6, 6]] * 2
    assert (batch.mm_token_type_ids == 2).sum(1).tolist() == [18, 18]
    assert batch.image_counts.tolist() == [0, 0]
