"""attention="split" (engine/attention.py): the prefix K/V once per prompt, each row's own
response K/V apart, two parts merged into one exact softmax. It decodes what the SDPA
engine decodes (fp32: same greedy and sampled tokens, logprobs within 1e-5) with prompts
of unequal prefix length, rows of unequal length, bucket padding rows and resumed
segments; and the attention itself equals a dense softmax over exactly the keys a row may
see, finite for padding prompts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rollplex.engine.attention import attend_shared, split_attention
from rollplex.engine.cache import SharedPrefixKV
from rollplex.engine.prefix import prefix_forward
from rollplex.engine.session import DecodeEngine
from rollplex.ops.formulas import engine_attention, torch_engine_workspace
from tests.backends.torch.test_riders import _setup
from tests.backends.torch.test_video import renderer  # noqa: F401

G, R = 3, 7


def _decode(model, prefix, attention, temperature=0.0, seed=None, eos=-1, **kw):
    engine = DecodeEngine(model, attention=attention, **{"keep_workspace": True, **kw})
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    s = engine.start(prefix, G, R, temperature, 1.0, gen, eos)
    s.advance()
    return s.result()


def _same(a, b) -> None:
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("buckets", [(G * 2,), (64,)])
def test_split_greedy_equals_sdpa(model, prefix, buckets):
    """Prompts of unequal prefix length (the padded one's pad keys hidden), rows stopping
    at different steps, and (64 rows) bucket padding prompts with no valid prefix key."""
    free = _decode(model, prefix, "sdpa")[0]
    eos = int(free[0, 2])
    sdpa = _decode(model, prefix, "sdpa", eos=eos, buckets=buckets)
    split = _decode(model, prefix, "split", eos=eos, buckets=buckets)
    assert prefix.lengths.unique().numel() > 1
    assert sdpa[2].unique().numel() > 1  # rows finished at different lengths
    _same(split, sdpa)
    assert torch.isfinite(split[1]).all()


@pytest.mark.parametrize("seed", [0, 5])
def test_split_sampled_equals_sdpa(model, prefix, seed):
    sdpa = _decode(model, prefix, "sdpa", 1.0, seed, buckets=(64,))
    split = _decode(model, prefix, "split", 1.0, seed, buckets=(64,))
    assert not torch.equal(split[0][0], split[0][1])  # rows of a prompt draw their own
    _same(split, sdpa)


def test_split_forced_lengths_equal_sdpa(model, prefix):
    rows = prefix.rows * G
    lengths = [1 + (3 * r) % R for r in range(rows)]
    out = {}
    for attention in ("sdpa", "split"):
        s = DecodeEngine(model, attention=attention).start(
            prefix, G, R, 1.0, 1.0, torch.Generator().manual_seed(2), -1, lengths=lengths
        )
        s.advance()
        out[attention] = s.result()
    assert out["split"][2].tolist() == lengths
    _same(out["split"], out["sdpa"])


def test_split_segments_resume_and_reuse_the_buffers(model, prefix):
    """advance(k) in pieces (and graph-sized kv_len chunks smaller than the decode) draws
    what one advance draws; the next session of the same shape reuses the buffers, whose
    stale response K/V it must not see."""
    whole = _decode(model, prefix, "split", 1.0, 3)
    engine = DecodeEngine(model, attention="split", keep_workspace=True, kv_chunk=2)
    s = engine.start(prefix, G, R, 1.0, 1.0, torch.Generator().manual_seed(3), -1)
    assert not s.advance(2) and s.steps_left == R - 3
    s.advance(3)
    assert s.advance()
    _same(s.result(), whole)
    other = engine.start(prefix, G, R, 1.0, 1.0, torch.Generator().manual_seed(8), -1)
    other.advance()
    again = engine.start(prefix, G, R, 1.0, 1.0, torch.Generator().manual_seed(3), -1)
    assert again.ws is s.ws
    again.advance()
    _same(again.result(), whole)


def test_split_cache_holds_no_mask_and_each_row_its_own_slots(model, prefix, spec):
    engine = DecodeEngine(model, attention="split", keep_workspace=True, kv_chunk=2)
    s = engine.start(prefix, G, R, 0.0, 1.0, None, -1)
    cache = s.ws.cache
    assert cache.mask is None and cache.flex is None
    head_dim = spec.hidden_size // spec.num_heads
    b = cache.prompts  # the bucket's, padding prompts included
    assert b > prefix.rows
    assert cache.keys[0].shape == (b, spec.num_kv_heads, cache.prefix_cap, head_dim)
    own = cache.split.keys[0]
    assert own.shape == (b, spec.num_kv_heads, G, R - 1, head_dim)
    # a graph's kv_len covers the response steps written, in kv_chunk pieces
    assert [engine.kv_len(s.ws, step) for step in range(R - 1)] == [2, 2, 4, 4, 6, 6]
    s.advance(3)  # steps 0, 1, 2 written; 3.. untouched
    assert (own[:, :, :, :3].abs().sum(-1) > 0).all()
    assert (own[:, :, :, 3:] == 0).all()


def attend_steps(attention: str, dtype: torch.dtype, steps: int, device="cpu") -> torch.Tensor:
    """attend_shared over `steps` response steps of random K/V in a cache of 3 prompts (one
    prefix padded to 37 of 50 tokens, one bucket padding prompt): [steps, 3, 4, H * D]."""
    gen = torch.Generator(device).manual_seed(0)
    kv_heads, rep, d, g = 2, 4, 64, 4

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    cache = SharedPrefixKV(
        1, kv_heads, d, rep, 3, g, 64, 24, dtype, torch.device(device), attention
    )
    cache.load(
        [(rand(2, kv_heads, 50, d), rand(2, kv_heads, 50, d))],
        torch.tensor([50, 37], device=device),
    )
    attn = SimpleNamespace(scaling=d**-0.5)
    outs = []
    for s in range(steps):
        step = torch.tensor([s], device=device)
        cache.open_step(step)
        cache.write(0, rand(3, kv_heads, g, d), rand(3, kv_heads, g, d), cache.slots(step))
        q = rand(3, kv_heads * rep, g, d)
        outs.append(attend_shared(attn, q, cache, 0, cache.kv_len(s + 1)))
    return torch.stack(outs)


def test_attention_kinds_agree_over_steps_and_in_bf16():
    with torch.no_grad():
        exact = attend_steps("sdpa", torch.float32, 20)
        for kind in ("split", "flex"):
            torch.testing.assert_close(
                attend_steps(kind, torch.float32, 20), exact, atol=1e-5, rtol=0
            )
        split = attend_steps("split", torch.bfloat16, 20).float()
        sdpa = attend_steps("sdpa", torch.bfloat16, 20).float()
    assert torch.isfinite(split).all()
    torch.testing.assert_close(split, sdpa, atol=3e-2, rtol=3e-2)
    assert (split - exact).abs().mean() < 2 * (sdpa - exact).abs().mean() + 1e-3


def _dense_reference(q, pk, pv, lengths, ok, ov, step, scale):
    """Row by row: SDPA over exactly the keys it may see, concatenated."""
    b, heads, g, d = q.shape
    rep = heads // pk.shape[1]
    out = torch.zeros(b, g, heads, d, dtype=q.dtype)
    for i in range(b):
        for r in range(g):
            for h in range(heads):
                j = h // rep
                k = torch.cat([pk[i, j, : lengths[i]], ok[i, j, r, : step + 1]])
                v = torch.cat([pv[i, j, : lengths[i]], ov[i, j, r, : step + 1]])
                out[i, r, h] = F.scaled_dot_product_attention(q[i, h, r][None], k, v, scale=scale)[
                    0
                ]
    return out.reshape(b, g, heads * d)


def test_split_attention_is_the_softmax_over_the_visible_keys():
    gen = torch.Generator().manual_seed(0)
    b, heads, kv_heads, g, d, cap, n = 3, 4, 2, 2, 8, 16, 6
    q = torch.randn(b, heads, g, d, generator=gen)
    pk, pv = (torch.randn(b, kv_heads, cap, d, generator=gen) * 3 for _ in range(2))
    ok, ov = (torch.randn(b, kv_heads, g, n, d, generator=gen) * 3 for _ in range(2))
    lengths = torch.tensor([16, 5, 0])  # full, padded, a bucket padding prompt
    step = 3
    args = (pk, pv, lengths, ok, ov, torch.tensor(step), 0.35)
    got = split_attention(q, *args)
    want = _dense_reference(q, pk, pv, lengths, ok, ov, step, 0.35)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # what it may not see does not matter: prefix padding, later steps, the other rows'
    pk[1, :, 5:], ok[:, :, :, step + 1 :] = 1e4, -1e4
    torch.testing.assert_close(split_attention(q, *args), got, atol=0, rtol=0)
    ok[:, :, 1], ov[:, :, 1] = 7.0, -7.0  # row 1's own keys and values
    moved = split_attention(q, *args).view(b, g, heads, d)
    assert torch.equal(moved[:, 0], got.view(b, g, heads, d)[:, 0])
    assert not torch.equal(moved[:, 1], got.view(b, g, heads, d)[:, 1])
    # nothing visible at all (no prefix, no step yet): finite, not NaN
    empty = split_attention(
        q, pk, pv, torch.zeros(b, dtype=torch.long), ok, ov, torch.tensor(-1), 1.0
    )
    assert torch.isfinite(empty).all()


@pytest.mark.parametrize("kind", ["image", "mixed"])
def test_split_riders_equal_sdpa_riders(spec, renderer, kind):  # noqa: F811
    """Prefix rows riding a split decode step: the decode draws what it draws alone and
    what the SDPA ride draws, and the ride computes the SDPA ride's K/V and hidden."""
    batch, trainer, feats = _setup(spec, renderer, kind)
    model = trainer.model
    with torch.no_grad():
        prefix = prefix_forward(model, batch.text_only(), feats.values, False)
    out = {}
    for attention in ("sdpa", "split"):
        engine = DecodeEngine(model, attention=attention)
        s = engine.start(prefix, 2, 6, 1.0, 1.0, torch.Generator().manual_seed(5), -1)
        s.advance(2)
        ridden = s.ride(trainer.ride_rows(feats, batch.text_only()))
        assert not ridden.alone
        s.advance()
        out[attention] = (s.result(), ridden)
    alone = DecodeEngine(model, attention="split").start(
        prefix, 2, 6, 1.0, 1.0, torch.Generator().manual_seed(5), -1
    )
    alone.advance()
    _same(out["split"][0], alone.result())
    _same(out["split"][0], out["sdpa"][0])
    a, b = out["sdpa"][1], out["split"][1]
    torch.testing.assert_close(b.hidden, a.hidden, atol=1e-5, rtol=1e-5)
    for (k0, v0), (k1, v1) in zip(a.kv, b.kv, strict=True):
        torch.testing.assert_close(k1, k0, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v0, atol=1e-5, rtol=1e-5)


def test_unknown_attention_is_named(model, spec):
    with pytest.raises(ValueError, match="split"):
        DecodeEngine(model, attention="splat")
    with pytest.raises(ValueError, match="attention must be"):
        torch_engine_workspace(spec, 1, 1, 5, 2, attention="splat")


@pytest.mark.parametrize(
    ("prompts", "kv_heads", "kind"),
    # the H200 measurements the rule follows (bench/results/gpu_decode/split.md)
    [(1, 2, "split"), (8, 2, "split"), (32, 2, "sdpa"), (1, 4, "split"), (8, 4, "sdpa")],
)
def test_auto_attention_follows_the_measured_rule(prompts, kv_heads, kind):
    assert engine_attention(prompts, kv_heads) == kind
    # on split_kernel.py's kernels split beat SDPA at every measured size (split_kernel.md)
    assert engine_attention(prompts, kv_heads, kernel=True) == "split"


def test_auto_is_sdpa_on_cpu_and_resolves_per_decode(model, prefix):
    engine = DecodeEngine(model, keep_workspace=True)
    assert engine.attention == "sdpa"  # CPU: the rule was measured on CUDA only
    engine.attention = "auto"  # what a CUDA engine keeps: resolved at each start
    kv_heads = model.config.text_config.num_key_value_heads
    for buckets in [(G * 2,), (256,)]:
        engine.buckets = list(buckets)
        prompts = engine.bucket_prompts(2, G)
        session = engine.start(prefix, G, R, 0.0, 1.0, None, -1)
        assert session.ws.shape.attention == engine_attention(prompts, kv_heads)
    assert {engine.attention_for(2), engine.attention_for(256)} == {"split", "sdpa"}
