"""`rollplex train`: GRPO/RLOO/PPO on a model folder and a dataset, every step one plan.

Before any model loads it prepares the data and measures the workload, plans once and builds
the roles from `backend.*`; the executor then applies the plan at every step. Run folder
contents: README.md; torchrun and disaggregated pools: docs/architecture.md (Jobs).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from rollplex.engine import phases
from rollplex.jobs.train_loop import Steps, TrainRun, close_pools, run_steps
from rollplex.jobs.train_outputs import (
    eval_summary,
    export_traces,
    final_line,
    run_summary,
    write_csv,
)
from rollplex.jobs.validate_run import RunChecks, run_facts, validate_run
from rollplex.runtime.compile_cache import use_compile_cache
from rollplex.specs.run import RunSpec

log = logging.getLogger(__name__)


def run_train(spec: RunSpec, out: Path) -> dict[str, Any]:
    """Prepare, plan, build the roles, run the steps, write the run folder."""
    from rollplex.jobs.pricing import pricing_for, report_prediction

    first_phase = phases.mark()  # summary.json lists this run's one-time phases
    spec, checks = _accept(spec, out)  # every refusal, before anything loads
    prepared, ckpt = _prepare(spec)
    result = _plan(spec, prepared)
    run = _build_roles(spec, prepared, result, checks, out)
    steps = run_steps(run, ckpt)
    summary = _write(run, steps, ckpt)
    close_pools(run.pools)
    summary["priced_by"] = pricing_for(spec).source  # which constants priced the plan
    report_prediction(summary)
    summary["phases"] = [
        {"name": p.name, "seconds": p.seconds} for p in phases.records(first_phase)
    ]
    return summary


def _accept(spec: RunSpec, out: Path) -> tuple[RunSpec, RunChecks]:
    """The spec the run runs: checked once (jobs/validate_run.py), sized for the device,
    planned for torchrun's world, its `calibration=auto` resolved."""
    from rollplex.jobs.pricing import resolve_auto
    from rollplex.jobs.sizing import record_sizing

    checks = validate_run(spec, run_facts(spec))
    record_sizing(spec, checks.sized, checks.notes, out)
    return resolve_auto(checks.spec, out), checks  # auto: an earlier run's file, or none


def _prepare(spec: RunSpec):
    """(folder, data and reward opened and measured; the resume checkpoint validated
    first, against the folder's model: a bad one costs no data scan and no model)."""
    from rollplex.jobs.prepare import model_folder, prepare

    t = spec.train
    folder = model_folder(spec)
    ckpt = _resume_checkpoint(spec, folder.spec) if t.resume else None
    prepared = prepare(spec, eval_split=t.eval_every > 0, folder=folder)
    import torch

    if t.device.startswith("cuda"):  # before anything compiles (runtime/compile_cache.py)
        use_compile_cache(prepared.model, torch.cuda.get_device_name(torch.device(t.device)))
    if t.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(t.deterministic)
    if t.threads:
        torch.set_num_threads(t.threads)
    return prepared, ckpt


def _resume_checkpoint(spec: RunSpec, model: Any):
    """`train.resume` read and validated against `model` (the folder's spec); PPO trains
    a critic, so its checkpoint must hold one."""
    resume, critic = spec.train.resume, spec.algo.name == "ppo"
    if spec.backend.trainer == "fsdp":
        from rollplex.runtime.dcp_checkpoint import read_dcp_checkpoint

        return read_dcp_checkpoint(resume, model, spec.seed, critic=critic)
    from rollplex.runtime.checkpoint import read_checkpoint

    return read_checkpoint(resume, model, spec.seed, critic=critic)


def _plan(spec: RunSpec, prepared):
    """One plan for every step, made from the measured workload for the chosen roles."""
    from rollplex.backends.torch.loss import group_of_one_note
    from rollplex.jobs.plan import plan_for

    sleep = {"auto": None, "always": True, "never": False}[spec.backend.vllm.sleep]
    result = plan_for(spec, prepared.model, prepared.workload, engine_sleep=sleep)
    plan = result.plan
    log.info(
        "plan '%s' (dedup=%s, overlap=%s): %d steps on %d streams; %s",
        plan.schedule,
        spec.schedule.dedup,
        spec.schedule.overlap,
        sum(len(d.steps) for d in plan.devices),
        sum(len(d.streams) for d in plan.devices),
        "; ".join(plan.notes) or "no overlap",
    )
    if note := group_of_one_note(spec.algo.name, spec.workload.group_size):
        log.warning("%s", note)
    if not spec.algo.use_reference:
        log.info("no reference model: no KL term reads it (algo.kl_coef=%g)", spec.algo.kl_coef)
    return result


def _build_roles(spec: RunSpec, prepared, result, checks: RunChecks, out: Path) -> TrainRun:
    """The roles the plan runs on (a pool's under schedule=disaggregated and fsdp), and the
    run folder this rank writes to (rank 0's; plan.json there)."""
    from rollplex.planner.plan import dump_plan
    from rollplex.runtime.compose import compose
    from rollplex.runtime.engine_residency import engine_kv_budget

    plan, fsdp = result.plan, spec.backend.trainer == "fsdp"
    config = _step_config(spec, prepared)
    pools = _pools(plan, prepared.workload, checks) if fsdp else None
    if pools is not None:
        from rollplex.runtime.compose import build_pool_backend

        backend = build_pool_backend(config, spec.backend, pools)
    else:
        engine_kv = engine_kv_budget(plan)  # the plan's KV pool for an engine rollout
        with phases.phase("model load"):
            kv = {"kv_cache_bytes": engine_kv} if engine_kv else {}
            backend = compose(config, spec.backend, workdir=out, **kv)
    main = True
    if fsdp:  # one run folder for all ranks; only rank 0 writes it
        from rollplex.backends.distributed import from_rank0, setup_rank_logging

        info = backend.dist if pools is not None else backend.trainer.dist
        main, out = info.is_main, Path(from_rank0(str(out)))
        setup_rank_logging(out, info)
        if pools is not None:
            log.info("%s", pools.describe())
    if main:
        (out / "plan.json").write_text(dump_plan(plan))
    return TrainRun(spec, prepared, plan, result.graph, backend, pools, out, main)


def _step_config(spec: RunSpec, prepared):
    from rollplex.backends.step import StepConfig

    t = spec.train
    return StepConfig(
        prepared.model,
        spec.algo,
        spec.seed,
        t.max_new_tokens,
        device=t.device,
        scorer=prepared.scorer,
        forced_lengths=prepared.workload.response_length
        if t.response_lengths == "workload"
        else None,
    )


def _pools(plan, workload, checks: RunChecks):
    """This rank's pool of a plan of several device groups (schedule=disaggregated); None
    for a colocated plan. PoolError (a ValueError) if the plan's groups cannot run on the
    world `validate_run` read."""
    from rollplex.planner.pools import is_pooled, pools_for

    if not is_pooled(plan):
        return None
    return pools_for(plan, checks.rank, checks.world, workload.prompts_per_step)


def _write(run: TrainRun, steps: Steps, ckpt) -> dict[str, Any]:
    """metrics.csv, the traces and summary.json's numbers (rank 0); a summary on every rank."""
    spec, plan, out = run.spec, run.plan, run.out
    rows, recent = steps.rows, list(steps.recent)
    ckpts = (out / "checkpoints", steps.last_ckpt)
    if not run.main:
        return run_summary(spec, plan, rows, steps.start, ckpt, *ckpts, recent)
    write_csv(out / "metrics.csv", rows)
    if recent:
        export_traces(out, out / "tb", steps.writer, spec, plan, run.graph, recent, steps.prof)
    steps.writer.close()
    summary = run_summary(spec, plan, rows, steps.start, ckpt, *ckpts, recent)
    summary.update(eval_summary(steps.evals))
    if steps.transfers is not None:
        summary["transfers"] = steps.transfers
    shape = run.prepared.shape
    summary["workload_measured"] = {
        "visual_tokens": shape.visual_tokens,
        "text_tokens": shape.text_tokens,
        "frames": shape.frames,
    }
    if summary["first_mean_reward"] is not None:
        print(final_line(summary, len(rows), steps.start, bool(steps.evals), out))
    return summary
