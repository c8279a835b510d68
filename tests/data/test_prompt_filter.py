"""data.max_prompt_tokens: rows whose rendered prompt is longer leave the source, the rest
keep their uids and an epoch order of their own, and the plan is sized for the longest kept
prompt; a cap nothing fits is refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollplex.data import DataError, build_source
from rollplex.data.prompt_filter import keep_prompts_within
from rollplex.data.steps import StepData, _spans, measure_shape
from rollplex.specs.data import DataSpec
from tests.data.test_render import SPEC, _renderer
from tests.data.test_sizing import _rows

LONG = (5, 37)  # the rows with a long question and a larger image


def _source(tmp_path: Path):
    path = _rows(tmp_path, 64, LONG[0])
    text = path.read_text().splitlines()
    text[LONG[1]] = text[LONG[0]]
    path.write_text("\n".join(text) + "\n")
    return build_source(DataSpec(source="jsonl", path=str(path)), "train", 0)


def _tokens(renderer, sample) -> int:
    ((visual, text),) = _spans(renderer.encode_batch([sample]), SPEC)
    return visual + text


def test_the_long_rows_go_and_the_plan_is_sized_for_the_rest(tmp_path, tokenizer, processor):
    source, renderer = _source(tmp_path), _renderer(tokenizer, processor)
    short, long = _tokens(renderer, source.row(0)), _tokens(renderer, source.row(LONG[0]))
    kept = keep_prompts_within(source, renderer, long - 1)
    assert len(kept) == 62
    assert {kept.row(i).uid for i in range(62)} == {
        source.uid(i) for i in range(64) if i not in LONG
    }  # uids are the file's rows
    assert all(_tokens(renderer, s) <= long - 1 for s in kept.batch(0, 62))
    shape = measure_shape(StepData(kept, renderer, prompts_per_step=4), SPEC)
    assert shape.visual_tokens + shape.text_tokens == short and shape.prompts_seen == 62
    # epochs of its own: 62 consecutive positions hold each kept row once
    assert sorted(kept.rows(0, 62)) == list(range(62))
    assert keep_prompts_within(source, renderer, long) is source  # all fit: unchanged


def test_a_cap_no_prompt_fits_is_refused_naming_the_field(tmp_path, tokenizer, processor):
    source, renderer = _source(tmp_path), _renderer(tokenizer, processor)
    short = _tokens(renderer, source.row(0))
    with pytest.raises(DataError, match=rf"data\.max_prompt_tokens=3: every prompt .* {short} "):
        keep_prompts_within(source, renderer, 3)
