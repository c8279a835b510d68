"""The train job's step loop: resume, run the plan's steps with held-out evaluation,
checkpoints and the profiler window, and leave what the run folder is written from.

Under FSDP2 checkpoints are DCP (runtime/dcp_checkpoint.py); with pools the training pool
writes and restores them, and a rollout pool gets the weights by the first step's transfer.
"""

from __future__ import annotations

import logging
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollplex.data.rewards import accuracy_scorer
from rollplex.engine import phases
from rollplex.jobs.train_outputs import Scalars, metrics_row, step_line
from rollplex.runtime.evaluate import evaluate
from rollplex.specs.run import RunSpec
from rollplex.trace import write_scalars

log = logging.getLogger("rollplex.jobs.train")  # the train job's step lines, as before


@dataclass(slots=True)
class TrainRun:
    """A run whose roles are built: what the loop and the run folder's writer need."""

    spec: RunSpec
    prepared: Any  # jobs/prepare.Prepared
    plan: Any  # planner/plan.Plan
    graph: Any  # the graph the plan runs
    backend: Any  # the RoleDispatch (or a pool's)
    pools: Any  # planner/pools.Pools of a pooled plan, else None
    out: Path  # the run folder (rank 0's under torchrun)
    main: bool  # this rank writes the run folder

    @property
    def fsdp(self) -> bool:
        return self.spec.backend.trainer == "fsdp"


@dataclass(slots=True)
class Steps:
    """What the loop leaves for the run folder."""

    start: int  # the first step run (a resumed run's checkpoint step)
    writer: Any  # TensorBoard writer (None off rank 0)
    recent: deque  # the last train.trace_steps step results
    rows: list[dict[str, Any]] = field(default_factory=list)  # metrics.csv
    evals: list[tuple[int, Any]] = field(default_factory=list)  # (step, held-out result)
    last_ckpt: Path | None = None
    prof: Any = None  # torch.profiler over exactly the steps `recent` keeps
    transfers: Any = None  # pools: the bytes and seconds every transfer moved


def run_steps(run: TrainRun, ckpt) -> Steps:
    """Steps from the checkpoint's (or 0) to train.steps, evaluating before the first."""
    from rollplex.runtime import Executor, Progress
    from rollplex.trace import open_writer

    t = run.spec.train
    start = _resume(run, ckpt)
    writer = open_writer(run.out / "tb") if run.main else None
    steps = Steps(start, writer, deque(maxlen=t.trace_steps))
    progress = Progress(t.steps, initial=start, disable=not (t.progress and run.main))
    callbacks = [progress, Scalars(steps.writer)] if run.main else [progress]
    b = run.backend
    executor = Executor(run.plan, run.graph, b, callbacks, device=b.device, pools=run.pools)
    if start < t.steps:
        held_out(run, executor, steps, start)
    try:
        for k in range(start, t.steps):
            _one_step(run, executor, steps, k)
    finally:
        progress.close()
        shutdown = getattr(b.rollout, "shutdown", None)
        if callable(shutdown):  # an engine: free it, another may start in this process
            shutdown()
    steps.transfers = executor.pooled.report() if executor.pooled is not None else None
    return steps


def _one_step(run: TrainRun, executor, steps: Steps, k: int) -> None:
    t = run.spec.train
    if t.profile and run.main and steps.prof is None and k >= t.steps - t.trace_steps:
        from rollplex.runtime.profile import step_profiler

        steps.prof = step_profiler(run.backend.device)
        steps.prof.start()
    with phases.phase("first step (warm-up)") if k == steps.start else nullcontext():
        res = executor.run_step(k, run.prepared.train.step(k))
    steps.recent.append(res)
    if steps.prof is not None and k + 1 == t.steps:
        steps.prof.stop()
    row = metrics_row(res)
    if t.eval_every > 0 and ((k + 1) % t.eval_every == 0 or k + 1 == t.steps):
        row["eval_accuracy"] = held_out(run, executor, steps, k + 1)
    steps.rows.append(row)
    # a line per step where no progress bar shows the metrics (benchmarks, ranks)
    level = logging.DEBUG if t.progress and run.main else logging.INFO
    log.log(level, "step %d/%d: %s", k + 1, t.steps, step_line(row))
    if t.checkpoint_every and ((k + 1) % t.checkpoint_every == 0 or k + 1 == t.steps):
        steps.last_ckpt = _save(run, run.out / "checkpoints", k + 1)
        log.info("checkpoint %s (reward %.3f)", steps.last_ckpt, res.metrics.get("reward", 0))


def held_out(run: TrainRun, executor, steps: Steps, step: int) -> float | None:
    """Greedy accuracy on the held-out split, logged at `step` (None where not run).

    A full local rollout model on every rank: rank 0 evaluates alone. A TP rollout
    (rollout_sync=share) decodes in lockstep over its group: every rank runs the same
    prompts, rank 0 logs. A rollout pool first takes the trainers' latest weights."""
    t, prepared = run.spec.train, run.prepared
    if t.eval_every <= 0 or prepared.eval_source is None:
        return None
    if executor.pooled is not None:
        executor.pooled.sync_weights()
    lockstep = getattr(getattr(run.backend, "rollout", None), "group", None) is not None
    if not (run.main or lockstep):
        return None
    res = evaluate(
        run.backend,
        prepared.eval_source,
        prepared.renderer,
        t.eval_prompts,
        t.max_new_tokens,
        score=accuracy_scorer(run.spec.reward),  # the run's own reward; exact match beside
    )
    if not run.main:
        return None
    steps.evals.append((step, res))
    scalars = {
        "eval/accuracy": res.accuracy,
        "eval/exact_match": res.exact_match_accuracy,
        "eval/majority_accuracy": res.majority_accuracy,  # the baseline beside it
    }
    write_scalars(steps.writer, scalars, step=step)
    log.info(
        "step %d: held-out accuracy %.3f by %s (exact match %.3f) on %d prompts "
        "(always '%s': %.3f)",
        step,
        res.accuracy,
        res.scored_by,
        res.exact_match_accuracy,
        res.prompts,
        res.majority_answer,
        res.majority_accuracy,
    )
    return res.accuracy


def _resume(run: TrainRun, ckpt) -> int:
    """The checkpoint's state restored into the roles; its step (0 without one)."""
    if ckpt is None:
        return 0
    _restore(run, ckpt)
    if run.pools is None:  # a rollout pool gets them from the first step's weights transfer
        run.backend.rollout.load_weights(run.backend.trainer.live_weights())
    start, last = ckpt.state.step, run.spec.train.steps
    log.info("resumed from %s at step %d", ckpt.folder, start)
    if start >= last:
        log.info("the checkpoint already reaches train.steps=%d: nothing to run", last)
    return start


def _restore(run: TrainRun, ckpt) -> None:
    trainer = run.backend.trainer
    if run.fsdp and run.pools is not None:  # PPO (a critic) is refused under pools
        from rollplex.runtime.dcp_checkpoint import restore_dcp

        if trainer is not None:  # the training pool holds the state; the rollout pool none
            restore_dcp(trainer, ckpt, group=trainer.mesh.get_group())
        return None
    # PPO: the critic the first step would build, built now to take the saved one
    critic = run.backend.build_critic() if ckpt.critic is not None else None
    if run.fsdp:
        from rollplex.runtime.dcp_checkpoint import restore_dcp

        restore_dcp(trainer, ckpt, critic=critic)
    else:
        from rollplex.runtime.checkpoint import restore

        restore(trainer, ckpt, critic)
    if ckpt.state.reward_kl_coef is not None and run.spec.algo.kl_ctrl == "adaptive":
        run.backend.role_free.resume_reward_kl(ckpt.state.reward_kl_coef)


def _save(run: TrainRun, root: Path, step: int) -> Path:
    b, model, seed = run.backend, run.prepared.model, run.spec.seed
    trainer = b.trainer
    if run.fsdp and run.pools is not None:
        from rollplex.runtime.dcp_checkpoint import save_dcp_checkpoint

        if trainer is None:  # the training pool writes it; the rollout pool holds no state
            return root / f"step-{step:06d}"
        group = trainer.mesh.get_group()
        return save_dcp_checkpoint(root, step, trainer, model, seed, group=group)
    kl = b.role_free.reward_kl_coef()
    if run.fsdp:
        from rollplex.runtime.dcp_checkpoint import save_dcp_checkpoint

        return save_dcp_checkpoint(
            root, step, trainer, model, seed, critic=b.critic, reward_kl_coef=kl
        )
    from rollplex.runtime.checkpoint import save_checkpoint

    return save_checkpoint(root, step, trainer, model, seed, critic=b.critic, reward_kl_coef=kl)


def close_pools(pools) -> None:
    """Pooled ranks leave together: a rank that exits while another still writes the run
    folder must not tear down connections that rank's process group holds. The group
    itself stays: a sweep's next job runs in it (a default group made again on torchrun's
    store finds the first one's keys there, and its ranks wait on each other forever)."""
    if pools is not None:
        from rollplex.backends.distributed import barrier

        barrier()
