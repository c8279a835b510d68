"""The FLOP formulas against torch's FlopCounterMode on the tiny Qwen2.5-VL (eager attention,
which the counter sees; it counts dense attention with no causal discount, as the formulas)."""

from __future__ import annotations

import pytest
import torch

from rollplex.ops import formulas as F

TOLERANCE = 0.10


def assert_matches(label: str, formula: float, measured: int) -> None:
    ratio = formula / measured
    print(f"{label}: formula/counter = {ratio:.4f} ({formula:.4g} / {measured:.4g})")
    assert measured > 0
    assert ratio == pytest.approx(1.0, abs=TOLERANCE), label


def vision_flops(spec, grids) -> float:
    return sum(
        F.vision_encode(spec, 1, t * h * w, temporal_patches=t, grid_hw=(h, w)).flops
        for t, h, w in grids
    )


@pytest.mark.parametrize(
    "grids",
    [
        [(1, 16, 16)],  # 224x224: 256 patches, 4 windows of 64
        [(1, 16, 16), (1, 16, 16)],  # two images
        [(1, 16, 16), (1, 8, 12)],  # + 112x168: windows cut at the edge
        [(2, 8, 8)],  # a 4-frame video: 2 temporal patches
    ],
    ids=["one_224", "two_224", "224_and_112x168", "video"],
)
def test_vision_encode(kit, tiny_spec, tiny_model, grids):
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), tiny_spec.vision.patch_dim)
    with torch.no_grad():
        measured, out = kit.count_flops(
            lambda: tiny_model.model.visual(pixels, grid_thw=torch.tensor(grids))
        )
    assert out.pooler_output.shape[0] == pixels.shape[0] // tiny_spec.vision.merge_factor
    assert_matches(f"vision_encode {grids}", vision_flops(tiny_spec, grids), measured)


def test_vision_encode_batched_square_images_need_no_grid(tiny_spec):
    one = F.vision_encode(tiny_spec, 1, 256, grid_hw=(16, 16))
    assert F.vision_encode(tiny_spec, 2, 256).flops == pytest.approx(2 * one.flops)


def test_prefix_prefill(kit, tiny_spec, tiny_model, tiny_batch):
    b = tiny_batch
    with torch.no_grad():
        measured, out = kit.count_flops(
            lambda: tiny_model(
                **b.vision_inputs(b.prefix_ids),
                position_ids=b.positions[..., : b.prefix_tokens],
                use_cache=True,
                logits_to_keep=1,
            )
        )
    assert out.past_key_values.get_seq_length() == b.prefix_tokens
    formula = vision_flops(tiny_spec, [b.grid] * b.sequences)
    formula += F.prefix_prefill(tiny_spec, b.sequences, b.prefix_tokens).flops
    assert_matches("vision + prefix_prefill", formula, measured)


def test_decode_step_with_kv_cache(kit, tiny_spec, tiny_model, tiny_batch):
    b = tiny_batch
    cache = kit.cache_kwarg(tiny_model)
    with torch.no_grad():
        prefill = tiny_model(
            **b.vision_inputs(b.prefix_ids),
            position_ids=b.positions[..., : b.prefix_tokens],
            use_cache=True,
            logits_to_keep=1,
        )
        kv = prefill.past_key_values
        token = prefill.logits[:, -1].argmax(-1, keepdim=True)
        pos = (b.prefix_tokens + b.rope_delta).view(1, -1, 1).expand(3, -1, 1)
        measured, _ = kit.count_flops(
            lambda: tiny_model(
                input_ids=token, position_ids=pos, use_cache=True, logits_to_keep=1, **{cache: kv}
            )
        )
    assert kv.get_seq_length() == b.prefix_tokens + 1  # the step used and grew the cache
    formula = F.decode_step(tiny_spec, b.sequences, b.prefix_tokens).flops
    assert_matches("decode_step", formula, measured)


def test_logprob_full(kit, tiny_spec, tiny_model, tiny_batch):
    b = tiny_batch
    P, R = b.prefix_tokens, b.response_tokens
    with torch.no_grad():
        measured, _ = kit.count_flops(
            lambda: tiny_model(
                **b.vision_inputs(b.full_ids), position_ids=b.positions, logits_to_keep=R + 1
            )
        )
    formula = vision_flops(tiny_spec, [b.grid] * b.sequences)
    formula += F.logprob(tiny_spec, b.sequences, P, R, "full").flops
    assert_matches("vision + logprob full", formula, measured)


def test_logprob_prefix_then_response_with_cache(kit, tiny_spec, tiny_model, tiny_batch):
    b = tiny_batch
    P, R = b.prefix_tokens, b.response_tokens
    cache = kit.cache_kwarg(tiny_model)
    with torch.no_grad():
        full = tiny_model(
            **b.vision_inputs(b.full_ids), position_ids=b.positions, logits_to_keep=R + 1
        )
        prefix_flops, prefix = kit.count_flops(
            lambda: tiny_model(
                **b.vision_inputs(b.prefix_ids),
                position_ids=b.positions[..., :P],
                use_cache=True,
                logits_to_keep=1,
            )
        )
        response_flops, response = kit.count_flops(
            lambda: tiny_model(
                input_ids=b.response_ids,
                position_ids=b.positions[..., P:],
                use_cache=True,
                logits_to_keep=R,
                **{cache: prefix.past_key_values},
            )
        )
    # The split computes the same logits as the full forward: cache and positions are right.
    split = torch.cat([prefix.logits, response.logits], 1)
    torch.testing.assert_close(split, full.logits, atol=1e-4, rtol=1e-4)
    # Response positions are arange(P, P+R) + rope_delta on all three axes (FACTS.md).
    expect = (torch.arange(P, P + R) + b.rope_delta).expand(3, -1, -1)
    assert torch.equal(b.positions[..., P:], expect)

    vision = vision_flops(tiny_spec, [b.grid] * b.sequences)
    pre = F.logprob(tiny_spec, b.sequences, P, R, "prefix")
    resp = F.logprob(tiny_spec, b.sequences, P, R, "response")
    assert_matches("vision + logprob prefix", vision + pre.flops, prefix_flops)
    assert_matches("logprob response", resp.flops, response_flops)


def _train_forward(model, batch, *, checkpointing: bool):
    """The actor's training forward with a frozen vision tower; returns the loss."""
    model.model.visual.requires_grad_(False)
    if checkpointing:
        model.gradient_checkpointing_enable()
        # HF also makes the input embeddings (the frozen ViT's patch embed too) require grad,
        # a PEFT convenience that drags the frozen tower into the backward; not needed with
        # the non-reentrant checkpoint, and not what the formula models.
        model.disable_input_require_grads()
    model.train()
    R = batch.response_tokens
    out = model(
        **batch.vision_inputs(batch.full_ids),
        position_ids=batch.positions,
        logits_to_keep=R + 1,
        use_cache=False,
    )
    logp = out.logits[:, :-1].log_softmax(-1).gather(-1, batch.response_ids[..., None])
    return -logp.sum()


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_backward(kit, tiny_spec, checkpointing):
    model = kit.build(tiny_spec)
    b = kit.batch(model, tiny_spec)
    loss = _train_forward(model, b, checkpointing=checkpointing)
    measured, _ = kit.count_flops(loss.backward)
    assert all(p.grad is None for p in model.model.visual.parameters())
    assert model.lm_head.weight.grad is not None
    formula = F.backward(
        tiny_spec,
        b.sequences,
        b.prefix_tokens,
        b.response_tokens,
        "full",
        checkpointing=checkpointing,
    ).flops
    assert_matches(f"backward ({'checkpointed' if checkpointing else 'plain'})", formula, measured)


def test_backward_of_split_prefix_and_response(kit, tiny_spec):
    """Training split as prefix (cache kept) + response: gradients flow through the cache."""
    model = kit.build(tiny_spec)
    b = kit.batch(model, tiny_spec)
    model.model.visual.requires_grad_(False)
    model.train()
    P, R = b.prefix_tokens, b.response_tokens
    cache = kit.cache_kwarg(model)
    prefix = model(
        **b.vision_inputs(b.prefix_ids),
        position_ids=b.positions[..., :P],
        use_cache=True,
        logits_to_keep=1,
    )
    response = model(
        input_ids=b.response_ids,
        position_ids=b.positions[..., P:],
        use_cache=True,
        logits_to_keep=R,
        **{cache: prefix.past_key_values},
    )
    logits = torch.cat([prefix.logits, response.logits[:, :-1]], 1)
    loss = -logits.log_softmax(-1).gather(-1, b.response_ids[..., None]).sum()
    measured, _ = kit.count_flops(loss.backward)
    formula = sum(
        F.backward(tiny_spec, b.sequences, P, R, part, checkpointing=False).flops
        for part in ("prefix", "response")
    )
    assert_matches("backward prefix + response", formula, measured)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_vision_backward_when_trainable(kit, tiny_spec, checkpointing):
    model = kit.build(tiny_spec)
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    grids = [(1, 16, 16), (1, 8, 12)]
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), tiny_spec.vision.patch_dim)
    features = model.model.visual(pixels, grid_thw=torch.tensor(grids)).pooler_output
    measured, _ = kit.count_flops(features.square().sum().backward)
    formula = sum(
        F.vision_backward(
            tiny_spec,
            1,
            t * h * w,
            temporal_patches=t,
            grid_hw=(h, w),
            checkpointing=checkpointing,
        ).flops
        for t, h, w in grids
    )
    label = f"vision_backward ({'checkpointed' if checkpointing else 'plain'})"
    assert_matches(label, formula, measured)


def test_decode_rollout_equals_its_counted_steps(kit, tiny_spec, tiny_model):
    """A fixed-length rollout costs its prefill-less steps, each as the counter sees it."""
    from rollplex.specs import WorkloadSpec
    from rollplex.specs.workload import ResponseLengthSpec

    b = kit.batch(tiny_model, tiny_spec, sequences=2, response=4)
    P = b.prefix_tokens
    workload = WorkloadSpec(
        prompts_per_step=1,
        group_size=2,
        visual_tokens_per_frame=P - 16,
        text_tokens=16,
        response_length=ResponseLengthSpec(distribution="fixed", mean=4, max=4),
    )
    assert workload.prefix_tokens(tiny_spec.vision) == P
    cache = kit.cache_kwarg(tiny_model)
    measured = 0
    with torch.no_grad():
        out = tiny_model(
            **b.vision_inputs(b.prefix_ids),
            position_ids=b.positions[..., :P],
            use_cache=True,
            logits_to_keep=1,
        )
        kv = out.past_key_values
        steps = 0
        while kv.get_seq_length() < P + b.response_tokens - 1:  # token 0 came from the prefill
            s = kv.get_seq_length()
            pos = (s + b.rope_delta).view(1, -1, 1).expand(3, -1, 1)
            ids = b.response_ids[:, s - P : s - P + 1]
            flops, out = kit.count_flops(
                lambda ids=ids, pos=pos: tiny_model(
                    input_ids=ids,
                    position_ids=pos,
                    use_cache=True,
                    logits_to_keep=1,
                    **{cache: kv},
                )
            )
            measured += flops
            steps += 1
    rollout = F.decode_rollout(tiny_spec, workload, prompts=1)
    assert rollout.steps == steps == 3
    assert_matches("decode_rollout (fixed 4 tokens)", rollout.cost.flops, measured)


@pytest.mark.parametrize("frames", [2, 8, 16, 32])
def test_video_vision_flops_of_the_graph_within_1pct(kit, tiny_spec, tiny_model, frames: int):
    """The vision_encode op of a built step, priced from its pixels value's (t, h, w), against
    the counter on the same video: attention runs within each frame, not over all frames."""
    from rollplex.algos import build_step
    from rollplex.ops.costs import CostContext, op_cost
    from rollplex.specs import AlgoSpec, WorkloadSpec

    work = WorkloadSpec(
        prompts_per_step=1, group_size=2, frames=frames, height=224, width=224, text_tokens=8
    )
    graph = build_step(tiny_spec, work, AlgoSpec())
    op = graph.ops["rollout.vision_encode"]
    t, h, w = graph.values[op.inputs["pixels"]].shape[1:4]
    assert (t, h, w) == (frames // 2, 16, 16)
    formula = op_cost(graph, op, CostContext(tiny_spec, work)).flops
    pixels = torch.randn(t * h * w, tiny_spec.vision.patch_dim)
    grid = torch.tensor([[t, h, w]])
    measured, _ = kit.count_flops(lambda: tiny_model.model.visual(pixels, grid_thw=grid))
    print(f"{frames} frames: formula/counter = {formula / measured:.5f}")
    assert formula / measured == pytest.approx(1.0, abs=0.01)
