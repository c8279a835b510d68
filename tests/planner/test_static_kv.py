"""The torch engine's static decode workspace, priced: the formula equals the bytes the
engine allocates (over prompts, group sizes, prefix lengths and caps, bucket edges
included), and a plan with the torch rollout holds it all step (the engine keeps its
buffers and graphs for the next step), once per decode however many segments it has;
a rollout that decodes otherwise (FSDP2's share mode, vLLM) holds no such pool."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.model import build_model
from rollplex.engine.prefix import PrefixState, fork_cache
from rollplex.engine.session import DecodeEngine
from rollplex.jobs.pipeline import plan_step
from rollplex.ops.formulas import (
    engine_kv_pool,
    torch_engine_fused_qkv,
    torch_engine_workspace,
)
from rollplex.ops.formulas.engines import engine_prompts
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.roles import FSDP_ROLLOUTS, TORCH_ROLLOUT, VLLM_ROLLOUT

TINY = MODEL_PRESETS["tiny"]


def _prefix(model, prompts: int, tokens: int) -> PrefixState:
    text = model.config.text_config
    shape = (
        prompts,
        text.num_key_value_heads,
        tokens,
        text.hidden_size // text.num_attention_heads,
    )
    kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(text.num_hidden_layers)]
    lengths = torch.full((prompts,), tokens)
    return PrefixState(
        cache=fork_cache(kv),
        last_logits=torch.zeros(prompts, text.vocab_size),
        attention_mask=torch.ones(prompts, tokens, dtype=torch.long),
        next_positions=lengths.clone(),
        rope_deltas=torch.zeros(prompts, dtype=torch.long),
        lengths=lengths,
    )


@pytest.mark.parametrize("attention", ["sdpa", "flex", "split"])
@pytest.mark.parametrize(
    ("prompts", "group", "tokens", "cap"),
    [(1, 1, 5, 2), (2, 4, 40, 9), (3, 3, 64, 16), (4, 8, 65, 33), (40, 8, 17, 4), (5, 16, 120, 7)],
)
@pytest.mark.parametrize("keep", [False, True], ids=["plain", "decode_once"])
def test_formula_equals_what_the_engine_allocates(prompts, group, tokens, cap, attention, keep):
    """Decode once adds the kept layer outputs at the real rows, as the plan prices them
    (the training forward's saved inputs, decode_once.py), never at the bucket's padded
    rows: (3, 3) and (5, 16) run 9 and 80 rows in the 16 and 128 buckets."""
    model = build_model(TINY, seed=0)
    engine = DecodeEngine(model, keep_workspace=True, attention=attention)
    prefix = _prefix(model, prompts, tokens)
    engine.start(prefix, group, cap, 0.0, 1.0, None, -1, keep_outputs=keep)
    held = sum(t.numel() * t.element_size() for t in engine.workspace.tensors())
    # every tensor counted once: none is a view of another
    assert len({t.untyped_storage().data_ptr() for t in engine.workspace.tensors()}) == len(
        engine.workspace.tensors()
    )
    text = model.config.text_config
    columns = max(cap - 1, 1)  # the last token is never fed
    kept = text.num_hidden_layers * prompts * group * columns * text.hidden_size * 4  # fp32
    formula = torch_engine_workspace(TINY, prompts, group, tokens, cap, attention=attention)
    assert formula + (kept if keep else 0) == held


def _pools(caps, **schedule) -> dict[str, int]:
    planned = plan_step(
        TINY,
        WORKLOAD_PRESETS["tiny"],
        AlgoSpec(),
        HARDWARE_PRESETS["cpu"],
        ScheduleSpec(**schedule),
        rollout=caps,
    )
    (dev,) = planned.plan.devices
    return {s.value: s.size for s in dev.slots if s.value.endswith(".kv_pool")}


@pytest.mark.parametrize(
    "schedule",
    [{"name": "serial"}, {"name": "rollplex", "overlap": "piggyback", "chunk_tokens": 40}],
)
def test_plans_hold_the_workspace_all_step_once(schedule):
    workload = WORKLOAD_PRESETS["tiny"]
    (pool,) = _pools(TORCH_ROLLOUT, **schedule).values()  # one, however many segments
    expected = torch_engine_workspace(
        TINY,
        workload.prompts_per_step,
        workload.group_size,
        workload.prefix_tokens(TINY.vision),
        workload.response_length.max,
    ) + torch_engine_fused_qkv(TINY)  # and the engine's stacked q/k/v weights
    assert pool == int(expected)
    assert not _pools(FSDP_ROLLOUTS["share"], **schedule)  # the eager loop: no static pool
    (vllm,) = _pools(VLLM_ROLLOUT, **schedule).values()  # vLLM's paged pool, not this one
    assert vllm == int(
        engine_kv_pool(TINY, workload, workload.prompts_per_step, workload.group_size)
    )


def test_rows_past_128_pad_by_less_than_64():
    """The buckets the engine and the plan share (engine_prompts): up to 128 rows a power
    of two (at least 8, under twice the rows), past it less than 64 padding rows, then up
    to whole groups. At 24 prompts x G = 8 the 192 rows were decoded and held as 256."""
    assert engine_prompts(24, 8) == 24 and engine_prompts(48, 8) == 48
    for group in (1, 2, 4, 5, 8, 16):
        for prompts in range(1, 80):
            rows, held = prompts * group, engine_prompts(prompts, group) * group
            assert held >= rows
            bound = rows + 64 if rows > 128 else max(8, 2 * rows)  # the bucket, at most
            assert held < bound + group, (prompts, group)
