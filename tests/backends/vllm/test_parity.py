"""vLLM and the torch rollout agree on the same weights (tiny model, fp32, greedy): the
same tokens for image prompts, first-token logprobs within 1e-4; and vLLM's sampling is
reproducible and independent of how decode is cut into segments."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.base import Sampling
from rollplex.backends.torch.rows import text_only
from rollplex.backends.torch.values import Pixels
from rollplex.specs.vllm import VllmSpec
from tests.backends.vllm.conftest import ENGINE, SPEC, greedy, needs_vllm, torch_rollout
from tests.backends.vllm.tiny_folder import image_prompts

pytestmark = needs_vllm
G = 2


@pytest.fixture(scope="module")
def engine(folder):
    from rollplex.backends.vllm import VllmRollout

    engine = VllmRollout(folder, VllmSpec(**(ENGINE.model_dump() | {"return_logprobs": True})))
    yield engine
    engine.shutdown()


def torch_generate(folder, batch, sampling: Sampling):
    role = torch_rollout(folder)
    prefix = role.prefix_prefill(
        role.vision_encode(Pixels(batch.pixel_values, batch.image_grid_thw)), text_only(batch)
    )
    session = role.start_decode(prefix, G, sampling, torch.Generator().manual_seed(0))
    session.advance()
    return session.result()


def test_greedy_tokens_and_logprobs_match_torch(engine, folder):
    batch, media = image_prompts(2)
    ours, ours_lp = engine.generate(media, batch, G, greedy(), 0)
    ref, ref_lp = torch_generate(folder, batch, greedy())
    assert ours.tokens.shape == ref.tokens.shape == (2 * G, 8)
    assert len({tuple(r) for r in ref.tokens.tolist()}) > 1  # the prompts really differ
    assert torch.equal(ours.tokens, ref.tokens)
    assert torch.equal(ours.lengths, ref.lengths)
    torch.testing.assert_close(ours_lp.values[:, 0], ref_lp.values[:, 0], atol=1e-4, rtol=0)
    assert torch.equal(ours_lp.mask, ref_lp.mask)


def test_sampling_is_seeded_and_segment_independent(engine):
    batch, media = image_prompts(2)
    st = SPEC.special_tokens
    s = Sampling(8, 1.0, 0.9, st.eos_token_id, st.pad_token_id)
    prompts = engine.prefix_prefill(engine.vision_encode(media), batch)
    whole = engine.start_decode(prompts, G, s, 7)
    assert whole.advance()
    split = engine.start_decode(prompts, G, s, 7)
    assert not split.advance(3)  # stops after a segment ...
    assert split.steps_left > 0
    assert split.advance()  # ... and resumes
    other = engine.start_decode(prompts, G, s, 8)
    other.advance()
    a, b, c = whole.result()[0], split.result()[0], other.result()[0]
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)  # the seed, not a fixed pattern, picks tokens
    # G samples of one prompt differ (each row has its own seed)
    assert not torch.equal(a.tokens[0], a.tokens[1])


def test_logprobs_only_when_asked(folder, engine):
    batch, media = image_prompts(2)
    engine.spec = VllmSpec(**(ENGINE.model_dump() | {"return_logprobs": False}))
    try:
        responses, logprobs = engine.generate(media, batch, G, greedy(), 0)
    finally:
        engine.spec = VllmSpec(**(ENGINE.model_dump() | {"return_logprobs": True}))
    assert logprobs is None and responses.tokens.shape == (2 * G, 8)
