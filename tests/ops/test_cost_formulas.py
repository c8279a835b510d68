"""Unit tests of `Cost` and the formulas' structure: arithmetic, TP scaling, identities between
ops, monotonicity of the rollout, and the training-memory bookkeeping."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from rollplex.ops import formulas as F
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, WorkloadSpec
from rollplex.specs.workload import ResponseLengthSpec

M7 = MODEL_PRESETS["qwen2_5_vl_7b"]  # 28 heads, 4 KV heads
M3 = MODEL_PRESETS["qwen2_5_vl_3b"]  # 16 heads, 2 KV heads, tied lm_head


def _cost(scale: float = 1.0, transient: float = 5.0) -> F.Cost:
    return F.Cost(
        flops=100 * scale,
        bytes_read=10 * scale,
        bytes_written=2 * scale,
        weight_bytes=6 * scale,
        persistent_bytes=3 * scale,
        transient_bytes=transient,
    )


# --- Cost ------------------------------------------------------------------------------------


def test_cost_add_sums_work_and_takes_peak_scratch():
    total = _cost(1, transient=5) + _cost(2, transient=9)
    assert total == F.Cost(300, 30, 6, 18, 9, 9)
    assert sum([_cost(1), _cost(2)]) == _cost(1) + _cost(2)
    assert sum([], F.Cost()) == F.Cost()


def test_cost_scaled_is_repeated_addition():
    c = _cost()
    assert c.scaled(3) == c + c + c
    assert c.scaled(0) == F.Cost()
    with pytest.raises(ValueError):
        c.scaled(-1)


def test_cost_intensity():
    assert _cost().intensity == pytest.approx(100 / 12)
    assert F.Cost().intensity == 0
    assert F.Cost(flops=1).intensity == math.inf


def test_cost_is_a_frozen_slotted_record_and_validates():
    c = _cost()
    assert not hasattr(c, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.flops = 0  # type: ignore[misc]
    with pytest.raises(ValueError):
        F.Cost(flops=-1)
    with pytest.raises(ValueError):
        F.Cost(flops=math.nan)
    with pytest.raises(ValueError, match="weight_bytes"):
        F.Cost(bytes_read=1, weight_bytes=2)


# --- the decoder -----------------------------------------------------------------------------


def test_one_token_forward_is_two_flops_per_matmul_weight():
    """With no context, FLOPs = 2 x (matmul weights) + the 1x1 attention, i.e. the formulas
    agree with ModelSpec's parameter count (less biases, norms and the embedding gather)."""
    for spec in (M7, M3):
        h, kv = spec.hidden_size, spec.kv_dim
        biases_norms = h + 2 * kv + 2 * h
        matmul_params = (
            spec.num_layers * (spec.llm_layer_params() - biases_norms)
            + spec.vocab_size * spec.hidden_size
        )
        c = F.llm_forward(spec, 1, 1)
        assert c.flops - F.attention_flops(spec, 1, 1, 1) == 2 * matmul_params


def test_tp_divides_flops_and_weights_while_kv_heads_suffice():
    for tp in (2, 4):
        one, split = F.llm_forward(M7, 4, 512, 256), F.llm_forward(M7, 4, 512, 256, tp=tp)
        assert split.flops == pytest.approx(one.flops / tp)
        assert split.weight_bytes == pytest.approx(one.weight_bytes / tp, rel=1e-4)  # + norm
        v1, vt = F.vision_encode(M7, 2, 1024), F.vision_encode(M7, 2, 1024, tp=tp)
        assert vt.flops == pytest.approx(v1.flops / tp)
        assert vt.persistent_bytes == v1.persistent_bytes  # features are gathered
    with pytest.raises(ValueError):
        F.llm_forward(M7, 1, 1, tp=0)


def test_tp_beyond_kv_heads_replicates_them():
    """3B has 2 KV heads: at TP 4 each GPU still holds a whole head."""
    assert F.kv_fraction(M3.num_kv_heads, 4) == 0.5
    assert F.kv_bytes_per_token(M3, 4) == M3.kv_bytes_per_token() / 2
    one, tp4 = F.llm_forward(M3, 4, 512), F.llm_forward(M3, 4, 512, tp=4)
    assert one.flops / 4 < tp4.flops < one.flops / 2
    assert F.tp_allreduce_bytes(M3, 100, 1) == 0 < F.tp_allreduce_bytes(M3, 100, 4)


def test_llm_forward_byte_terms():
    P = 1000
    no_head = F.llm_forward(M7, 2, P, logit_rows=0)
    head = F.llm_forward(M7, 2, P, logit_rows=1)
    assert head.weight_bytes - no_head.weight_bytes == M7.vocab_size * M7.hidden_size * 2
    assert no_head.persistent_bytes == 2 * P * M7.kv_bytes_per_token()  # the new KV cache
    assert F.llm_forward(M7, 2, P, keep_kv=False, logit_rows=0).persistent_bytes == 0
    step = F.decode_step(M7, 8, P)
    assert step.bytes_read == pytest.approx(
        step.weight_bytes + 8 * P * M7.kv_bytes_per_token() + 8 * M7.hidden_size * 2
    )
    with pytest.raises(ValueError):
        F.llm_forward(M7, 1, 4, logit_rows=5)


def test_decode_is_memory_bound_and_prefill_compute_bound():
    assert F.decode_step(M7, 8, 2304).intensity < 50
    assert F.prefix_prefill(M7, 1, 2304).intensity > 1000
    assert F.decode_step(M7, 8, 2304).weight_bytes / F.decode_step(M7, 8, 2304).bytes > 0.5


def test_prefix_plus_response_equals_full_up_to_the_attention_split():
    S, P, R = 8, 2304, 256
    full = F.logprob(M7, S, P, R, "full")
    prefix = F.logprob(M7, S, P, R, "prefix")
    response = F.logprob(M7, S, P, R, "response")
    masked = F.attention_flops(M7, S, P, R)  # prefix queries x response keys, masked in full
    assert full.flops - (prefix + response).flops == pytest.approx(masked, rel=1e-12)
    assert prefix.flops == F.prefix_prefill(M7, S, P).flops
    # The split reads the weights twice and the prefix KV once more.
    assert (prefix + response).weight_bytes == pytest.approx(2 * full.weight_bytes)
    # Kept: the prefix's KV cache and one row; 4 B per logit row otherwise.
    assert prefix.persistent_bytes == S * P * M7.kv_bytes_per_token() + S * 4
    assert response.persistent_bytes == S * R * 4
    assert full.persistent_bytes == S * (R + 1) * 4
    with pytest.raises(ValueError):
        F.logprob(M7, S, P, R, "middle")  # type: ignore[arg-type]


def test_logprob_with_grad_keeps_activations():
    S, P, R = 2, 1000, 100
    plain = F.logprob(M7, S, P, R)
    ckpt = F.logprob(M7, S, P, R, grad=True, checkpointing=True)
    full_acts = F.logprob(M7, S, P, R, grad=True, checkpointing=False)
    assert plain.persistent_bytes < ckpt.persistent_bytes < full_acts.persistent_bytes
    kept = ckpt.persistent_bytes - plain.persistent_bytes
    # Checkpointed, as the trainer runs it: the layers' inputs, the final norm's, the head's
    # inputs (the head is recomputed in the backward, so no logits), the token ids, the
    # packing's index, and the fused head's float32 log-sum-exp of each scored token.
    h = M7.hidden_size
    per_token = F.activation_bytes_per_token(M7, True) + 2 * h + 9 + 8
    assert kept == pytest.approx(S * ((P + R) * per_token + R * 2 * h + R * 4))
    assert kept == F.saved_activation_bytes(M7, S, P, R, "full")
    # Without checkpointing the fp32 log-softmax of the logit rows is kept too.
    logits = S * (R + 1) * M7.vocab_size * 4
    dense = full_acts.persistent_bytes - plain.persistent_bytes
    assert dense == pytest.approx(S * (P + R) * F.activation_bytes_per_token(M7, False) + logits)


# --- rollout ---------------------------------------------------------------------------------


def _workload(**lengths) -> WorkloadSpec:
    return WORKLOAD_PRESETS["image"].model_copy(
        update={"response_length": ResponseLengthSpec(**lengths)}
    )


def test_decode_rollout_fixed_lengths_is_the_sum_of_its_steps():
    w = _workload(distribution="fixed", mean=64, max=64)
    P = w.prefix_tokens(M7.vision)
    r = F.decode_rollout(M7, w, prompts=2, group_size=4)
    assert r.steps == F.decode_steps(w, 8) == 63  # token 0 comes from the prefill
    assert r.generated_tokens == 8 * 64
    steps = sum((F.decode_step(M7, 8, P + s) for s in range(63)), F.Cost())
    assert r.cost.flops == pytest.approx(steps.flops)
    assert r.cost.weight_bytes == pytest.approx(63 * F.decode_step(M7, 8, P).weight_bytes)
    assert r.cost.persistent_bytes == 8 * 64 * 8  # token ids and logprobs
    assert r.cost.transient_bytes >= 8 * 63 * M7.kv_bytes_per_token()


@pytest.mark.parametrize("model", sorted(MODEL_PRESETS))
def test_decode_step_terms_are_decode_steps_floats(model):
    """The rollout's hoisted per-step terms are `decode_step`'s fields, bit for bit, at
    every TP, fractional batches (expected active rows) and contexts."""
    spec = MODEL_PRESETS[model]
    for tp in (1, 2, 4, 8):
        terms = F.DecodeStepTerms.of(spec, tp)
        for batch, context in itertools.product((0.37, 1.0, 7.5, 256.0), (0, 1, 1337, 98_305)):
            step = F.decode_step(spec, batch, context, tp)
            want = (step.flops, step.bytes_read, step.bytes_written, step.weight_bytes,
                    step.transient_bytes)  # fmt: skip
            assert terms.fields(batch, context) == want, (tp, batch, context)


@pytest.mark.parametrize("distribution", ["lognormal", "uniform", "fixed"])
def test_decode_rollout_grows_with_group_size_and_length(distribution):
    def run(group: int, mean: int) -> F.DecodeRollout:
        w = _workload(distribution=distribution, mean=mean, max=2048)
        return F.decode_rollout(M7, w, prompts=4, group_size=group)

    by_group = [run(g, 256) for g in (1, 2, 4, 8, 16)]
    by_length = [run(8, m) for m in (32, 128, 256, 512)]
    for series in (by_group, by_length):
        for a, b in itertools.pairwise(series):
            assert a.cost.flops < b.cost.flops
            assert a.cost.bytes < b.cost.bytes
            assert a.generated_tokens < b.generated_tokens
            assert a.steps <= b.steps
    # Bigger groups wait on a longer tail: steps grow unless every length is the same.
    assert (by_group[-1].steps > by_group[0].steps) == (distribution != "fixed")


def test_decode_rollout_defaults_to_the_workloads_group_and_scales_with_tp():
    w = WORKLOAD_PRESETS["video"]
    a = F.decode_rollout(M7, w, prompts=2)
    assert a == F.decode_rollout(M7, w, prompts=2, group_size=w.group_size)
    assert F.decode_rollout(M7, w, 2, tp=2).cost.flops == pytest.approx(a.cost.flops / 2)


# --- vision ----------------------------------------------------------------------------------


def test_window_attention_is_cheaper_than_full_and_exact_for_tiled_images():
    v = M7.vision
    # 448x448 -> 32x32 patches -> 16 windows of 64: ΣL² = 16 * 64²
    assert F.window_attention_sq_sum(v, 32, 32) == 16 * 64**2
    # a frame smaller than one window is a single window
    assert F.window_attention_sq_sum(v, 4, 4) == 16**2
    # 28x14 patches: 14x7 merged; windows of 4 merged -> rows 4,4,4,2 and cols 4,3
    assert F.window_attention_sq_sum(v, 28, 14) == 4**2 * (3 * 16 + 4) * (16 + 9)
    img = WORKLOAD_PRESETS["image"]
    grid = F.workload_grid(img, v)
    assert grid == (1, 64, 64)
    windowed = F.vision_encode(M7, 1, 64 * 64, grid_hw=grid[1:])
    no_windows = F.vision_encode(
        M7.model_copy(update={"vision": v.model_copy(update={"window_size": 64 * 14})}),
        1,
        64 * 64,
    )
    assert windowed.flops < no_windows.flops
    with pytest.raises(ValueError):
        F.vision_encode(M7, 1, 100, grid_hw=(8, 8))


# --- training --------------------------------------------------------------------------------


def test_backward_is_twice_the_forward_and_three_times_with_recompute_less_down_proj():
    S, P, R = 4, 1024, 256
    fwd = F.logprob(M7, S, P, R)
    plain = F.backward(M7, S, P, R, checkpointing=False)
    ckpt = F.backward(M7, S, P, R, checkpointing=True)
    assert plain.flops == pytest.approx(2 * fwd.flops)
    assert 2.5 * fwd.flops < ckpt.flops < 3 * fwd.flops
    assert ckpt.weight_bytes > plain.weight_bytes  # the recompute reads the weights again
    grads = M7.llm_param_count() * 2 / 8
    assert F.backward(M7, S, P, R, shards=8).persistent_bytes == pytest.approx(grads)


def test_response_backward_hands_prefix_kv_gradients_to_the_prefix_backward():
    S, P, R = 2, 512, 64
    resp = F.backward(M7, S, P, R, "response", checkpointing=False)
    full = F.backward(M7, S, P, R, "full", checkpointing=False)
    assert resp.persistent_bytes - full.persistent_bytes == S * P * M7.kv_bytes_per_token()


def test_vision_backward_only_when_trainable_costs_about_twice_forward():
    fwd = F.vision_encode(M7, 2, 1024)
    bwd = F.vision_backward(M7, 2, 1024, checkpointing=False)
    assert 1.8 * fwd.flops < bwd.flops < 2 * fwd.flops  # the patch embed needs no input grad
    assert bwd.persistent_bytes == M7.vision.param_count() * 2


def test_activation_bytes_split_only_head_and_ffn_terms_under_tp():
    one = F.activation_bytes_per_token(M7, False)
    two = F.activation_bytes_per_token(M7, False, tp=2)
    assert one / 2 < two < one
    assert F.activation_bytes_per_token(M7, True, tp=2) == F.activation_bytes_per_token(M7, True)
    assert F.activation_bytes_per_token(M7, True) < one / 10


def test_optimizer_state_is_sixteen_bytes_per_param_with_the_gradients():
    shards = 8
    opt = F.optimizer_step(M7, shards=shards)
    params = M7.trainable_param_count() / shards
    grads = F.backward(M7, 1, 1, 1, shards=shards).persistent_bytes
    assert opt.persistent_bytes / params == 12 + 2
    assert (opt.persistent_bytes + grads) / params == pytest.approx(16)
    assert opt.flops == pytest.approx(12 * params)
    assert opt.bytes_read == opt.bytes_written == pytest.approx(14 * params)
    trainable_vision = M7.model_copy(update={"trainable_vision": True})
    assert F.optimizer_step(trainable_vision).flops > F.optimizer_step(M7).flops


def test_weight_sync_moves_the_unaliased_rollout_shard():
    nbytes = 2 * M7.param_count()
    sync = F.weight_sync(nbytes, tp=2, shards=8)
    assert sync.bytes_written == sync.persistent_bytes == nbytes / 2
    assert F.weight_sync_link_bytes(nbytes, tp=2, shards=8) == pytest.approx(nbytes / 2 * 7 / 8)
    assert F.weight_sync_link_bytes(nbytes, shards=1) == 0
    assert F.weight_sync(nbytes, aliased_fraction=1.0) == F.Cost()
    with pytest.raises(ValueError):
        F.weight_sync(nbytes, aliased_fraction=1.5)


def test_reward_and_advantage_are_tiny_but_not_free():
    samples, tokens = 1024, 256
    decode = F.decode_step(M7, samples, 2304)
    for c in (F.reward(samples, tokens), F.advantage(samples, 8, tokens)):
        assert 0 < c.flops < decode.flops * 1e-6
        assert 0 < c.bytes < decode.bytes * 1e-3
        assert c.persistent_bytes > 0
    with pytest.raises(ValueError):
        F.advantage(samples, 0)
