"""One RL step under every schedule, measured side by side: `rollplex train` in one process,
one model folder, one workload, one seed, the same engine for every schedule.

Schedules (all colocated on one GPU, the torch rollout with the decode engine):
- verl:         schedule=serial schedule.dedup=false schedule.train_micro_fused=true (each
                sample recomputes its prefix in the reference and training phases, and the
                actor runs forward and backward per micro-batch, as verl does);
- serial_dedup: schedule=serial (the prefix once per prompt, phases back to back);
- rollplex:     schedule=rollplex (prefix work moved into the decode window);
- rollplex_streams, rollplex_piggyback (not run by default): ablations with every eligible
                prefix op on a second stream, or riding the decode's steps;
- rollplex_padded (not run by default): the response forwards on rows padded to their
                longest, as before schedule.pack_responses;
- rollplex_end_write_back (not run by default): an offloaded AdamW state written back
                right after the update, as before schedule.write_back;
- rollplex_whole_offload (not run by default): that, with AdamW's state moved whole, as
                before schedule.offload_in_part;
- rollplex_every_row (not run by default): rollplex with algo.skip_zero_advantage=false,
                every row trained (with algo.kl_coef=0 and a reward leaving groups dead,
                bench/dead_groups.py, the timing of the skip);
- serial_dedup_forward (not run by default): serial + dedup with schedule.prefill_once=false,
                its own training prefix forward (serial_dedup and rollplex reuse the
                rollout's prefill where the planner takes it: `decisions`).
The disaggregated schedule needs two GPUs and torchrun: `bench/gpu_disagg.sh`.

Workload: video prompts (synthetic moving shapes, `--frames` frames of `--size`^2 pixels),
`--prompts` x G = `--group`, forced long-tailed response lengths
(`train.response_lengths=workload`: lognormal, `--mean-length`, capped at `--max-length`;
the same draws under every schedule). Every schedule runs `--warmup-steps` steps first,
discarded, so the compilations of this process charge none of the rounds: the code paths
differ (packed or padded rows, verl's per-sample rows), and a path's second step recompiles
its kernels for new widths (automatic dynamic shapes). Each run's first step still pays its
own warm-up (graph capture) and is left out of the medians and of the paired totals (from
`--paired-from`).

A/B rounds (`--rounds`, at least 2; bench/ab.py): every schedule runs once a round, the
order reversed each round (A B C | C B A), so a drift over the process's life lands on both
sides of each ratio. Each ratio (baseline seconds / rollplex seconds over the same steps) is
the mean over rounds with its spread, the half-width over rounds; two schedules whose plans
place the same work (`placement_hash`) are reported `same_plan: true`, not as a speedup.
The JSON keeps every step time in the order run (`step_times`), and the warm-ups' seconds
(`warmup_s`, which `--budget-s` must leave room for).

Prediction: serial_dedup runs first in round 0; the other schedules are planned (and run)
with the op times it measured (`calibration=<its calibration.json>`), so their predicted step times
are out of sample: they test the planner's timeline, not a fit to the run they predict.

    python bench/gpu_step.py --folder /tmp/qwen2_5_vl_3b --shape qwen2_5_vl_3b   # one H200
    python bench/gpu_step.py --device cpu --shape tiny --frames 2 --size 56 --prompts 2 \\
        --group 4 --mean-length 6 --max-length 12 --steps 2                    # dry run

Writes $OUT/gpu_step_<shape>.json (else bench/results/gpu_step/) and prints a table last.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab import compare, paired_seconds, placement_hash, round_orders, round_skip

SCHEDULES = {
    # verl's actor runs forward and backward per micro-batch (its memory option): fused
    "verl": [
        "schedule=serial",
        "schedule.dedup=false",
        "schedule.train_micro_fused=true",
        "schedule.write_back=step_end",
        "schedule.offload_in_part=false",
    ],
    "serial_dedup": ["schedule=serial"],
    "rollplex": ["schedule=rollplex"],
    # ablations: every eligible prefix op on a second CUDA stream beside decode; every
    # eligible chunk riding a decode step's GEMMs (rollplex/engine/riders.py)
    "rollplex_streams": ["schedule=rollplex", "schedule.overlap=streams"],
    "rollplex_piggyback": ["schedule=rollplex", "schedule.overlap=piggyback"],
    # ablation: the response forwards on padded rows (before schedule.pack_responses)
    "rollplex_padded": ["schedule=rollplex", "schedule.pack_responses=false"],
    # ablation: an offloaded AdamW state written back after the update, not at the next
    # step's start (before schedule.write_back)
    "rollplex_end_write_back": ["schedule=rollplex", "schedule.write_back=step_end"],
    # ablation: the offloads of 6ac7f0a: AdamW's state moved whole, written back at the end
    "rollplex_whole_offload": [
        "schedule=rollplex",
        "schedule.write_back=step_end",
        "schedule.offload_in_part=false",
    ],
    # ablation: every row trains (rollplex skips the rows of groups whose advantages are
    # all 0 where no KL or entropy term reads them: algo.skip_zero_advantage; pass
    # algo.kl_coef=0 and a reward with dead groups, bench/dead_groups.py)
    "rollplex_every_row": ["schedule=rollplex", "algo.skip_zero_advantage=false"],
    # serial + dedup before issue 31: its own training prefix and response forwards (the
    # planner otherwise takes them from the rollout's prefill and decode where predicted faster)
    "serial_dedup_forward": [
        "schedule=serial",
        "schedule.prefill_once=false",
        "schedule.decode_once=false",
    ],
}


BASELINES = (
    "serial_dedup",
    "verl",
    "serial_dedup_forward",
    "rollplex_end_write_back",
    "rollplex_whole_offload",
    "rollplex_every_row",
)


def overrides(args, schedule: str) -> list[str]:
    model = [f"model={args.shape}"] + ([f"model.path={args.folder}"] if args.folder else [])
    hardware = args.hardware or _hardware_of(args.device)
    return [
        *model,
        f"hardware={hardware}",
        "data=synthetic_video",
        f"data.image_size={args.size}",
        "workload=video",
        f"workload.frames={args.frames}",
        f"workload.height={args.size}",
        f"workload.width={args.size}",
        f"workload.prompts_per_step={args.prompts}",
        f"workload.group_size={args.group}",
        f"workload.text_tokens={args.text_tokens}",
        "workload.response_length.distribution=lognormal",
        f"workload.response_length.mean={args.mean_length}",
        f"workload.response_length.sigma={args.sigma}",
        f"workload.response_length.max={args.max_length}",
        f"train.max_new_tokens={args.max_length}",
        "train.response_lengths=workload",
        f"train.device={args.device}",
        f"train.deterministic={str(args.device == 'cpu').lower()}",
        f"train.steps={args.steps}",
        "train.checkpoint_every=0",
        "train.eval_every=0",
        "train.progress=false",
        f"train.trace_steps={min(2, args.steps)}",
        *SCHEDULES[schedule],
        *args.extra,
    ]


def _hardware_of(device: str) -> str:
    """The preset of the GPU this runs on: an H100 plans under its own 80 GB, not the H200's."""
    if device != "cuda":
        return "cpu"
    import torch

    return "h100" if "H100" in torch.cuda.get_device_name() else "h200"


def compose_spec(items: list[str], job: str = "train"):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rollplex.cli import _conf_dir
    from rollplex.specs.run import RunSpec

    with initialize_config_dir(config_dir=_conf_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*items, f"job={job}"])
    return RunSpec.model_validate(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))


def run_schedule(args, schedule: str, root: Path, calibration: Path | None) -> dict:
    import torch

    from rollplex.jobs import run_job

    out = root / schedule
    items = overrides(args, schedule) + ([f"calibration={calibration}"] if calibration else [])
    spec = compose_spec(items)
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    summary = run_job(spec, out)
    wall = time.perf_counter() - t0
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    times = [float(r["step_time_s"]) for r in rows]
    steady = times[1:] or times
    lengths = [float(r["response_length"]) for r in rows if r.get("response_length")]
    entry = {
        "schedule": schedule,
        "overrides": items,
        "calibrated_from": str(calibration) if calibration else None,
        "wall_s": wall,
        "step_time_s": times,
        "step_time_median_s": statistics.median(steady),
        "mean_response_length": lengths,
        "plan_step_time_s": summary["plan_step_time_s"],
        "plan_peak_bytes": summary["plan_peak_bytes"],
        "cuda_max_memory_allocated": summary["cuda_max_memory_allocated"],
        # each step's own allocator peak (the run's maximum above also holds the compiles)
        "cuda_step_peak_bytes": [
            int(r["cuda_step_peak_bytes"]) for r in rows if r.get("cuda_step_peak_bytes")
        ],
        "executor_peak_resident_bytes": summary["measured_peak_resident_bytes"],
        "decisions": summary.get("decisions"),
        "run_folder": str(out),
    }
    peak = entry["cuda_max_memory_allocated"] or entry["executor_peak_resident_bytes"]
    entry["peak_measured_over_planned"] = peak / entry["plan_peak_bytes"]
    entry["step_time_measured_over_predicted"] = (
        entry["step_time_median_s"] / entry["plan_step_time_s"]
    )
    entry["micro_batches"] = [r.get("train_micro_batches") for r in rows][-1:]
    # algo.skip_zero_advantage: the rows each step trained (empty where every row did)
    entry["trained_rows"] = [r.get("trained_rows", "") for r in rows]
    entry["placement_hash"] = placement_hash(json.loads((out / "plan.json").read_text()))
    del summary
    gc.collect()
    return entry


def add_one_schedule_arguments(ap: argparse.ArgumentParser, steps: int) -> None:
    """The flags of a bench that runs one schedule of this workload (gpu_profile_step.py,
    memory_peak.py): the model, the schedule, the device, the workload, the steps."""
    ap.add_argument("--shape", default="qwen2_5_vl_3b")
    ap.add_argument("--folder", default=None)
    ap.add_argument("--schedule", default="rollplex")
    ap.add_argument("--hardware", default=None)
    ap.add_argument("--device", default="cuda")
    add_workload_arguments(ap)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("extra", nargs="*", help="more Hydra overrides")


def add_workload_arguments(ap: argparse.ArgumentParser) -> None:
    """The workload's flags (`overrides` reads them): video prompts x G, forced lengths."""
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--size", type=int, default=448)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--text-tokens", type=int, default=64)
    ap.add_argument("--mean-length", type=int, default=448)
    ap.add_argument("--sigma", type=float, default=0.45)
    ap.add_argument("--max-length", type=int, default=1024)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", default="qwen2_5_vl_3b")
    ap.add_argument("--folder", default=None, help="Hub-format model folder (random weights)")
    ap.add_argument("--schedules", default="verl,serial_dedup,rollplex")
    ap.add_argument("--hardware", default=None, help="preset (default: from the GPU's name)")
    add_workload_arguments(ap)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="A/B rounds (>= 2): every schedule runs once a round, the order reversed each "
        "round; each ratio is reported with its half-width over the rounds",
    )
    ap.add_argument(
        "--warmup-steps",
        type=int,
        default=2,
        help="steps of every schedule run first and discarded: this process's compilations "
        "(dynamo, Inductor, cuBLAS; step 2's recompiles for new widths) then charge no round",
    )
    ap.add_argument(
        "--paired-from", type=int, default=2, help="first step (1-based) of the paired totals"
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no schedule past this many seconds (a skipped one is recorded as such); "
        "the JSON is rewritten after every schedule, so a run cut off keeps what finished",
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--print-job", action="store_true", help="print the workload overrides")
    ap.add_argument("--resummarize", type=Path, help="recompute a saved JSON's summary")
    ap.add_argument("extra", nargs="*", help="more Hydra overrides for every schedule")
    args = ap.parse_args()
    if args.resummarize:  # the summary fields of a saved result, by this version's rules
        saved = json.loads(args.resummarize.read_text())
        args.warmup_steps = saved.get("warmup_steps") or 0  # what that run did
        runs = saved["runs"]
        if not all(isinstance(v, list) for v in runs.values()):
            sys.exit(f"{args.resummarize}: a one-round result (before A/B rounds); rerun it")
        args.rounds = saved["rounds"]
        again = summarize(args, runs, saved["wall_s"])
        keep = ("date", "device", "device_name", "torch", "command", "shape", "workload")
        keep += ("decode_bw_efficiency", "warmup_s")
        saved |= {k: v for k, v in again.items() if k not in keep}
        args.resummarize.write_text(json.dumps(saved, indent=1) + "\n")
        print(table(saved))
        return
    if args.print_job:  # for bench/gpu_disagg.sh's JOB_EXTRA: the same workload on 2 GPUs
        skip = ("model", "hardware", "train.device", "schedule")
        print(" ".join(o for o in overrides(args, "rollplex") if not o.startswith(skip)))
        return
    out = args.out or Path(os.environ.get("OUT") or "bench/results/gpu_step")
    root = out / f"runs_{args.shape}"
    start = time.perf_counter()
    first = sorted(args.schedules.split(","), key=lambda s: s != "serial_dedup")
    orders = round_orders(first, args.rounds)  # A B .. | .. B A: no schedule always first
    runs: dict[str, list[dict]] = {s: [] for s in first}
    calib = root / "round0" / "serial_dedup" / "calibration.json"
    if args.warmup_steps:
        # Without it the first run of a code path paid compilations the later runs reused:
        # on the H200 (stop 19) serial + dedup's step 2 took 17.1 s, its step 3 7.3 s; on an
        # H100 (runs 21-22, one schedule warmed) rollplex's first step 2 spent 2.9 s in
        # reference scoring against 0.38 s in round 1.
        warm = argparse.Namespace(**{**vars(args), "steps": args.warmup_steps})
        warm_start = time.perf_counter()
        for schedule in first:
            print(f"== warm-up: {schedule}, {args.warmup_steps} steps (discarded)", flush=True)
            try:
                run_schedule(warm, schedule, root / "warmup", None)
            finally:
                shutil.rmtree(root / "warmup", ignore_errors=True)
        args.warmup_s = time.perf_counter() - warm_start  # what --budget-s must leave room for
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu_step_{args.shape}.json"
    for rnd, order in enumerate(orders):
        walls = [e.get("wall_s", 0.0) for v in runs.values() for e in v if e["round"] == 0]
        skip = round_skip(time.perf_counter() - start, walls, args.budget_s) if rnd else ""
        for schedule in order:
            if skip:
                print(f"== round {rnd} {schedule} {skip}", flush=True)
                entry = {"schedule": schedule, "round": rnd, "error": skip}
            else:
                entry = run_one(args, schedule, rnd, root, calib, start)
            entry["seq"] = sum(len(v) for v in runs.values())  # its place in the process
            runs[schedule].append(entry)
            result = summarize(args, runs, time.perf_counter() - start)
            path.write_text(json.dumps(result, indent=1) + "\n")  # after each: a cut run keeps it
    print(f"\nwrote {path}")
    print(table(result))


def run_one(args, schedule: str, rnd: int, root: Path, calib: Path, start: float) -> dict:
    """One schedule's run in round `rnd`; an error (OOM, the budget spent) is recorded."""
    elapsed = time.perf_counter() - start
    if args.budget_s is not None and elapsed > args.budget_s:
        why = f"skipped: {elapsed:.0f} s had passed, past --budget-s {args.budget_s:.0f}"
        print(f"== round {rnd} {schedule} {why}", flush=True)
        return {"schedule": schedule, "round": rnd, "error": why}
    print(f"== round {rnd}: {schedule}", flush=True)
    # every round plans with round 0's serial_dedup op times: the same plan each round
    use = calib if schedule != "serial_dedup" and calib.exists() else None
    try:
        entry = run_schedule(args, schedule, root / f"round{rnd}", use)
    except Exception as err:  # one schedule failing (OOM) keeps the others' numbers
        entry = {
            "schedule": schedule,
            "error": f"{type(err).__name__}: {err}"[:800],
            "error_notes": list(getattr(err, "__notes__", [])),  # the plan step (executor)
            "traceback_tail": "".join(traceback.format_exception(err))[-2000:],
        }
        print(f"{schedule} failed: {entry['error']}", *entry["error_notes"], sep="\n", flush=True)
    entry["round"] = rnd
    print(json.dumps({k: v for k, v in entry.items() if k != "overrides"}), flush=True)
    return entry


def summarize(args, runs: dict[str, list[dict]], wall: float) -> dict:
    import torch

    paired = paired_seconds(runs, args.paired_from)
    # each rollplex run against the baselines; and prefill once's own share (31.1)
    pairs = [
        (b, c) for c in runs if c.startswith("rollplex") and c not in BASELINES for b in BASELINES
    ]
    pairs.append(("serial_dedup_forward", "serial_dedup"))
    pairs.append(("rollplex_padded", "rollplex"))  # packed response rows' own share
    ratios = {
        f"{base}/{cand}": r for base, cand in pairs if (r := compare(runs, paired, base, cand))
    }

    def top(base: str, key: str):
        r = ratios.get(f"{base}/rollplex") or {}
        return r.get(key)

    steps = [
        {"seq": e["seq"], "round": e["round"], "schedule": e["schedule"], "step": k + 1, "s": t}
        for e in sorted((e for v in runs.values() for e in v), key=lambda e: e["seq"])
        for k, t in enumerate(e.get("step_time_s", []))
    ]
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device,
        "device_name": device,
        "torch": torch.__version__,
        "command": "python " + " ".join(sys.argv),
        "shape": args.shape,
        "workload": {
            "frames": args.frames,
            "prompts": args.prompts,
            "group": args.group,
            "mean_length": args.mean_length,
            "size": args.size,
            "response_length": {
                "distribution": "lognormal",
                "mean": args.mean_length,
                "sigma": args.sigma,
                "max": args.max_length,
            },
        },
        "wall_s": wall,
        "rounds": args.rounds,
        "round_orders": [
            [
                e["schedule"]
                for e in sorted(
                    (e for v in runs.values() for e in v if e["round"] == r), key=lambda e: e["seq"]
                )
            ]
            for r in range(args.rounds)
        ],
        "paired_s": paired,
        "paired_from_step": args.paired_from,
        "warmup_steps": getattr(args, "warmup_steps", None),
        "warmup_s": getattr(args, "warmup_s", None),
        # a same-plan pair gives None here and same_plan true: its ratio is noise
        "speedup_vs_serial_dedup": top("serial_dedup", "value"),
        "speedup_vs_serial_verl": top("verl", "value"),
        # serial + dedup before issue 31 (its own training forwards): the baseline
        "speedup_vs_serial_dedup_forward": top("serial_dedup_forward", "value"),
        "spread": {b: top(b, "spread") for b in BASELINES},
        "same_plan": bool(top("serial_dedup", "same_plan")),
        "ratios": ratios,
        "speedup_vs_disaggregated": None,  # two GPUs: bench/gpu_disagg.sh
        "decode_bw_efficiency": None,  # bench/gpu_step.sh adds gpu_decode.py's, same call
        "peak_measured_over_planned": _per_round(runs, "peak_measured_over_planned"),
        # planned with round 0 serial_dedup's measured op times (serial_dedup itself: the
        # cost model's own times, uncalibrated)
        "step_time_measured_over_predicted": _per_round(runs, "step_time_measured_over_predicted"),
        "step_times": steps,  # every step of every run, in the order they ran
        "runs": runs,
    }


def _per_round(runs: dict[str, list[dict]], key: str) -> dict[str, list]:
    return {k: [e.get(key) for e in v] for k, v in runs.items()}


def table(result: dict) -> str:
    lines = [
        "| schedule | round | step s (median) | predicted s | measured / predicted "
        "| peak GiB | planned GiB | peak / planned | plan |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entries in result["runs"].items():
        for e in entries:
            if "error" in e:
                lines.append(f"| {name} | {e['round']} | failed: {e['error'][:60]} |||||||")
                continue
            peak = e["cuda_max_memory_allocated"] or e["executor_peak_resident_bytes"]
            pred = e["plan_step_time_s"]
            ratio = e["step_time_measured_over_predicted"]
            cal = " (calibrated)" if e.get("calibrated_from") else ""
            lines.append(
                f"| {name} | {e['round']} | {e['step_time_median_s']:.2f} | {pred:.2f}{cal} "
                f"| {ratio:.2f} | {peak / 2**30:.1f} | {e['plan_peak_bytes'] / 2**30:.1f} "
                f"| {e['peak_measured_over_planned']:.2f} | {e['placement_hash'][:8]} |"
            )
    first = result.get("paired_from_step", 2)
    lines.append(f"\nseconds over the same steps ({first}..), per round: {result['paired_s']}")
    for pair, r in result["ratios"].items():
        if "error" in r:
            lines.append(f"{pair}: - ({r['error']})")
        elif r["same_plan"]:
            rounds = ", ".join(f"{x:.3f}" for x in r["per_round"])
            lines.append(f"{pair}: same plan, no speedup claimed (noise: {rounds})")
        else:
            beyond = "beyond noise" if r["beyond_noise"] else "inside the noise band"
            lines.append(f"{pair}: {r['value']:.3f} +- {r['spread']:.3f} ({beyond})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
