"""The fsdp trainer's step hooks and values in one process (no process group): a rank's
slice of the step, its per-sample generators, and what may not move."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rollplex.backends.base import BackendError
from rollplex.backends.fsdp.build import FsdpHooks, FsdpValues, sample_seed
from rollplex.backends.hooks import StepHooks, decode_seed
from rollplex.backends.step import StepInputs
from rollplex.backends.torch.data import TaskData
from rollplex.backends.torch.handles import OptimizerHandle
from rollplex.data.prompt_media import Media
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS

MODEL = MODEL_PRESETS["tiny"]


def step_inputs(prompts: int) -> StepInputs:
    workload = WORKLOAD_PRESETS["tiny"].model_copy(update={"prompts_per_step": prompts})
    x = TaskData(MODEL, workload, seed=0).step(0)
    media = Media(tuple((f"img{i}",) for i in range(prompts)), tuple([None] * prompts))
    return StepInputs(x.batch, x.answers, media)


def test_each_rank_runs_its_contiguous_slice_of_the_prompts():
    x = step_inputs(4)
    parts = [FsdpHooks(0, r, 2).inputs(0, x) for r in range(2)]
    for r, part in enumerate(parts):
        lo, hi = 2 * r, 2 * r + 2
        assert torch.equal(part.answers, x.answers[lo:hi])
        assert torch.equal(part.batch.input_ids, x.batch.select(lo, hi).input_ids)
        assert part.media.images == x.media.images[lo:hi] and len(part.media.videos) == 2
    with pytest.raises(ValueError, match=r"prompts_per_step=4 does not divide over 3"):
        FsdpHooks(0, 0, 3).inputs(0, x)


def test_a_sample_draws_the_same_tokens_on_any_rank_count():
    x, g = step_inputs(4), 3
    graph = [SimpleNamespace(kind="decode", attrs={"group_size": g})]

    def seeds(world: int) -> list[int]:
        out = []
        for r in range(world):
            hooks = FsdpHooks(7, r, world)
            hooks.bind(graph)
            hooks.inputs(5, x)
            gens = hooks.generator(5, 7, torch.device("cpu"))
            out += [int(torch.randint(1 << 30, (1,), generator=q)) for q in gens]
        return out

    one = seeds(1)
    assert len(one) == 4 * g and one == seeds(2) == seeds(4)
    first = torch.Generator().manual_seed(sample_seed(7, 5, 0))
    assert one[0] == int(torch.randint(1 << 30, (1,), generator=first))


def test_one_process_keeps_the_step_whole():
    x, hooks = step_inputs(4), StepHooks()
    assert hooks.inputs(3, x) is x and hooks.metrics({"a": 1.0}) == {"a": 1.0}
    g = hooks.generator(3, 7, torch.device("cpu"))
    assert g.initial_seed() == decode_seed(7, 3)


def test_sharded_state_is_not_moved():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p])

    def values(device: str) -> FsdpValues:
        dist = SimpleNamespace(device=torch.device(device))
        return FsdpValues(SimpleNamespace(optimizer=opt, params=(p,), dist=dist))

    state = OptimizerHandle(opt)
    assert values("cpu").move(state, "cpu") is state  # host and device are one memory
    with pytest.raises(BackendError, match=r"FSDP2 trainer's OptimizerHandle.*not implemented"):
        values("cuda").move(state, "cpu")
    act = torch.ones(3)
    assert torch.equal(values("cuda").move(act, "cpu"), act)  # activations move as usual
