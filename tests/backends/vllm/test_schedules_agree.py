"""The schedules agree with a vLLM rollout: 3 GRPO steps with `backend.rollout=vllm` train
the same parameters under the serial and the rollplex schedule.

What differs between the two plans is where and when ops run: rollplex moves the
reference's and the trainer's prefix work into the engine's decode window on a side
stream (nothing rides the engine's decode: it cannot host rows). The engine sees the same
prompts, weights and per-row seeds in both runs, so it samples the same tokens, and the
torch side runs the same ops on the same rows. Tolerance: bit for bit (torch.equal), as
for the torch rollout with streams; the test fails on any difference.
"""

from __future__ import annotations

import pytest
import torch

from rollplex.backends import rollout_capabilities
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.backends.vllm.build import kv_budget
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.runtime.engine_residency import engine_kv_budget
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.backend import BackendSpec
from tests.backends.vllm.conftest import ENGINE, needs_vllm

pytestmark = needs_vllm
MODEL, WORKLOAD, CPU = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], HARDWARE_PRESETS["cpu"]
ALGO = AlgoSpec(lr=1e-3)
SPEC = BackendSpec(rollout="vllm", vllm=ENGINE)
STEPS = 3


def _run(schedule: ScheduleSpec, workdir, rollout=None):
    planned = plan_step(MODEL, WORKLOAD, ALGO, CPU, schedule, rollout=rollout_capabilities(SPEC))
    config = StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4)
    pixels = WORKLOAD.height * WORKLOAD.width
    kv = engine_kv_budget(planned.plan)  # as the train job passes it
    dispatch = compose(
        config, SPEC, workdir=workdir, rollout=rollout, max_pixels=pixels, kv_cache_bytes=kv
    )
    executor = Executor(planned.plan, planned.graph, dispatch)
    data = TaskData(MODEL, WORKLOAD, seed=0)
    versions, results = [], []
    for k in range(STEPS):
        results.append(executor.run_step(k, data.step(k)))
        versions.append(dispatch.rollout.weights_version)
    params = {n: p.detach().clone() for n, p in dispatch.trainer.model.named_parameters()}
    return planned, dispatch, results, versions, params


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.use_deterministic_algorithms(True)
    try:
        serial = _run(ScheduleSpec(name="serial"), tmp_path_factory.mktemp("serial"))
        engine = serial[1].rollout  # one engine for both runs: its start is the slow part
        rp = _run(
            # any predicted gain: at this tiny step overlap saves under overlap_min_gain
            ScheduleSpec(name="rollplex", overlap="auto", overlap_min_gain=0.0),
            tmp_path_factory.mktemp("rp"),
            rollout=engine,
        )
        yield serial, rp
        engine.shutdown()
    finally:
        torch.use_deterministic_algorithms(False)


def test_the_plans_fit_the_engine(runs):
    for planned, *_ in runs:
        steps = [s for d in planned.plan.devices for s in d.steps]
        kinds = {s.kind for s in steps}
        assert "generate" in kinds and "prefix_prefill" not in kinds and "decode" not in kinds
        assert not any(s.corun.value == "piggyback" for s in steps)
        sync = [s for s in steps if s.kind == "weight_sync"]
        assert len(sync) == 1 and planned.graph.ops[sync[0].op].attrs["mode"] == "load"
    # the engine's KV cache is the serial plan's pool (it started there), in fp32, and at
    # least one max_model_len sequence
    planned, dispatch = runs[0][0], runs[0][1]
    kv = dispatch.rollout.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes
    assert kv == kv_budget(MODEL, ENGINE, engine_kv_budget(planned.plan)) > 0
    rp = runs[1][0].plan.devices[0].steps
    side = [s for s in rp if s.corun.value in ("streams", "partition")]
    assert side and all(s.phase in ("reference", "train") for s in side)


def test_weights_reach_the_engine_after_every_step(runs):
    for _, _, results, versions, _ in runs:
        assert versions == [f"policy@{k + 1}" for k in range(STEPS)]
        for r in results:
            synced = [m for m in r.steps if m.step.kind == "weight_sync"]
            assert len(synced) == 1 and synced[0].end_s > synced[0].start_s


def test_serial_and_rollplex_train_the_same_parameters(runs):
    (_, _, s_res, _, a), (_, _, r_res, _, b) = runs
    assert any(r.metrics["reward"] > 0 for r in s_res)  # a learning signal
    start = {n: p.detach() for n, p in compose_initial().items()}
    assert max((a[n] - start[n]).abs().max().item() for n in a) > 1e-4  # the weights moved
    assert [r.metrics for r in s_res] == [r.metrics for r in r_res]
    assert all(torch.equal(a[n], b[n]) for n in a)


def compose_initial() -> dict[str, torch.Tensor]:
    from rollplex.backends.torch.backend import build_trainer

    trainer = build_trainer(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    return dict(trainer.model.named_parameters())
