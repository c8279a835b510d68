"""`rollplex train`: GRPO/RLOO/PPO on a model folder and a dataset, every step one plan.

Before any model loads it prepares the data and measures the workload, plans once and builds
the roles from `backend.*`; the executor then applies the plan at every step. Run folder
contents: README.md; torchrun and disaggregated pools: docs/architecture.md (Jobs).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rollplex.data.rewards import accuracy_scorer
from rollplex.engine import phases
from rollplex.jobs.train_checks import check_spec
from rollplex.jobs.train_outputs import (
    Scalars,
    eval_summary,
    export_traces,
    metrics_row,
    run_summary,
    step_line,
    write_csv,
)
from rollplex.runtime.compile_cache import use_compile_cache
from rollplex.runtime.evaluate import evaluate
from rollplex.specs.run import RunSpec
from rollplex.trace import write_scalars

log = logging.getLogger(__name__)


def run_train(spec: RunSpec, out: Path) -> dict[str, Any]:
    from rollplex.jobs.pricing import pricing_for, report_prediction, resolve_auto
    from rollplex.jobs.sizing import size_for_run

    spec = size_for_run(spec, out)  # the device's hardware, GPU defaults, the response cap
    spec = resolve_auto(spec, out)  # calibration=auto: an earlier run's file, or the default
    first_phase = phases.mark()  # summary.json lists this run's one-time phases
    if spec.backend.trainer == "fsdp":
        from rollplex.backends.fsdp.checks import world_spec

        spec = world_spec(spec)  # the plan is made for torchrun's world
    check_spec(spec)
    t = spec.train
    from rollplex.jobs.prepare import prepare  # validates folder, data and reward first

    prepared = prepare(spec, eval_split=t.eval_every > 0)
    import torch

    if t.device.startswith("cuda"):  # before anything compiles (runtime/compile_cache.py)
        use_compile_cache(prepared.model, torch.cuda.get_device_name(torch.device(t.device)))

    from rollplex.runtime.checkpoint import read_checkpoint

    if t.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(t.deterministic)
    if t.threads:
        torch.set_num_threads(t.threads)
    # Validate the checkpoint before building anything: a bad one costs nothing.
    if t.resume and spec.backend.trainer == "fsdp":
        from rollplex.runtime.dcp_checkpoint import read_dcp_checkpoint

        ckpt = read_dcp_checkpoint(t.resume, prepared.model, spec.seed)
    else:
        ckpt = read_checkpoint(t.resume, prepared.model, spec.seed) if t.resume else None
    summary = _train(spec, prepared, out, ckpt)
    summary["priced_by"] = pricing_for(spec).source  # which constants priced the plan
    report_prediction(summary)
    summary["phases"] = [
        {"name": p.name, "seconds": p.seconds} for p in phases.records(first_phase)
    ]
    return summary


def _train(spec: RunSpec, prepared, out: Path, ckpt) -> dict[str, Any]:
    from rollplex.backends import rollout_capabilities, trainer_capabilities
    from rollplex.backends.step import StepConfig
    from rollplex.jobs.pipeline import plan_step
    from rollplex.jobs.plan import cost_model_for
    from rollplex.planner.plan import dump_plan
    from rollplex.runtime import Executor, Progress
    from rollplex.runtime.compose import compose
    from rollplex.runtime.engine_residency import engine_kv_budget
    from rollplex.runtime.profile import step_profiler
    from rollplex.trace import open_writer

    t = spec.train
    model, workload = prepared.model, prepared.workload
    caps = rollout_capabilities(spec.backend)  # the planner plans only what it can do
    sleep = {"auto": None, "always": True, "never": False}[spec.backend.vllm.sleep]
    result = plan_step(
        model,
        workload,
        spec.algo,
        spec.hardware,
        spec.schedule,
        cost_model=cost_model_for(spec),  # measured op times when `calibration` is given
        rollout=caps,
        engine_sleep=sleep,
        trainer=trainer_capabilities(spec.backend, spec.hardware.num_gpus),
    )
    plan, graph = result.plan, result.graph
    config = StepConfig(
        model,
        spec.algo,
        spec.seed,
        t.max_new_tokens,
        device=t.device,
        scorer=prepared.scorer,
        forced_lengths=workload.response_length if t.response_lengths == "workload" else None,
    )
    engine_kv = engine_kv_budget(plan)  # the plan's KV pool for an engine rollout
    fsdp = spec.backend.trainer == "fsdp"
    pools = _pools(plan, workload) if fsdp else None  # checked before any model loads
    if pools is not None:
        from rollplex.runtime.compose import build_pool_backend

        backend = build_pool_backend(config, spec.backend, pools)
    else:
        with phases.phase("model load"):
            backend = compose(
                config,
                spec.backend,
                workdir=out,
                **({"kv_cache_bytes": engine_kv} if engine_kv else {}),
            )
    info = backend.dist if pools is not None else getattr(backend.trainer, "dist", None)
    main = not fsdp or info.is_main  # only rank 0 writes the run folder
    if fsdp:
        from rollplex.backends.distributed import from_rank0, setup_rank_logging

        out = Path(from_rank0(str(out)))  # one run folder for all ranks
        setup_rank_logging(out, info)
        if pools is not None:
            log.info("%s", pools.describe())
    if main:
        (out / "plan.json").write_text(dump_plan(plan))
    log.info(
        "plan '%s' (dedup=%s, overlap=%s): %d steps on %d streams; %s",
        plan.schedule,
        spec.schedule.dedup,
        spec.schedule.overlap,
        sum(len(d.steps) for d in plan.devices),
        sum(len(d.streams) for d in plan.devices),
        "; ".join(plan.notes) or "no overlap",
    )
    from rollplex.backends.torch.loss import group_of_one_note

    if note := group_of_one_note(spec.algo.name, spec.workload.group_size):
        log.warning("%s", note)
    start = 0
    if ckpt is not None:
        _restore(fsdp, backend, ckpt, pools)
        if pools is None:  # a rollout pool gets them from the first step's weights transfer
            backend.rollout.load_weights(backend.trainer.live_weights())
        start = ckpt.state.step
        log.info("resumed from %s at step %d", ckpt.folder, start)
        if start >= t.steps:
            log.info("the checkpoint already reaches train.steps=%d: nothing to run", t.steps)
    data = prepared.train
    tb = out / "tb"
    writer = open_writer(tb) if main else None
    progress = Progress(t.steps, initial=start, disable=not (t.progress and main))
    step_level = logging.DEBUG if t.progress and main else logging.INFO
    callbacks = [progress, Scalars(writer)] if main else [progress]
    executor = Executor(plan, graph, backend, callbacks, device=backend.device, pools=pools)
    recent: deque = deque(maxlen=t.trace_steps)
    rows: list[dict[str, Any]] = []
    ckpt_root, last_ckpt = out / "checkpoints", None
    evals: list[tuple[int, Any]] = []

    def held_out(step: int) -> float | None:
        # A full local rollout model on every rank: rank 0 evaluates alone. A TP rollout
        # (rollout_sync=share) decodes in lockstep over its group: every rank runs the same
        # prompts, rank 0 logs. A rollout pool first takes the trainers' latest weights.
        if t.eval_every <= 0 or prepared.eval_source is None:
            return None
        if executor.pooled is not None:
            executor.pooled.sync_weights()
        lockstep = getattr(getattr(backend, "rollout", None), "group", None) is not None
        if not (main or lockstep):
            return None
        res = evaluate(
            backend,
            prepared.eval_source,
            prepared.renderer,
            t.eval_prompts,
            t.max_new_tokens,
            score=accuracy_scorer(spec.reward),  # the run's own reward; exact match beside
        )
        if not main:
            return None
        evals.append((step, res))
        scalars = {
            "eval/accuracy": res.accuracy,
            "eval/exact_match": res.exact_match_accuracy,
            "eval/majority_accuracy": res.majority_accuracy,  # the baseline beside it
        }
        write_scalars(writer, scalars, step=step)
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

    if start < t.steps:
        held_out(start)
    prof = None  # torch.profiler over exactly the steps `recent` keeps
    try:
        for k in range(start, t.steps):
            if t.profile and main and prof is None and k >= t.steps - t.trace_steps:
                prof = step_profiler(backend.device)
                prof.start()
            with phases.phase("first step (warm-up)") if k == start else nullcontext():
                res = executor.run_step(k, data.step(k))
            recent.append(res)
            if prof is not None and k + 1 == t.steps:
                prof.stop()
            row = metrics_row(res)
            if t.eval_every > 0 and ((k + 1) % t.eval_every == 0 or k + 1 == t.steps):
                row["eval_accuracy"] = held_out(k + 1)
            rows.append(row)
            # a line per step where no progress bar shows the metrics (benchmarks, ranks)
            log.log(step_level, "step %d/%d: %s", k + 1, t.steps, step_line(row))
            if t.checkpoint_every and ((k + 1) % t.checkpoint_every == 0 or k + 1 == t.steps):
                last_ckpt = _save(fsdp, backend, ckpt_root, k + 1, model, spec.seed, pools)
                log.info("checkpoint %s (reward %.3f)", last_ckpt, res.metrics.get("reward", 0))
    finally:
        progress.close()
        shutdown = getattr(backend.rollout, "shutdown", None)
        if callable(shutdown):  # an engine: free it, another may start in this process
            shutdown()
    # pools: the bytes and seconds every transfer moved, gathered from all ranks
    transfers = executor.pooled.report() if executor.pooled is not None else None
    if not main:
        _close(pools)
        return run_summary(spec, plan, rows, start, ckpt, ckpt_root, last_ckpt, recent)
    write_csv(out / "metrics.csv", rows)
    if recent:
        export_traces(out, tb, writer, spec, plan, graph, list(recent), prof)
    writer.close()
    summary = run_summary(spec, plan, rows, start, ckpt, ckpt_root, last_ckpt, recent)
    summary.update(eval_summary(evals))
    if transfers is not None:
        summary["transfers"] = transfers
    summary["workload_measured"] = {
        "visual_tokens": prepared.shape.visual_tokens,
        "text_tokens": prepared.shape.text_tokens,
        "frames": prepared.shape.frames,
    }
    if summary["first_mean_reward"] is not None:
        first = min(10, len(rows))  # run_summary's first mean: this run's first rows
        line = (
            f"mean reward {summary['first_mean_reward']:.3f} (steps {start + 1}-{start + first})"
            f" -> {summary['final_mean_reward']:.3f} (last {summary['final_mean_reward_over']})"
        )
        if evals:
            line += (
                f"; held-out accuracy {summary['eval_accuracy_first']:.3f} -> "
                f"{summary['eval_accuracy_last']:.3f} (always '{summary['majority_answer']}': "
                f"{summary['majority_accuracy']:.3f})"
            )
        print(f"{line}; run folder {out} (tensorboard --logdir {out})")
    _close(pools)
    return summary


def _close(pools) -> None:
    """Pooled ranks leave together: a rank that exits while another still writes the run
    folder must not tear down connections that rank's process group holds."""
    if pools is not None:
        from rollplex.backends.distributed import barrier, shutdown

        barrier()
        shutdown()


def _restore(fsdp: bool, backend, ckpt, pools=None) -> None:
    if fsdp:
        from rollplex.runtime.dcp_checkpoint import restore_dcp

        if pools is not None:  # the training pool holds the state; the rollout pool none
            if backend.trainer is not None:
                restore_dcp(backend.trainer, ckpt, group=backend.trainer.mesh.get_group())
            return
        restore_dcp(backend.trainer, ckpt)
    else:
        from rollplex.runtime.checkpoint import restore

        restore(backend.trainer, ckpt)


def _pools(plan, workload):
    """This rank's pool of a plan of several device groups (schedule=disaggregated);
    None for a colocated plan. PoolError (a ValueError) if the world cannot run it."""
    from rollplex.planner.pools import is_pooled, pools_for, torchrun_world

    if not is_pooled(plan):
        return None
    rank, world = torchrun_world()
    return pools_for(plan, rank, world, workload.prompts_per_step)


def _save(fsdp: bool, backend, root: Path, step: int, model, seed: int, pools=None) -> Path:
    if fsdp:
        from rollplex.runtime.dcp_checkpoint import save_dcp_checkpoint

        if pools is not None:  # the training pool writes it; the rollout pool holds no state
            if backend.trainer is None:
                return root / f"step-{step:06d}"
            group = backend.trainer.mesh.get_group()
            return save_dcp_checkpoint(root, step, backend.trainer, model, seed, group=group)
        return save_dcp_checkpoint(root, step, backend.trainer, model, seed)
    from rollplex.runtime.checkpoint import save_checkpoint

    return save_checkpoint(root, step, backend.trainer, model, seed)
