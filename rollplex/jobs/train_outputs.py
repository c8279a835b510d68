"""What a `rollplex train` run writes into its run folder besides checkpoints: one metrics
row per RL step (`metrics.csv`; a run-log line where no progress bar shows it),
TensorBoard scalars (each metric as train/<name>, and under verl's key where verl has one:
VERL_NAMES, e.g. clip_frac as actor/pg_clipfrac), the planned and measured timelines with
their planned-vs-measured table, `calibration.json` (measured op times in the cost model's
format) and the numbers `summary.json` holds."""

from __future__ import annotations

import csv
import statistics
from math import isnan
from pathlib import Path
from typing import Any

from rollplex.runtime.callbacks import Callback
from rollplex.specs.run import RunSpec
from rollplex.trace import write_scalars

# algo.rollout_correction's (else empty): the rollout engine against the trainer; verl logs
# them under rollout_corr/ (its rollout_corr_helper)
ROLLOUT_CORRECTION = (
    "mismatch_kl",  # mean log pi_rollout - log pi_old over the sampled tokens
    "mismatch_k3_kl",
    "rollout_is_mean",  # IS weights before truncation, and the shares out of range
    "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low",
    "rollout_rs_masked_fraction",  # valid tokens rejected (by rollout_rs or the veto)
    "rollout_is_veto_fraction",  # responses vetoed
)
CSV_FIELDS = (
    "step",
    "reward",
    "kl",  # the loss term's KL (= loss_kl; kept for older readers)
    "loss",
    "pg_loss",
    "clip_frac",
    "clip_frac_lower",
    "loss_kl",  # the KL term of the loss (0 when the run puts the KL only in the reward)
    "reward_kl",  # kl_in_reward: the per-token KL the rewards were penalised by (else empty)
    "ppo_kl",
    "entropy",  # the policy's per-token entropy, aggregated as the loss is (verl's actor/entropy)
    "ppo_updates",  # policy optimizer steps this RL step (algo.ppo_mini_batch_size, ppo_epochs)
    "response_length",
    "response_clip_ratio",  # the share of responses that ran to train.max_new_tokens
    "lr",  # the policy's learning rate at the step's last update
    "eval_accuracy",
    "step_time_s",
    "peak_resident_bytes",
    "cuda_step_peak_bytes",  # the CUDA allocator's peak in the step (else empty)
    "engine_sleep_s",  # an engine rollout's plan-driven sleep and wake-ups (else empty)
    "engine_wake_s",
    "train_micro_batches",  # the training micro-batches run (the plan's count, see executor)
    "trained_rows",  # algo.skip_zero_advantage: rows trained, not skipped (else empty)
    *ROLLOUT_CORRECTION,
)


class Scalars(Callback):
    """Per RL step scalars into TensorBoard."""

    def __init__(self, writer) -> None:
        self.writer = writer

    def on_rl_step_end(self, result) -> None:
        values = {f"train/{k}": v for k, v in result.metrics.items()}
        values |= {VERL_NAMES[k]: v for k, v in result.metrics.items() if k in VERL_NAMES}
        values["train/step_time_s"] = result.seconds
        values["memory/peak_resident_gib"] = max(result.peak_resident_bytes.values()) / 2**30
        if result.allocator_step_peak is not None:
            values["memory/cuda_step_peak_gib"] = result.allocator_step_peak / 2**30
        write_scalars(self.writer, values, step=result.rl_step + 1)


def cuda_peak(device: str, recent: list) -> int | None:
    """What the CUDA caching allocator held at most in the run (None on CPU): the RL
    steps' windows up to the last one's end (`StepResult.allocator_run_peak`), and torch's
    own peak, which holds what came after the last window opened."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    since_last = int(torch.cuda.max_memory_allocated(torch.device(device)))
    windows = recent[-1].allocator_run_peak if recent else None
    return max(since_last, windows or 0)


def eval_summary(evals: list[tuple[int, Any]]) -> dict[str, Any]:
    if not evals:
        return {}
    first, last = evals[0][1], evals[-1][1]
    return {
        "eval_accuracy_first": first.accuracy,
        "eval_accuracy_last": last.accuracy,
        "eval_scored_by": last.scored_by,  # the run's own reward (runtime/evaluate.py)
        "eval_exact_match_first": first.exact_match_accuracy,
        "eval_exact_match_last": last.exact_match_accuracy,
        "eval_prompts": last.prompts,
        "majority_answer": last.majority_answer,
        "majority_accuracy": last.majority_accuracy,
        "eval_examples": [list(e) for e in last.examples],
    }


# The same scalars under verl's metric keys too (TensorBoard), so its dashboards carry over.
VERL_NAMES = {
    "pg_loss": "actor/pg_loss",
    "clip_frac": "actor/pg_clipfrac",
    "clip_frac_lower": "actor/pg_clipfrac_lower",
    "ppo_kl": "actor/ppo_kl",
    "entropy": "actor/entropy",
    "loss_kl": "actor/kl_loss",
    "reward_kl": "actor/reward_kl_penalty",
    "reward_kl_coef": "actor/reward_kl_penalty_coeff",
    "vf_loss": "critic/vf_loss",
    "vf_clip_frac": "critic/vf_clipfrac",
    "reward": "critic/score/mean",
    "response_length": "response_length/mean",
    "response_clip_ratio": "response_length/clip_ratio",
    "lr": "actor/lr",
} | {k: f"rollout_corr/{k}" for k in ROLLOUT_CORRECTION}


def metrics_row(res) -> dict[str, Any]:
    m = res.metrics
    row: dict[str, Any] = {k: m.get(k, "") for k in CSV_FIELDS}
    row.update(
        step=res.rl_step + 1,
        eval_accuracy="",
        step_time_s=res.seconds,
        peak_resident_bytes=max(res.peak_resident_bytes.values()),
        cuda_step_peak_bytes="" if res.allocator_step_peak is None else res.allocator_step_peak,
    )
    return row


def step_line(row: dict[str, Any]) -> str:
    """One step's metrics for the run log (reward, KL, loss, time, peak)."""
    keys = ("reward", "kl", "reward_kl", "loss")  # reward_kl: only a kl_in_reward run's
    # (a step that trained no row, skip_zero_advantage, has no KL of trained rows: NaN)
    shown = [k for k in keys if isinstance(row.get(k), float) and not (k == "kl" and isnan(row[k]))]
    parts = [f"{k} {row[k]:.4g}" for k in shown]
    parts.append(f"{row['step_time_s']:.2f} s")
    parts.append(f"peak resident {row['peak_resident_bytes'] / 2**30:.2f} GiB")
    if isinstance(row.get("cuda_step_peak_bytes"), int):
        parts.append(f"allocator peak {row['cuda_step_peak_bytes'] / 2**30:.2f} GiB")
    if isinstance(row.get("train_micro_batches"), float):
        parts.append(f"{row['train_micro_batches']:.0f} micro-batches")
    if isinstance(row.get("trained_rows"), float):
        parts.append(f"{row['trained_rows']:.0f} rows trained")
    return ", ".join(parts)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(rows)


def export_traces(
    out: Path, tb: Path, writer, spec: RunSpec, plan, graph, recent: list, prof=None
) -> None:
    """Planned and measured timelines into one TensorBoard run, and the calibration file."""
    from rollplex.jobs.pricing import UNCALIBRATED, device_name, pricing_for, provenance
    from rollplex.ops.costs import CostContext, op_cost
    from rollplex.runtime import write_measured_calibration
    from rollplex.runtime.profile import TABLE, comparison_image, export_run
    from rollplex.trace import write_image, write_text

    device = spec.train.device
    export_run(tb, plan, recent, prof, device_name=device, planned_device_name=spec.hardware.gpu)
    write_text(writer, "timeline/planned_vs_measured", (tb / TABLE).read_text())
    priced_by = pricing_for(spec).source  # the panel's header: what priced the plan
    png = comparison_image(  # the Images tab's planned-vs-measured panel
        plan, recent, calibrated=None if priced_by == UNCALIBRATED else priced_by,
        device_name=device, planned_device_name=spec.hardware.gpu,
    )  # fmt: skip
    (tb / "planned_vs_measured.png").write_bytes(png)
    write_image(writer, "timeline/planned_vs_measured", png)

    def cost(step) -> tuple[float, float]:
        op = graph.ops[step.op]
        micro = plan.meta.get("train_micro_batches", 1)  # rows a trained forward runs together
        ctx = CostContext(spec.model, spec.workload, dp=step.chunks, micro_batches=micro)
        c = op_cost(graph, op, ctx)
        return c.flops, c.bytes

    # with where it was measured: the device's name, the model shape, the software
    name = device_name(device)
    write_measured_calibration(out / "calibration.json", name, recent, cost, provenance(spec))


def run_summary(spec: RunSpec, plan, rows, start, ckpt, ckpt_root, last_ckpt, recent) -> dict:
    rewards = [r["reward"] for r in rows if r["reward"] != ""]
    tail = rewards[-10:]
    measured_peak = max((max(r.peak_resident_bytes.values()) for r in recent), default=0)
    return {
        "steps": spec.train.steps,
        "start_step": start,
        "steps_run": len(rows),
        "final_mean_reward": statistics.fmean(tail) if tail else None,
        "final_mean_reward_over": len(tail),
        "first_mean_reward": statistics.fmean(rewards[:10]) if rewards else None,
        "checkpoint_dir": str(ckpt_root),
        "last_checkpoint": str(last_ckpt) if last_ckpt else None,
        "resumed_from": str(ckpt.folder) if ckpt else None,
        "schedule": plan.schedule,
        "dedup": spec.schedule.dedup,
        "overlap": spec.schedule.overlap,
        "median_step_time_s": statistics.median(r["step_time_s"] for r in rows) if rows else None,
        "plan_peak_bytes": plan.peak_bytes_per_gpu,
        "plan_step_time_s": plan.step_time_s,
        "cuda_max_memory_allocated": cuda_peak(spec.train.device, recent),
        "measured_peak_resident_bytes": measured_peak,
        "decisions": plan.notes,
    }


def final_line(summary: dict, rows: int, start: int, evals: bool, out: Path) -> str:
    """The run's last line: mean reward first -> last (and held-out accuracy), its folder."""
    first = min(10, rows)  # run_summary's first mean: this run's first rows
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
    return f"{line}; run folder {out} (tensorboard --logdir {out})"
