"""The static-cache decode engine against the eager decode loop and transformers' forward:
same greedy tokens and logprobs, sampled tokens scored alike by the reference path, draws
that depend only on (seed, step, row), and one prefix K/V per prompt."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.decode import decode
from rollplex.backends.torch.full_forward import full_logits
from rollplex.backends.torch.logprob import response_logprobs, response_mask, token_logprobs
from rollplex.backends.torch.roles import features_of
from rollplex.backends.torch.task import QUESTIONS, VisualTask
from rollplex.backends.torch.tokenizer import encode_prompt
from rollplex.backends.torch.values import Pixels
from rollplex.data.prompts import collate_prompts
from rollplex.engine.prefix import expand_prefix, prefix_forward, vision_encode
from rollplex.engine.session import DecodeEngine
from tests.backends.torch.test_video import BATCHES, hf_logits, renderer  # noqa: F401
from tests.backends.torch.test_video import G as VIDEO_G
from tests.engine.interpreted import decodes_agree

G = 3
R = 7


def _engine_decode(model, prefix, temperature=0.0, top_p=1.0, gen=None, eos=-1, **kw):
    session = DecodeEngine(model, **kw).start(prefix, G, R, temperature, top_p, gen, eos)
    session.advance()
    return session.result()


def test_greedy_equals_eager_decode_and_full_forward(model, prefix, batch):
    free = _engine_decode(model, prefix)[0]
    eos = int(free[0, 2])  # prompt 0's rows stop at step 2, prompt 1's (probably) later
    tokens, logprobs, lengths = _engine_decode(model, prefix, eos=eos)
    with torch.no_grad():
        ref = decode(model, expand_prefix(prefix, G), R, 0.0, 1.0, None, eos_id=eos)
        logits = full_logits(model, batch, tokens, lengths, G)
    assert torch.equal(tokens, ref[0]) and torch.equal(lengths, ref[2])
    assert lengths.unique().numel() > 1  # rows finished at different lengths
    torch.testing.assert_close(logprobs, ref[1], atol=1e-5, rtol=0)
    valid = response_mask(lengths, R)
    assert torch.equal(logits.argmax(-1)[valid], tokens[valid])  # transformers' own forward
    # Greedy draws from no generator, the global one included.
    gen, state = torch.Generator().manual_seed(9), torch.get_rng_state()
    again = _engine_decode(model, prefix, gen=gen, eos=eos)[0]
    assert torch.equal(again, tokens)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(gen.get_state(), torch.Generator().manual_seed(9).get_state())


def test_sampled_tokens_scored_alike_by_reference_path(model, prefix):
    free = _engine_decode(model, prefix, 1.0, 0.9, torch.Generator().manual_seed(4))[0]
    eos = int(free[1, 1])
    tokens, logprobs, lengths = _engine_decode(
        model, prefix, 1.0, 0.9, torch.Generator().manual_seed(4), eos
    )
    assert lengths.min() < R  # some row stopped early
    assert not torch.equal(tokens[0], tokens[1])  # rows of one prompt draw their own tokens
    with torch.no_grad():
        scored = response_logprobs(model, expand_prefix(prefix, G), tokens, lengths)
    torch.testing.assert_close(logprobs, scored, atol=1e-5, rtol=0)
    pad_rows = ~response_mask(lengths, R)
    assert (tokens[pad_rows] == 0).all() and (logprobs[pad_rows] == 0).all()


def test_draws_depend_on_seed_not_on_bucket_or_batch(model, prefix):
    def run(seed, **kw):
        return _engine_decode(model, prefix, 1.0, 1.0, torch.Generator().manual_seed(seed), **kw)

    a, b, c = run(1, buckets=(G * 2,)), run(1, buckets=(64,)), run(2)
    # 0 vs 58 padding rows: the same draws; logprobs equal up to the matmuls' rounding for
    # another row count
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=0)
    assert not torch.equal(a[0], c[0])
    # Per-row generators (data-parallel hooks): prompt 1's rows draw the same tokens whether
    # prompt 0 shares their batch or not.
    gens = [torch.Generator().manual_seed(100 + i) for i in range(2 * G)]
    both = DecodeEngine(model).start(prefix, G, R, 1.0, 1.0, gens, -1)
    both.advance()
    gens = [torch.Generator().manual_seed(100 + i) for i in range(G, 2 * G)]
    alone = DecodeEngine(model).start(_prompt(prefix, 1), G, R, 1.0, 1.0, gens, -1)
    alone.advance()
    assert torch.equal(both.result()[0][G:], alone.result()[0])
    torch.testing.assert_close(both.result()[1][G:], alone.result()[1], atol=1e-5, rtol=0)


def _prompt(prefix, row):
    from rollplex.engine.prefix import PrefixState, cache_kv, fork_cache

    kv = [(k[row : row + 1], v[row : row + 1]) for k, v in cache_kv(prefix.cache)]
    cut = {
        n: getattr(prefix, n)[row : row + 1]
        for n in ("last_logits", "attention_mask", "next_positions", "rope_deltas", "lengths")
    }
    return PrefixState(cache=fork_cache(kv), **cut)


def test_segments_resume_to_the_same_tokens(model, prefix):
    engine = DecodeEngine(model, keep_workspace=True)
    whole = _engine_decode(model, prefix, 1.0, 1.0, torch.Generator().manual_seed(3))
    s = engine.start(prefix, G, R, 1.0, 1.0, torch.Generator().manual_seed(3), -1)
    assert not s.advance(2) and s.steps_left == R - 3
    s.advance(3)
    assert s.advance()
    assert all(torch.equal(x, y) for x, y in zip(whole, s.result(), strict=True))
    # The next session of the same shape reuses the buffers, and draws the same again.
    again = engine.start(prefix, G, R, 1.0, 1.0, torch.Generator().manual_seed(3), -1)
    assert again.ws is s.ws
    again.advance()
    assert torch.equal(again.result()[0], whole[0])
    # Without graphs (CPU) the buffers go with the finished session by default.
    light = DecodeEngine(model)
    light.start(prefix, G, R, 0.0, 1.0, None, -1).advance()
    assert light.workspace is None


def test_an_unfinished_session_holds_the_buffers_only_while_it_lives(model, prefix):
    engine = DecodeEngine(model, keep_workspace=True)
    first = engine.start(prefix, G, R, 0.0, 1.0, None, -1)
    first.advance(1)
    cached = first.ws
    # In flight: the next decode gets buffers of its own, the first's stay intact.
    second = engine.start(prefix, G, R, 0.0, 1.0, None, -1)
    assert second.ws is not cached and engine.workspace is cached
    assert not first.finished and first.steps_left == R - 2
    # Dropped unfinished (as a profiler pass leaves one): the cached buffers are free again.
    del first
    third = engine.start(prefix, G, R, 0.0, 1.0, None, -1)
    assert third.ws is cached
    third.advance()
    second.advance()
    assert torch.equal(third.result()[0], second.result()[0])


def test_prefix_kv_is_stored_per_prompt(model, prefix, spec):
    g = 8
    engine = DecodeEngine(model, buckets=(2 * g,))
    session = engine.start(prefix, g, R, 0.0, 1.0, None, -1)
    cache = session.ws.cache
    p = prefix.cache.layers[0].keys.shape[2]
    head_dim = spec.hidden_size // spec.num_heads
    per_layer = 2 * cache.length * spec.num_kv_heads * head_dim * 4  # prompts x this
    for k in cache.keys:
        assert k.shape[0] == prefix.rows  # one slice per prompt, not per sample
        assert k.untyped_storage().nbytes() * 2 == per_layer * prefix.rows
    # Response slots take G * (R - 1) positions after the prefix (rounded up): the prefix
    # is not among them G times.
    assert cache.length < p + 64 + g * R
    eager_kv = sum(
        t.numel() * 4 for kv in expand_prefix(prefix, g).cache.layers for t in (kv.keys, kv.values)
    )
    assert sum(k.untyped_storage().nbytes() for k in cache.keys) * 2 < eager_kv


def test_bad_arguments_are_named(model, prefix):
    engine = DecodeEngine(model)
    with pytest.raises(ValueError, match="top_p"):
        engine.start(prefix, G, R, 1.0, 0.0, None, -1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.start(prefix, G, 0, 1.0, 1.0, None, -1)
    with pytest.raises(ValueError, match="row generators"):
        engine.start(prefix, G, R, 1.0, 1.0, [torch.Generator()], -1)


def test_greedy_equals_transformers_generate(model, tokenizer, processor, spec):
    # one prompt, so no padding: generate's own setting (the conftest batch's prompt 0)
    sample = VisualTask(seed=0).samples(0, 1)[0]
    prompt = encode_prompt(tokenizer, processor, sample.image.resize((56, 56)), QUESTIONS["count"])
    one = collate_prompts([prompt], pad_id=spec.special_tokens.pad_token_id)
    with torch.no_grad():
        out = model.generate(
            input_ids=one.input_ids,
            attention_mask=one.attention_mask,
            pixel_values=one.pixel_values,
            image_grid_thw=one.image_grid_thw,
            mm_token_type_ids=one.mm_token_type_ids,
            max_new_tokens=R,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=spec.special_tokens.pad_token_id,
        )
        feats = vision_encode(model, one.pixel_values, one.image_grid_thw)
        prefix = prefix_forward(model, one, feats, grad=False)
    session = DecodeEngine(model).start(prefix, 1, R, 0.0, 1.0, None, -1)
    session.advance()
    tokens = session.result()[0]
    assert tokens.unique().numel() > 1  # not one token repeated
    assert torch.equal(tokens, out[:, one.input_ids.shape[1] :])


@pytest.mark.parametrize("kind", ["video", "mixed"])
def test_greedy_on_video_prompts_matches_transformers(model, renderer, kind):  # noqa: F811
    """Video M-RoPE: responses continue where transformers' full forward puts them."""
    batch = renderer.encode_batch(BATCHES[kind])
    with torch.no_grad():
        feats = features_of(model, Pixels.of(batch))
        prefix = prefix_forward(model, batch.text_only(), feats.values, False)
        session = DecodeEngine(model).start(prefix, VIDEO_G, 5, 0.0, 1.0, None, -1)
        session.advance()
        tokens, logprobs, lengths = session.result()
        logits = hf_logits(model, batch, tokens, lengths)
    torch.testing.assert_close(logprobs, token_logprobs(logits, tokens), atol=1e-5, rtol=0)
    assert torch.equal(tokens, logits.argmax(-1))


@pytest.mark.parametrize("buckets", [(G * 2,), (64,)])
def test_flex_attention_equals_sdpa(model, prefix, buckets):
    """The split-KV FlexAttention path (CUDA's default; eager reference here) sees exactly
    the keys the SDPA mask lets through: same greedy tokens and logprobs, prompts of unequal
    prefix length, rows stopping at different steps, padding prompts included (64 rows)."""
    free = _engine_decode(model, prefix, attention="sdpa")[0]
    eos = int(free[0, 2])
    sdpa = _engine_decode(model, prefix, eos=eos, attention="sdpa", buckets=buckets)
    flex = _engine_decode(model, prefix, eos=eos, attention="flex", buckets=buckets)
    assert prefix.lengths.unique().numel() > 1
    assert torch.equal(flex[0], sdpa[0]) and torch.equal(flex[2], sdpa[2])
    assert sdpa[2].unique().numel() > 1
    torch.testing.assert_close(flex[1], sdpa[1], atol=1e-5, rtol=0)


def test_flex_mask_visits_only_written_blocks(model, prefix):
    """The BlockMask reads no block past the slots written so far, and a block every key of
    which is valid prefix is marked full (no per-element mask)."""
    from rollplex.engine.flex import BLOCK

    engine = DecodeEngine(model, attention="flex", keep_workspace=True)
    session = engine.start(prefix, 40, 4, 0.0, 1.0, None, -1)
    fm = session.ws.cache.flex
    cap, lengths = fm.prefix_cap, fm.prefix_lengths
    for step in range(3):
        fm.open_through(torch.tensor(step))
        for b in range(lengths.shape[0]):
            n = int(fm.mask.kv_num_blocks[b, 0, 0])
            visited = fm.mask.kv_indices[b, 0, 0, :n].tolist()
            full = fm.mask.full_kv_indices[b, 0, 0, : int(fm.mask.full_kv_num_blocks[b, 0, 0])]
            last = (cap + (step + 1) * 40 - 1) // BLOCK
            p = int(lengths[b])
            assert full.tolist() == list(range(p // BLOCK))
            want = sorted({*([p // BLOCK] if p % BLOCK else []), *range(cap // BLOCK, last + 1)})
            assert visited == want, (b, step)


@pytest.mark.parametrize("engine", [True, False])
def test_forced_lengths_end_each_row_exactly(model, prefix, engine):
    """Forced lengths (benchmarks): row r stops after exactly lengths[r] tokens, eos ignored
    (an eos the free run draws at step 1 does not end any row), in the engine and in the
    eager loop alike; the tokens before the end are the free run's."""
    from rollplex.backends.torch.decode import DecodeSession

    rows = prefix.rows * G
    lengths = [1 + (3 * r) % R for r in range(rows)]
    free = _engine_decode(model, prefix)[0]
    eos = int(free[0, 1])
    if engine:
        s = DecodeEngine(model).start(prefix, G, R, 0.0, 1.0, None, eos, lengths=lengths)
        s.advance(2)
        s.advance()
        tokens, _, got = s.result()
    else:
        s = DecodeSession(model, expand_prefix(prefix, G), R, 0.0, 1.0, None, eos, 0, lengths)
        s.advance()
        tokens, got = s.result().tokens, s.result().lengths
    assert got.tolist() == lengths
    for r, n in enumerate(lengths):
        assert torch.equal(tokens[r, :n], free[r, :n])
        assert (tokens[r, n:] == 0).all()
    with pytest.raises(ValueError, match="forced lengths"):
        DecodeEngine(model).start(prefix, G, R, 0.0, 1.0, None, eos, lengths=[R + 1] * rows)


def test_compiled_layer_pieces_decode_as_the_eager_ones():
    """The CUDA default compiles each layer's pieces (step.py: before / after / last, the
    MLP residual carried into the next norm); Inductor's CPU backend runs the same code, so
    a greedy decode on them equals the eager one here (~50 s of compilation)."""
    decodes_agree("compile", "compiled", 0.0, 0, atol=1e-5)
