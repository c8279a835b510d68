"""Response logprobs on a prefix K/V shared by each prompt's G responses equal the old
expand path (prefix K/V repeat_interleave'd G times into a DynamicCache, transformers' own
attention over [prefix ; response]): logprobs and every gradient within 1e-5 (fp32 CPU),
over prompts of unequal length, unequal response lengths, G in {1, 2, 4}, one forward or
1..N checkpointed micro-batches, the reference scorer's no-grad path; and no tensor of the
expanded prefix's shape is ever made (the memory the expand cost is measured and stated)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rollplex.backends.torch.activations import SavedActivations
from rollplex.backends.torch.checkpointing import checkpointed_layers
from rollplex.backends.torch.logprob import (
    head_logprobs,
    response_head_outputs,
    response_logprobs,
    response_mask,
    token_logprobs,
)
from rollplex.backends.torch.micro import response_micro_batches
from rollplex.backends.torch.micro_loss import backward_micro_batches
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import TorchReference, capture_saved
from rollplex.backends.torch.task import QUESTIONS, VisualTask
from rollplex.backends.torch.tokenizer import encode_prompt
from rollplex.backends.torch.values import Responses
from rollplex.data.prompts import collate_prompts
from rollplex.engine.prefix import (
    cache_kv,
    embed_tokens,
    expand_prefix,
    fork_cache,
    lm_hidden,
    prefix_forward,
    response_positions,
    vision_encode,
)

R = 6  # response width; its 5 fed tokens stay below every prompt's length
TOL = 1e-5


@pytest.fixture(scope="module")
def prompts(tokenizer, processor, spec):
    """Three prompts of unequal length (three image sizes)."""
    samples = VisualTask(seed=5).samples(0, 3)
    questions = list(QUESTIONS.values())
    encoded = [
        encode_prompt(
            tokenizer,
            processor,
            s.image.resize(size) if size else s.image,
            questions[i % len(questions)],
        )
        for i, (s, size) in enumerate(zip(samples, [None, (56, 56), (28, 28)], strict=True))
    ]
    batch = collate_prompts(encoded, pad_id=spec.special_tokens.pad_token_id)
    assert len(set(batch.lengths.tolist())) == 3
    return batch


def _responses(spec, rows: int, seed: int = 0) -> Responses:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(7, spec.vocab_size, (rows, R), generator=gen)
    lengths = torch.randint(1, R + 1, (rows,), generator=gen)
    lengths[0], lengths[-1] = R, 1  # a full row and a one-token row
    return Responses(tokens, lengths)


def expand_logprobs(model, state, responses: Responses, group_size: int) -> torch.Tensor:
    """The old path, as response_logprobs ran before the shared prefix: the prefix
    repeated G times, forked into a DynamicCache that the response K/V extend, the
    model's own attention over it with a [prefix ; response] padding mask."""
    state = expand_prefix(state, group_size)
    tokens, lengths = responses.tokens, responses.lengths
    width = tokens.shape[1]  # R, or fewer columns (micro.trimmed)
    valid = response_mask(lengths, width)
    mask = torch.cat([state.attention_mask, valid[:, :-1].to(state.attention_mask.dtype)], 1)
    hidden = lm_hidden(
        model,
        embed_tokens(model, tokens[:, :-1]),
        response_positions(state, width - 1),
        mask,
        fork_cache(cache_kv(state.cache)),
    )
    first = token_logprobs(state.last_logits, tokens[:, 0]).unsqueeze(1)
    out = torch.cat([first, head_logprobs(model.lm_head, hidden, tokens[:, 1:], 1.0)], 1)
    return torch.where(valid, out, 0.0)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=TOL, atol=TOL, msg=name)


def _one_forward(spec, prompts, responses, group_size: int, shared: bool):
    """Logprobs and all gradients (vision tower included) of one forward and backward."""
    model = build_model(spec, seed=0)
    feats = vision_encode(model, prompts.pixel_values, prompts.image_grid_thw)
    assert feats.requires_grad  # the tower trains: its gradients are compared too
    state = prefix_forward(model, prompts.text_only(), feats, grad=True)
    if shared:
        lp = response_logprobs(model, state, responses.tokens, responses.lengths)
    else:
        lp = expand_logprobs(model, state, responses, group_size)
    weights = torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
    (lp * weights).sum().backward()
    return lp.detach(), _grads(model)


@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_shared_prefix_equals_expand(spec, prompts, group_size):
    responses = _responses(spec, prompts.size * group_size)
    lp, grads = _one_forward(spec, prompts, responses, group_size, shared=True)
    old_lp, old_grads = _one_forward(spec, prompts, responses, group_size, shared=False)
    torch.testing.assert_close(lp, old_lp, rtol=TOL, atol=TOL)
    assert any("visual" in n for n in grads) and any("lm_head" in n for n in grads)
    _assert_close(grads, old_grads)


def _micro_batched(spec, prompts, responses, group_size: int, count: int):
    """The trainer's path: checkpointed prefix forward, `count` checkpointed micro-batches
    of prompts' groups, micro-batch backward, then once through the shared prefix."""
    model = build_model(spec, seed=0)
    feats = vision_encode(model, prompts.pixel_values, prompts.image_grid_thw)
    saved = SavedActivations()
    with capture_saved(saved), checkpointed_layers(model, saved):
        prefix = prefix_forward(model, prompts.text_only(), feats, grad=True)

    def score(state, tokens, lengths, _rows):
        assert state.rows * group_size == tokens.shape[0]  # one prefix row per prompt
        return response_logprobs(model, state, tokens, lengths)

    out, _ = response_micro_batches(model, prefix, responses, group_size, count, score)
    weights = torch.randn(out.values.shape, generator=torch.Generator().manual_seed(1))
    micro = out.micro
    terms = [
        (lp * weights[lo:hi]).sum() for (lo, hi), lp in zip(micro.rows, micro.logprobs, strict=True)
    ]
    backward_micro_batches(terms, micro)
    return out.values, _grads(model), len(micro.rows)


@pytest.mark.parametrize(("group_size", "count"), [(2, 1), (2, 2), (4, 3), (1, 3)])
def test_micro_batches_with_checkpointed_layers_equal_expand(spec, prompts, group_size, count):
    responses = _responses(spec, prompts.size * group_size, seed=2)
    lp, grads, batches = _micro_batched(spec, prompts, responses, group_size, count)
    assert batches == count
    old_lp, old_grads = _one_forward(spec, prompts, responses, group_size, shared=False)
    torch.testing.assert_close(lp, old_lp, rtol=TOL, atol=TOL)
    _assert_close(grads, old_grads)


def _reference_scored(spec, prompts, responses, group_size: int):
    """(the reference scorer's logprobs, the old path's, the scorer and its prefix)."""
    model = build_model(spec, seed=0)
    ref = TorchReference(model)
    with torch.no_grad():
        feats = vision_encode(model, prompts.pixel_values, prompts.image_grid_thw)
        prefix = ref.logprob_prefix(_Feats(feats), prompts.text_only())
        old = expand_logprobs(model, prefix, responses, group_size)
    scored = ref.logprob_response(prefix, responses, group_size)
    return scored.values, old, ref, prefix


def test_reference_scorer_equals_expand(spec, prompts):
    g = 4
    responses = _responses(spec, prompts.size * g, seed=3)
    scored, old, ref, prefix = _reference_scored(spec, prompts, responses, g)
    torch.testing.assert_close(scored, old, rtol=TOL, atol=TOL)
    with pytest.raises(ValueError, match="group_size=3"):
        ref.logprob_response(prefix, responses, 3)


class _Feats:  # what logprob_prefix reads of a Features value
    def __init__(self, values: torch.Tensor) -> None:
        self.values = values


def test_critic_head_outputs_repeat_first_over_group(spec, prompts):
    """response_head_outputs on the unexpanded prefix: token 0's output repeated over each
    prompt's G rows, the rest equal to the expanded state's."""
    g = 2
    responses = _responses(spec, prompts.size * g, seed=4)
    model = build_model(spec, seed=0)
    with torch.no_grad():
        feats = vision_encode(model, prompts.pixel_values, prompts.image_grid_thw)
        prefix = prefix_forward(model, prompts.text_only(), feats, grad=False)
        first, rest = response_head_outputs(model, prefix, responses.tokens, responses.lengths)
        e_first, e_rest = response_head_outputs(
            model, expand_prefix(prefix, g), responses.tokens, responses.lengths
        )
    torch.testing.assert_close(first, e_first, rtol=0, atol=0)
    torch.testing.assert_close(rest, e_rest, rtol=TOL, atol=TOL)
    with pytest.raises(ValueError, match="group_size=3"):
        response_head_outputs(model, prefix, responses.tokens, responses.lengths, 3)
    with pytest.raises(ValueError, match="a whole group of G"):  # 5 rows for 3 prompts
        response_logprobs(model, prefix, responses.tokens[:5], responses.lengths[:5])


# -- no expanded prefix is made ------------------------------------------------------------
class _Allocations(TorchDispatchMode):
    """Every tensor an aten op returns inside the block: its shape and bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[tuple[int, ...], int]] = []
        self.live = 0  # bytes of those tensors still alive

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t._base is None:  # views own no memory
                size = t.numel() * t.element_size()
                self.made.append((tuple(t.shape), size))
                self.live += size
                weakref.finalize(t, self._freed, size)
        return out

    def _freed(self, size: int) -> None:
        self.live -= size

    def bytes_shaped(self, prompts: int, kv_heads: int, min_keys: int, head_dim: int) -> int:
        """Bytes of tensors shaped like prefix K/V with more rows than prompts: [> prompts,
        kv_heads, >= the shortest prefix, head_dim] (one row per response; the responses'
        own K/V are shorter than any prefix, the shared prefix has a row per prompt)."""
        return sum(
            b
            for s, b in self.made
            if len(s) == 4 and s[0] > prompts and s[1] == kv_heads and s[2] >= min_keys
            if s[3] == head_dim
        )


def test_no_expanded_prefix_kv_is_allocated(spec, prompts):
    """Forward and backward of the micro-batched training path and the reference scorer
    allocate no tensor shaped like per-response prefix K/V; the old path allocates them
    (the expand's repeat of K and V, `floor` = 2 x layers x N x kv_heads x P x head_dim x 4
    bytes, then the DynamicCache it is forked into, that cache extended by the responses,
    and the gradients of each in backward). Measured here (tiny model, 3 prompts x G=4,
    P=19): 1,990,656 B in such tensors on the old path (8.5 x floor), 0 B shared. The
    detector is the test: a micro-batch that expands again makes it fail."""
    g = 4
    cfg = build_model(spec, seed=0).config.text_config
    kv_heads, head_dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    n, p = prompts.size * g, int(prompts.input_ids.shape[1])
    floor = 2 * cfg.num_hidden_layers * n * kv_heads * p * head_dim * 4
    responses = _responses(spec, n, seed=5)

    model = build_model(spec, seed=0)
    with torch.no_grad():  # the scorer's prefix, outside the measured block
        feats = vision_encode(model, prompts.pixel_values, prompts.image_grid_thw)
        prefix = prefix_forward(model, prompts.text_only(), feats, grad=False)
    with _Allocations() as new:
        _micro_batched(spec, prompts, responses, g, 2)
        TorchReference(model).logprob_response(prefix, responses, g)  # the no-grad path
    assert new.bytes_shaped(prompts.size, kv_heads, min(prompts.lengths.tolist()), head_dim) == 0

    with _Allocations() as old:
        _one_forward(spec, prompts, responses, g, shared=False)
    expanded = old.bytes_shaped(prompts.size, kv_heads, min(prompts.lengths.tolist()), head_dim)
    assert expanded >= 2 * floor  # the detector sees the expand whenever it is made
    print(f"expand path: {expanded} B in per-response prefix K/V (floor {floor} B); shared: 0")


# -- the attention function itself ---------------------------------------------------------
class _Attn(torch.nn.Module):  # what the function reads of transformers' attention module
    layer_idx = 0


def _dense(q, pk, pv, k, v, prefix_valid, response_valid, g):
    """Each row's attention over its own copy of [prefix ; response]: the expand's math."""
    heads, r, d = q.shape[1:]
    rep = heads // k.shape[1]
    keys = torch.cat([pk.repeat_interleave(g, 0), k], 2).repeat_interleave(rep, 1)
    vals = torch.cat([pv.repeat_interleave(g, 0), v], 2).repeat_interleave(rep, 1)
    causal = torch.ones(r, r, dtype=torch.bool, device=q.device).tril()
    causal = causal[None] & response_valid[:, None, :]
    visible = torch.cat([prefix_valid.repeat_interleave(g, 0)[:, None, :].expand(-1, r, -1),
                         causal], 2)  # fmt: skip
    out = torch.nn.functional.scaled_dot_product_attention(
        q, keys, vals, attn_mask=visible[:, None], scale=d**-0.5
    )
    return out.transpose(1, 2)


def test_attention_parts_merge_to_dense():
    """Part A (the group's queries over the one prefix) and part B (own causal response)
    merged by lse equal dense attention over each row's [prefix ; response], values and
    gradients (the prefix's: the sum over its G rows). The math path: CPU flex has no
    backward and no lse when compiled, so the FlexAttention path is checked on CUDA by
    bench/gpu_shared_prefix.py."""
    from rollplex.backends.torch.shared_prefix_attention import (
        SharedPrefix,
        shared_prefix_attention,
    )

    gen = torch.Generator().manual_seed(0)
    b, g, heads, kv_heads, p, r, d = 2, 3, 4, 2, 9, 5, 8
    q = torch.randn(b * g, heads, r, d, generator=gen, requires_grad=True)
    k, v = (torch.randn(b * g, kv_heads, r, d, generator=gen) for _ in range(2))
    pk, pv = (torch.randn(b, kv_heads, p, d, generator=gen, requires_grad=True) for _ in "kv")
    prefix_valid = torch.arange(p)[None, :] < torch.tensor([[p], [4]])
    response_valid = torch.arange(r)[None, :] < torch.tensor([5, 1, 3, 5, 2, 4])[:, None]
    shared = SharedPrefix.build([(pk, pv)], prefix_valid, response_valid, g)
    assert shared.flex is None
    out, _ = shared_prefix_attention(_Attn(), q, k, v, shared, scaling=d**-0.5)
    want = _dense(q, pk, pv, k, v, prefix_valid, response_valid, g)
    torch.testing.assert_close(out, want, rtol=TOL, atol=TOL)
    w = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad((out * w).sum(), (pk, pv, q))
    ref = torch.autograd.grad((want * w).sum(), (pk, pv, q))
    for a, e in zip(got, ref, strict=True):
        torch.testing.assert_close(a, e, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("count", [1, 3])
def test_training_forward_keeps_less_until_backward(spec, prompts, count):
    """What the micro-batched training forward leaves alive for its backward (the graph
    step between `logprob_response` and `backward`): the old path kept each micro-batch's
    repeated prefix K/V twice (the fork its checkpointed layers replay, and the
    DynamicCache extended by the responses), at least `floor` = 2 x layers x N x kv_heads
    x P x head_dim x 4 bytes over all micro-batches; the shared path keeps none of it.
    Measured: the tiny model at 3 prompts x G=4, P=19 (floor 233,472 B) keeps 767,568 B on
    the old path and 230,409 B shared, at 1 and at 3 micro-batches."""
    g = 4
    n = prompts.size * g
    responses = _responses(spec, n, seed=6)
    model = build_model(spec, seed=0)
    cfg = model.config.text_config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    floor = 2 * cfg.num_hidden_layers * n * cfg.num_key_value_heads * prompts.input_ids.shape[1]
    floor *= head_dim * 4
    feats = vision_encode(model, prompts.pixel_values, prompts.image_grid_thw)
    saved = SavedActivations()
    with capture_saved(saved), checkpointed_layers(model, saved):
        prefix = prefix_forward(model, prompts.text_only(), feats, grad=True)

    def kept(score) -> int:
        with _Allocations() as a:
            out, _ = response_micro_batches(model, prefix, responses, g, count, score)
            gc.collect()
            live = a.live
        assert out.micro.logprobs[0].requires_grad  # the graphs are still held
        return live

    def old(state, tokens, lengths, _rows):
        return expand_logprobs(model, state, Responses(tokens, lengths), g)

    def new(state, tokens, lengths, _rows):
        return response_logprobs(model, state, tokens, lengths)

    kept_old, kept_new = kept(old), kept(new)
    print(f"kept until backward, {count} micro-batches: old {kept_old} B, shared {kept_new} B")
    assert kept_old - kept_new >= floor


def test_other_attention_runs_the_models_own_implementation(spec, prompts):
    """Once installed, the dispatcher leaves every non-shared-prefix call (prefix forward,
    decode over a DynamicCache) to the model's own implementation: same results, bitwise."""
    from rollplex.backends.torch.shared_prefix_attention import use_shared_prefix

    def prefill(model):
        with torch.no_grad():
            feats = vision_encode(model, prompts.pixel_values, prompts.image_grid_thw)
            return prefix_forward(model, prompts.text_only(), feats, grad=False)

    plain = build_model(spec, seed=0)
    assert plain.model.language_model.config._attn_implementation == "sdpa"
    routed = build_model(spec, seed=0)
    assert use_shared_prefix(routed) == "sdpa+shared_prefix" == use_shared_prefix(routed)
    a, b = prefill(plain), prefill(routed)
    torch.testing.assert_close(a.last_logits, b.last_logits, rtol=0, atol=0)
    for (ka, va), (kb, vb) in zip(cache_kv(a.cache), cache_kv(b.cache), strict=True):
        torch.testing.assert_close((ka, va), (kb, vb), rtol=0, atol=0)
