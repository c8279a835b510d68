"""The plan is sized from the longest prompt of the whole set, and a longer row is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from rollplex.data import DataError, build_source
from rollplex.data.steps import StepData, _spans, measure_shape
from rollplex.specs.data import DataSpec
from tests.data.test_render import SPEC, _renderer


def _rows(folder: Path, n: int, long_at: int) -> Path:
    """n short image rows; row `long_at` has a long question and a larger image."""
    Image.new("RGB", (28, 28), (1, 2, 3)).save(folder / "small.png")
    Image.new("RGB", (84, 56), (4, 5, 6)).save(folder / "large.png")
    rows = [{"problem": "<image> colour?", "answer": "red", "images": ["small.png"]}] * n
    rows[long_at] = {
        "problem": "<image> " + "what colour is the shape, answer briefly " * 6,
        "answer": "red",
        "images": ["large.png"],
    }
    path = folder / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("long_at", [0, 37, 63])
def test_the_longest_prompt_anywhere_in_the_set_sizes_the_plan(
    tmp_path: Path, tokenizer, processor, long_at: int
) -> None:
    source = build_source(
        DataSpec(source="jsonl", path=str(_rows(tmp_path, 64, long_at))), "train", 0
    )
    data = StepData(source, _renderer(tokenizer, processor), prompts_per_step=4)
    shape = measure_shape(data, SPEC)
    assert shape.prompts_seen == 64
    # What rendering the long row really gives: the measure must equal it, not bound it.
    long_row = data.renderer.encode_batch([source.row(long_at)])
    ((visual, text),) = _spans(long_row, SPEC)
    assert (shape.visual_tokens, shape.text_tokens) == (visual, text)
    short = data.renderer.encode_batch([source.row((long_at + 1) % 64)])
    ((v_short, t_short),) = _spans(short, SPEC)
    assert visual > v_short and text > t_short  # the first batches alone would under-size it


def test_a_row_longer_than_the_plan_is_refused_by_name(
    tmp_path: Path, tokenizer, processor
) -> None:
    source = build_source(DataSpec(source="jsonl", path=str(_rows(tmp_path, 8, 5))), "train", 0)
    data = StepData(source, _renderer(tokenizer, processor), prompts_per_step=8)
    full = measure_shape(data, SPEC)
    data.limits = full
    data.step(0)  # every row fits the whole-set measure
    data.limits = type(full)(full.visual_tokens - 1, full.text_tokens, 1, 8)
    with pytest.raises(DataError, match=r"row jsonl:train:5: \d+ visual \+ \d+ text tokens, more"):
        data.step(0)


def test_videos_are_measured_at_the_sampled_frame_count(tmp_path: Path, tokenizer, processor):
    for i in range(6):
        Image.new("RGB", (56, 56), (i, 0, 0)).save(tmp_path / f"f{i}.png")
    rows = [
        {"problem": "<video> moving?", "answer": "no", "videos": [[f"f{i}.png" for i in range(6)]]},
        {"problem": "<video> moving?", "answer": "no", "videos": [["f0.png", "f1.png"]]},
    ]
    path = tmp_path / "v.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = build_source(DataSpec(source="jsonl", path=str(path)), "train", 0, frames=4)
    data = StepData(source, _renderer(tokenizer, processor), prompts_per_step=2)
    shape = measure_shape(data, SPEC)
    rendered = list(_spans(data.renderer.encode_batch([source.row(0), source.row(1)]), SPEC))
    assert shape.frames == 4
    assert (shape.visual_tokens, shape.text_tokens) == tuple(map(max, zip(*rendered, strict=True)))
