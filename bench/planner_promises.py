"""The planner's promises, checked on grids rather than points (a benchmark, not a test).

1. Never slower, at any scale: Qwen2.5-VL-32B video GRPO on 32 ... 4096 H800s, and 72B on
   64: rollplex against verl's serial step (prefix per sample and per phase) and serial with
   the same dedup, with the choice the planner made for each phase's forward: one packed
   forward (prefix + responses, one weight gather), or split with its prefix in the decode
   window (piggyback / streams / partition).
2. Never slower, at any budget where serial fits: models x workloads x scales x HBM budgets
   (fractions of serial+dedup's unconstrained peak, plus the 29.5 GiB of issue 11). Where
   serial+dedup fits, rollplex must fit and be no slower; where verl's serial fits, the same.
3. Planned peak / lower bound on every preset combination model x workload x hardware that
   fits, for every schedule.

    OMP_NUM_THREADS=1 python bench/planner_promises.py --out bench/results/planner_promises.md
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.residency import PlanOverBudget
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    HardwareSpec,
    ScheduleSpec,
)

GIB = 1 << 30
BASELINES = {"verl": ("serial", False), "serial_dedup": ("serial", True)}
SCALES = [("qwen2_5_vl_32b", g) for g in (32, 64, 128, 256, 1024, 4096)] + [("qwen2_5_vl_72b", 64)]
BUDGET_FRACTIONS = (0.6, 0.8, 0.9, 0.97, 1.0, 1.03, 1.2)
GRID_SCALES = {"h200x8": (8, 64), "h800x32": (32, 256, 1024)}


def hardware(name: str, gpus: int | None = None, hbm_gib: float | None = None) -> HardwareSpec:
    update: dict = {}
    if gpus is not None:
        update["num_gpus"] = gpus
    if hbm_gib is not None:
        update["hbm_gib"] = hbm_gib
    return HARDWARE_PRESETS[name].model_copy(update=update)


def plan(
    model: str, workload: str, hw: HardwareSpec, name: str, dedup: bool = True, enforce=True
) -> PlanResult | None:
    try:
        return plan_step(
            MODEL_PRESETS[model],
            WORKLOAD_PRESETS[workload],
            AlgoSpec(),
            hw,
            ScheduleSpec(name=name, dedup=dedup),
            enforce_budget=enforce,
        )
    except PlanOverBudget:
        return None
    except ValueError as err:  # e.g. disaggregated on one GPU
        if "GPU" in str(err) or "hold" in str(err):
            return None
        raise


def phase_choices(r: PlanResult) -> dict[str, str]:
    """How each phase ran its forward: 'packed' (prefix + responses, one gather), the
    co-run mode its prefix took in the decode window, or 'split' (serial, unpackable)."""
    out = {}
    packed = " ".join(n for n in r.plan.notes if "packed forward" in n)
    for op in r.graph:
        if op.kind != "logprob_prefix":
            continue
        coruns = {s.corun.value for s in r.plan.all_steps() if s.op == op.name}
        coruns.discard("none")
        if coruns:
            out[str(op.phase)] = "split, prefix " + "/".join(sorted(coruns))
        else:
            out[str(op.phase)] = "packed" if f"{op.name} +" in packed else "split"
    return out


def peak(r: PlanResult) -> float:
    return max(d.peak_bytes for d in r.plan.devices) / GIB


def offloads(r: PlanResult) -> int:
    return sum(1 for s in r.plan.all_steps() if s.kind == "offload")


def scale_table() -> list[str]:
    lines = [
        "| model | GPUs | verl-serial | serial+dedup | rollplex | vs serial+dedup | vs verl "
        "| reference forward | train forward | rollout TP | peak GiB (rollplex / s+d) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, gpus in SCALES:
        hw = hardware("h800x32", gpus)
        v = plan(model, "video", hw, "serial", False, enforce=False)
        sd = plan(model, "video", hw, "serial", True, enforce=False)
        rp = plan(model, "video", hw, "rollplex", True, enforce=False)
        assert v and sd and rp
        ch = phase_choices(rp)
        t = rp.plan.step_time_s
        lines.append(
            f"| {model.removeprefix('qwen2_5_vl_')} | {gpus} | {v.plan.step_time_s:.2f} s "
            f"| {sd.plan.step_time_s:.2f} s | {t:.2f} s | {sd.plan.step_time_s / t:.3f}x "
            f"| {v.plan.step_time_s / t:.3f}x | {ch.get('reference', '-')} "
            f"| {ch.get('train', '-')} | {rp.plan.devices[0].tp} "
            f"| {peak(rp):.2f} / {peak(sd):.2f} |"
        )
    return lines


def budget_grid() -> tuple[list[str], int, int]:
    lines = [
        "| model | workload | hardware x GPUs | HBM GiB | verl-serial | serial+dedup | rollplex "
        "| rollplex offloads | holds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    checked = broken = 0
    for model in ("qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen2_5_vl_32b", "qwen2_5_vl_72b"):
        for workload in ("image", "video"):
            for hw_name, scales in GRID_SCALES.items():
                for gpus in scales:
                    roomy = plan(model, workload, hardware(hw_name, gpus, 1e6), "serial")
                    if roomy is None:
                        continue
                    p = peak(roomy)
                    budgets = [round(p * f, 2) for f in BUDGET_FRACTIONS]
                    if model == "qwen2_5_vl_32b" and (hw_name, gpus) == ("h800x32", 32):
                        budgets.append(29.5)
                    for hbm in sorted(set(budgets)):
                        hw = hardware(hw_name, gpus, hbm)
                        runs = {
                            k: plan(model, workload, hw, n, d) for k, (n, d) in BASELINES.items()
                        }
                        if all(r is None for r in runs.values()):
                            continue
                        rp = plan(model, workload, hw, "rollplex")
                        ok = rp is not None and all(
                            r is None or rp.plan.step_time_s <= r.plan.step_time_s * (1 + 1e-9)
                            for r in runs.values()
                        )
                        checked += 1
                        broken += not ok

                        def cell(r: PlanResult | None) -> str:
                            return "does not fit" if r is None else f"{r.plan.step_time_s:.2f} s"

                        lines.append(
                            f"| {model.removeprefix('qwen2_5_vl_')} | {workload} "
                            f"| {hw_name} x {gpus} | {hbm:.2f} | {cell(runs['verl'])} "
                            f"| {cell(runs['serial_dedup'])} | {cell(rp)} "
                            f"| {offloads(rp) if rp else '-'} | {'yes' if ok else '**NO**'} |"
                        )
    return lines, checked, broken


def memory_table() -> tuple[list[str], float]:
    schedules = [
        ("verl-serial", "serial", False),
        ("serial+dedup", "serial", True),
        ("disaggregated", "disaggregated", True),
        ("rollplex", "rollplex", True),
    ]
    lines = [
        "| model | workload | hardware | " + " | ".join(s[0] for s in schedules) + " |",
        "|---|---|---|" + "---|" * len(schedules),
    ]
    worst = 0.0
    for model in MODEL_PRESETS:
        for workload in WORKLOAD_PRESETS:
            for hw_name in HARDWARE_PRESETS:
                cells = []
                for _, name, dedup in schedules:
                    r = plan(model, workload, hardware(hw_name), name, dedup)
                    if r is None:
                        cells.append("-")
                        continue
                    ratio = max(d.peak_bytes / max(1, d.lower_bound_bytes) for d in r.plan.devices)
                    worst = max(worst, ratio)
                    cells.append(f"{ratio:.3f}")
                if any(c != "-" for c in cells):
                    row = " | ".join(cells)
                    lines.append(f"| {model} | {workload} | {hw_name} | {row} |")
    return lines, worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.process_time()
    out = [
        "# The planner's promises on grids",
        "",
        "Command, from the repository root:",
        "",
        "```",
        "OMP_NUM_THREADS=1 python bench/planner_promises.py "
        "--out bench/results/planner_promises.md",
        "```",
        "",
        f"python {platform.python_version()}; predicted step times from the default cost and "
        "interference models (FACTS.md's H200 measurements), H800 presets.",
        "",
        "## 1. Never slower, at any scale (32B video; 72B video on 64 GPUs)",
        "",
        "Unconstrained by the budget check (as `rollplex plan` reports its baselines). "
        "'packed': prefix and responses as one forward with one FSDP weight gather; "
        "'split, prefix piggyback': the prefix rides the decode steps on the rollout's weights.",
        "",
        *scale_table(),
        "",
    ]
    grid, checked, broken = budget_grid()
    out += [
        "## 2. Never slower, at any budget where serial fits",
        "",
        f"Budgets are {', '.join(str(f) for f in BUDGET_FRACTIONS)} x serial+dedup's peak with "
        "unlimited HBM, plus 29.5 GiB for 32B on 32 GPUs. Rows where neither serial fits are "
        f"left out. **{checked - broken} of {checked} hold.**",
        "",
        *grid,
        "",
    ]
    mem, worst = memory_table()
    out += [
        "## 3. Planned peak / lower bound on every preset combination that fits",
        "",
        f"Default schedule settings, budget enforced ('-': does not fit). Worst: **{worst:.3f}**.",
        "",
        *mem,
        "",
        f"CPU time for the whole report: {time.process_time() - t0:.0f} s.",
    ]
    text = "\n".join(out) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
