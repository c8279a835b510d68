"""The synthetic task is deterministic and its answers are right; the tokenizer and the
real image processor lay prompts out as Qwen2.5-VL expects."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.task import (
    ANSWER_WORDS,
    BACKGROUND,
    COUNT_WORDS,
    PALETTE,
    QUESTIONS,
    VisualTask,
    reward,
)
from rollplex.backends.torch.tokenizer import SPECIAL_TOKEN_NAMES, encode_prompt, token_id


def _components(image, colour) -> int:
    """Connected components (4-neighbour) of `colour` pixels."""
    w, h = image.size
    px = image.load()
    seen: set[tuple[int, int]] = set()
    count = 0
    for start in ((x, y) for y in range(h) for x in range(w)):
        if start in seen or px[start] != colour:
            continue
        count += 1
        stack = [start]
        seen.add(start)
        while stack:
            x, y = stack.pop()
            for q in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if 0 <= q[0] < w and 0 <= q[1] < h and q not in seen and px[q] == colour:
                    seen.add(q)
                    stack.append(q)
    return count


def test_deterministic_given_seed():
    a, b, c = VisualTask(seed=5), VisualTask(seed=5), VisualTask(seed=6)
    for i in range(8):
        x, y = a.sample(i), b.sample(i)
        assert x.image.tobytes() == y.image.tobytes() and (x.question, x.answer) == (
            y.question,
            y.answer,
        )
    assert any(a.sample(i).image.tobytes() != c.sample(i).image.tobytes() for i in range(8))


@pytest.mark.parametrize("size", [56, 84])
def test_answers_match_the_pixels(size):
    samples = VisualTask(seed=1, image_size=size).samples(0, 40)
    assert {s.kind for s in samples} == set(QUESTIONS)
    assert {s.count for s in samples} == {1, 2, 3, 4}
    for s in samples:
        colours = {rgb: n for n, rgb in s.image.getcolors(maxcolors=1 << 16)}
        assert set(colours) <= {BACKGROUND, *PALETTE.values()}  # no anti-aliased pixels
        present = [name for name, rgb in PALETTE.items() if colours.get(rgb)]
        assert present == [s.colour]
        assert _components(s.image, PALETTE[s.colour]) == s.count
        assert s.question == QUESTIONS[s.kind]
        expected = COUNT_WORDS[s.count - 1] if s.kind == "count" else s.colour
        assert s.answer == expected


def test_reward_is_exact_match():
    eos, ans, other = 2, 40, 41
    assert reward([ans, eos], ans, eos) == 1.0
    assert reward(torch.tensor([ans, eos, 0, 0]), ans, eos) == 1.0  # padding after eos
    assert reward([other, eos], ans, eos) == 0.0
    assert reward([ans], ans, eos) == 0.0  # no eos: truncated
    assert reward([ans, ans, eos], ans, eos) == 0.0
    assert reward([eos], ans, eos) == 0.0
    assert reward([], ans, eos) == 0.0


def test_tokenizer_layout(tokenizer, spec):
    assert len(tokenizer) == spec.vocab_size <= 512
    ids = spec.special_tokens.model_dump()
    for field, name in SPECIAL_TOKEN_NAMES.items():
        assert token_id(tokenizer, name) == ids[field]
    assert tokenizer.pad_token_id == ids["pad_token_id"]
    assert tokenizer.eos_token_id == ids["eos_token_id"]
    answers = [token_id(tokenizer, w) for w in ANSWER_WORDS]
    assert len(set(answers)) == len(ANSWER_WORDS) and not set(answers) & set(ids.values())
    text = "What colour are the shapes ?"
    enc = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in enc and tokenizer.decode(enc) == text.lower()
    with pytest.raises(KeyError):
        token_id(tokenizer, "zebra")


@pytest.mark.parametrize("size", [56, 84])
def test_encode_prompt(tokenizer, processor, spec, size):
    s = VisualTask(seed=0, image_size=size).sample(0)
    p = encode_prompt(tokenizer, processor, s.image, s.question)
    st, v = spec.special_tokens, spec.vision
    patches = (size // v.patch_size) ** 2
    assert p.image_grid_thw.tolist() == [[1, size // v.patch_size, size // v.patch_size]]
    assert p.pixel_values.shape == (patches, v.patch_dim)
    n_image = patches // v.merge_factor
    ids = p.input_ids.tolist()
    assert ids[: n_image + 2] == [
        st.vision_start_token_id,
        *[st.image_token_id] * n_image,
        st.vision_end_token_id,
    ]
    assert tokenizer.decode(ids[n_image + 2 :]) == s.question
    assert p.mm_token_type_ids.tolist() == [int(i == st.image_token_id) for i in ids]
