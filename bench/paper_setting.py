"""The paper's setting, on paper: Qwen2.5-VL-32B, a video workload, 32 GPUs of 80 GB.

Plans the same GRPO graph under verl's serial schedule, serial with dedup, disaggregated
and rollplex, all with the default cost and interference models (FACTS.md's H200
measurements, not tuned to the paper), and writes a markdown report.

    python bench/paper_setting.py --out bench/results/paper_setting.md
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from rollplex.jobs.baselines import plan_fitting
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.schedules.memory_options import needs_note
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)

GIB = 1 << 30
KIND_LABEL = {
    "weights": "FSDP shards: actor bf16 params, reference, frozen vision tower",
    "rollout_weights": "rollout TP copy of the actor (and its rebuild)",
    "optimizer_state": "AdamW fp32 master + moments (FSDP shard)",
    "grad": "gradients (FSDP shard)",
    "kv_cache": "prefix KV cache (rollout) / prefix K/V (reference)",
    "boundary": "kept prefix activations for backward",
    "activation": "activations, logprobs, responses",
    "host_data": "pixels and prompt tokens on the GPU",
    "scratch": "op scratch (decode's live response KV, layer working sets)",
}


def plan(
    name: str,
    dedup: bool = True,
    strategy: str = "greedy_by_size",
    prompts: int = 256,
    options: bool = True,
) -> PlanResult:
    """A schedule with its memory options (jobs/baselines.py: the fastest variant that
    fits), rollplex's as the baselines', unless `options` is off."""
    work = WORKLOAD_PRESETS["video"].model_copy(update={"prompts_per_step": prompts})
    args = (
        MODEL_PRESETS["qwen2_5_vl_32b"],
        work,
        AlgoSpec(),
        HARDWARE_PRESETS["h800x32"],
        ScheduleSpec(name=name, dedup=dedup, memory_strategy=strategy),
    )
    if options:
        return plan_fitting(*args)  # budget not enforced: a misfit is reported as such
    return plan_step(*args, enforce_budget=False)


def by_kind(r: PlanResult) -> dict[str, int]:
    dev = max(r.plan.devices, key=lambda d: d.peak_bytes)
    out: dict[str, int] = defaultdict(int)
    for s in dev.slots:
        out[s.value_kind] += s.size
    return out


def phase_times(r: PlanResult) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for d in r.plan.devices:
        for s in d.steps:
            out[s.phase] = max(out[s.phase], s.end_s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--prompts", type=int, default=256, help="prompts per step (G = 8)")
    args = ap.parse_args()
    runs = {
        "serial (verl: prefix per sample and per phase)": plan(
            "serial", False, prompts=args.prompts
        ),
        "serial + dedup passes": plan("serial", True, prompts=args.prompts),
        "disaggregated (best split)": plan("disaggregated", True, prompts=args.prompts),
        "rollplex": plan("rollplex", True, prompts=args.prompts),
    }
    naive = plan("serial", False, "naive", prompts=args.prompts, options=False)
    t = {k: r.plan.step_time_s for k, r in runs.items()}
    keys = list(runs)
    roll = t["rollplex"]

    def peak(key: str) -> float:
        return runs[key].plan.peak_bytes_per_gpu / GIB

    lines = [
        f"# The paper's setting on paper (`python bench/paper_setting.py "
        f"--prompts {args.prompts}`)",
        "",
        f"Qwen2.5-VL-32B, video: 16 frames at 448x448 (2,048 visual + 256 text tokens), "
        f"{args.prompts} prompts x G=8 per step, responses lognormal mean 256 / max 1024; "
        "32 x H800 80 GB (79.6 GiB usable), 4 nodes. Times are the planner's predictions "
        "(simulated), not measurements.",
        "",
        "## Step time",
        "",
        "| schedule | step (s) | rollplex speedup | peak GiB/GPU | fits 79.6 GiB | decisions |",
        "|---|---|---|---|---|---|",
    ]
    for k in keys:
        r = runs[k]
        notes = "; ".join(r.plan.notes)
        ratio = f"{t[k] / roll:.2f}x" if r.plan.fits_budget else needs_note(r.plan)
        lines.append(
            f"| {k} | {t[k]:.2f} | {ratio} | "
            f"{r.plan.peak_bytes_per_gpu / GIB:.1f} | {r.plan.fits_budget} | {notes} |"
        )
    lines += [
        "",
        "Paper (32 x H800): rollplex 1.23-1.30x over serial colocation and "
        "1.57-2.24x over disaggregation.",
        "",
    ]
    lines += [
        "## Where the time goes (end of each phase on the critical device, s)",
        "",
        "| schedule | rollout | reference | train | update |",
        "|---|---|---|---|---|",
    ]
    for k in keys:
        p = phase_times(runs[k])
        lines.append(
            f"| {k} | "
            + " | ".join(
                f"{p.get(ph, 0):.2f}" for ph in ("rollout", "reference", "train", "update")
            )
            + " |"
        )
    lines += [
        "",
        "## Memory per GPU, item by item",
        "",
        "Naive: every tensor of the verl step resident at once for the whole step (the "
        "`naive` strategy: no lifetime reuse, no phase-aware frees). Planned: the "
        "lifetime-aware greedy assignment of the same tensors.",
        "",
        "| item | naive (verl serial) GiB | planned verl serial GiB | planned rollplex GiB |",
        "|---|---|---|---|",
    ]
    nk, sk, rk = by_kind(naive), by_kind(runs[keys[0]]), by_kind(runs["rollplex"])
    for kind in KIND_LABEL:
        lines.append(
            f"| {KIND_LABEL[kind]} | {nk.get(kind, 0) / GIB:.1f} | "
            f"{sk.get(kind, 0) / GIB:.1f} (sum of slots) | "
            f"{rk.get(kind, 0) / GIB:.1f} (sum of slots) |"
        )
    lines.append(
        f"| **total / peak** | **{naive.plan.peak_bytes_per_gpu / GIB:.1f}** | "
        f"**{runs[keys[0]].plan.peak_bytes_per_gpu / GIB:.1f}** peak | "
        f"**{runs['rollplex'].plan.peak_bytes_per_gpu / GIB:.1f}** peak |"
    )
    lines += [
        "",
        "## Reading",
        "",
        f"- Naive colocation is {naive.plan.peak_bytes_per_gpu / GIB:.0f} GiB per GPU "
        "here, the paper reports ~165 GiB: training state is FSDP-sharded over all 32 "
        "GPUs (16 B/param / 32) and the KV cache is sized by the workload, but every "
        "training micro-batch's saved layer inputs are held until the backward (the "
        "graph runs the forward of all of them first), and verl's per-sample forward "
        "saves the 2,304-token prefix once per sample: "
        f"{peak(keys[0]):.1f} GiB planned for verl's step, "
        f"{'within' if runs[keys[0]].plan.fits_budget else 'over'} the budget.",
        "- Deduplication, not overlap, is the big lever: verl's serial step recomputes "
        "the 2,304-token prefix for each of the 8 samples in two phases.",
        "- Overlap beside decode earns little under FACTS.md's H200 measurements (two "
        "streams 1.01x, SM partitions about the same), and piggybacking the actor's "
        "prefix rows is priced for the one decode step a chunk rides (a 2,304-token "
        "chunk is many steps of compute and shares one weight read: "
        "bench/results/gpu_piggyback/). So rollplex over serial+dedup is "
        f"{t[keys[1]] / roll:.2f}x here, against the paper's 1.23-1.30x over serial "
        "colocation; the paper's baseline and interference are not ours.",
        "- Disaggregation loses because a synchronous on-policy step leaves each pool "
        "idle while the other works; the best split is searched (pool size x TP) and "
        "must fit its training state"
        + ("." if runs[keys[2]].plan.fits_budget else f": none does ({peak(keys[2]):.1f} GiB)."),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
