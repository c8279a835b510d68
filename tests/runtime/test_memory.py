"""The executor carries out the plan's memory effects and stays inside the plan's peak."""

from __future__ import annotations

import pytest
import torch

from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Callback
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD, cached_run, run_schedule

GIB = 1 << 30
SCHEDULES = [
    ScheduleSpec(name="serial"),
    ScheduleSpec(name="serial", dedup=False),
    ScheduleSpec(name="rollplex", overlap="piggyback"),
    ScheduleSpec(name="rollplex", overlap="streams", chunk_tokens=40),
]


def _tight_cpu(share: float = 0.9, schedule: ScheduleSpec | None = None):
    """A budget `share` of the unconstrained peak of `schedule` (default serial), so the
    planner must offload."""
    schedule = schedule or ScheduleSpec(name="serial")
    peak = plan_step(MODEL, WORKLOAD, ALGO, CPU, schedule).plan.devices[0]
    return CPU.model_copy(update={"hbm_gib": share * peak.peak_bytes / GIB})


@pytest.mark.parametrize("share", [None, 0.9, 0.8, 0.7], ids=lambda s: f"budget-{s or 'roomy'}")
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.name}-{s.overlap}-{s.dedup}")
def test_resident_bytes_stay_under_the_planned_peak(schedule, share):
    """Over schedules x budgets (roomy, then 90-70% of the schedule's roomy peak: offloads,
    late onloads, write-backs at the step's start), every step stays inside its plan's
    peak, and a tight budget trains the parameters the roomy one does."""
    hardware = CPU if share is None else _tight_cpu(share, schedule)
    run = cached_run(schedule, hardware)
    planned = run.planned.plan.devices[0].peak_bytes
    assert planned <= run.planned.plan.devices[0].budget_bytes
    measured = [m.resident_bytes for r in run.results for m in r.steps]
    assert 0 < max(measured) <= planned
    if share is not None:
        assert any(s.kind == "offload" for s in run.planned.plan.all_steps())
        a, b = cached_run(schedule).params(), run.params()
        assert all(torch.equal(a[n], b[n]) for n in a)
    # The accounting sees work come and go: the step's largest residents are freed.
    last = run.results[-1].steps
    assert last[-1].resident_after_free < max(m.resident_bytes for m in last)


def test_frees_release_gradients_and_drop_values():
    seen: dict[str, int] = {}

    class Watch(Callback):
        def on_step_end(self, rl_step, measured):
            seen[measured.step.name] = measured.resident_bytes - measured.resident_after_free

    run = run_schedule(ScheduleSpec(name="serial"), steps=1, callbacks=[Watch()])
    grads = sum(p.numel() * 4 for p in run.backend.trainer.params)
    # The plan frees the gradients after the optimizer step: they are really released.
    assert seen["update.optimizer_step"] >= grads
    assert all(p.grad is None for p in run.backend.trainer.params)


def test_offloads_move_weights_to_host_and_back_without_changing_results():
    hw = _tight_cpu()
    run = cached_run(ScheduleSpec(name="serial"), hardware=hw)
    dev = run.planned.plan.devices[0]
    moved = {s.op for s in dev.steps if s.kind == "offload"}
    assert moved and {s.op for s in dev.steps if s.kind == "onload"} == moved
    steps = run.results[-1].steps
    assert max(m.host_bytes for m in steps) > 0  # something really sat on host
    assert max(m.resident_bytes for m in steps) <= dev.peak_bytes <= dev.budget_bytes
    free = cached_run(ScheduleSpec(name="serial"))
    assert max(m.resident_bytes for m in steps) < max(
        m.resident_bytes for m in free.results[-1].steps
    )
    # Copies are exact: the same parameters as without any offload.
    a, b = free.params(), run.params()
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_adamw_state_onloaded_after_the_backward_runs_and_trains_the_same():
    """At 70% of the peak the plan fits only with AdamW's state on host through the
    backward (its onload waits for the backward to end): the run stays inside that plan's
    peak and trains the same parameters as with room to spare."""
    run = cached_run(ScheduleSpec(name="serial"), hardware=_tight_cpu(0.7))
    dev = run.planned.plan.devices[0]
    backward = next(s for s in dev.steps if s.kind == "backward")
    onload = next(s for s in dev.steps if s.kind == "onload" and s.op == "policy.adam")
    assert onload.start_s >= backward.end_s
    assert max(m.resident_bytes for r in run.results for m in r.steps) <= dev.peak_bytes
    assert dev.peak_bytes <= dev.budget_bytes
    a, b = cached_run(ScheduleSpec(name="serial")).params(), run.params()
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_adamw_written_back_at_the_next_steps_start_runs_and_trains_the_same():
    """At 80% of the peak part of AdamW's state waits on host over the step. Its
    write-back is issued first, at the next step's start, so the step ends with the state
    resident and the plan is faster than with the write-back at its end. Over three steps
    the run stays inside the plan's peak, the copies really move the state (each step from
    the second starts with it on device and puts the planned share on host), and it trains
    the same parameters as with room to spare."""
    hw = _tight_cpu(0.8)
    run = cached_run(ScheduleSpec(name="serial"), hardware=hw)
    plan, order = run.planned.plan, run.executor.order
    copies = [s for s in order if s.kind in ("offload", "onload") and s.op == "policy.adam"]
    assert [s.kind for s in copies] == ["offload", "onload"]
    assert order[0] is copies[0] and not copies[0].waits
    assert any(
        n.startswith("write-back at the next step's start: 'policy.adam'") for n in plan.notes
    )
    end = plan_step(MODEL, WORKLOAD, ALGO, hw, ScheduleSpec(name="serial", write_back="step_end"))
    assert end.plan.fits_budget and plan.step_time_s < end.plan.step_time_s
    assert [s.kind for s in end.plan.all_steps() if s.op == "policy.adam"][-1] == "offload"
    dev = plan.devices[0]
    assert max(m.resident_bytes for r in run.results for m in r.steps) <= dev.peak_bytes
    assert dev.peak_bytes <= dev.budget_bytes
    moments = 2 * 4 * sum(p.numel() for p in run.backend.trainer.params)  # exp_avg, exp_avg_sq
    share = copies[0].share  # the part of it the budget needs on host (all, or sixteenths)
    assert 0 < share <= 1 and copies[1].share == share
    for before, r in zip(run.results, run.results[1:], strict=False):
        first = r.steps[0]
        assert first.step.kind == "offload" and first.host_bytes >= share * moments - 1
        assert before.steps[-1].resident_after_free - first.resident_bytes >= share * moments - 1
    a, b = cached_run(ScheduleSpec(name="serial")).params(), run.params()
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_a_run_resumed_between_write_backs_at_the_start_ends_where_the_straight_one_does(
    tmp_path,
):
    """With AdamW's write-back at the next step's start, the state is on the device when a
    step ends, which is when a checkpoint is taken. Saved after 2 steps and restored into a
    fresh backend and executor, whose first step writes the restored state back to host,
    the run ends its third step on the parameters and AdamW state of 3 straight steps."""
    from rollplex.backends.step import StepConfig
    from rollplex.backends.torch.data import TaskData
    from rollplex.runtime import Executor
    from rollplex.runtime.checkpoint import read_checkpoint, restore, save_checkpoint
    from rollplex.runtime.compose import compose

    hw, schedule = _tight_cpu(0.8), ScheduleSpec(name="serial")
    torch.manual_seed(0)
    straight = run_schedule(schedule, steps=3, hardware=hw)
    torch.manual_seed(0)
    first = run_schedule(schedule, steps=2, hardware=hw)
    assert first.planned.plan.all_steps()[0].kind == "offload"  # the write-back at the start
    save_checkpoint(tmp_path / "checkpoints", 2, first.backend.trainer, MODEL, seed=0)
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4, device="cpu"))
    restore(backend.trainer, read_checkpoint(tmp_path, MODEL, seed=0))
    backend.rollout.load_weights(backend.trainer.live_weights())  # as the train job resumes
    executor = Executor(first.planned.plan, first.planned.graph, backend, [], device="cpu")
    executor.run_step(2, TaskData(MODEL, WORKLOAD, seed=0).step(2))
    a = straight.backend.trainer.model.state_dict()
    b = backend.trainer.model.state_dict()
    assert all(torch.equal(a[n], b[n]) for n in a)
    sa = straight.backend.trainer.optimizer.state_dict()["state"]
    sb = backend.trainer.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(
        torch.equal(sa[i][k], sb[i][k]) for i in sa for k in ("exp_avg", "exp_avg_sq")
    )


def test_only_values_a_copy_may_free_are_recorded_on_the_stream_that_reads_them():
    """CUDA's record_stream keeps a block from reuse while a stream may still read it. The
    weights and optimizer state no copy moves are never freed mid-run, so the executor
    records none of their tensors; a value the plan offloads is recorded at each read."""
    from rollplex.runtime.executor import Executor
    from rollplex.runtime.memory import Env

    for hardware, moved in ((CPU, False), (_tight_cpu(), True)):
        planned = plan_step(MODEL, WORKLOAD, ALGO, hardware, ScheduleSpec(name="serial"))
        run = run_schedule(ScheduleSpec(name="serial"), steps=0, hardware=hardware)
        ex: Executor = run.executor
        copied = {s.op for s in planned.plan.all_steps() if s.kind in ("offload", "onload")}
        assert bool(copied) == moved
        weights = {  # weights and optimizer state the run is given
            n
            for n, v in planned.graph.values.items()
            if v.kind.value in ("weights", "optimizer_state") and v.external
        }
        env = Env(device={n: torch.ones(4) for n in planned.graph.values})
        for step in ex.order:
            op = planned.graph.ops.get(step.op)
            if op is None or step.kind in ("offload", "onload", "transfer"):
                continue
            recorded = sum(1 for _ in ex._reads(step, env))
            expected = sum(1 for v in op.inputs.values() if v not in weights or v in copied)
            assert recorded == expected, step.name
