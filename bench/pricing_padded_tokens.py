"""Planned op times of bench/gpu_step.py's workloads (serial + dedup), as the planner prices
them: what `bench/results/pricing_padded_tokens.md` compares before and after the scoring
ops were priced at their padded width (ops/response_width.py). CPU only, no model.

    PYTHONPATH=. python bench/pricing_padded_tokens.py --frames 32 --mean-length 64 \
        --max-length 256 [--calibration none|shipped] [--json out.json] [OVERRIDE ...]

`--rerun FOLDER`: the serial + dedup plan of a recorded run folder's config.json (its
calibration file's ops, summed per kind): the predicted seconds its measured ones pair with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_step import add_workload_arguments, compose_spec, overrides

from rollplex.jobs.plan import plan_for
from rollplex.specs.run import RunSpec


def op_times(spec: RunSpec) -> tuple[dict[str, float], float, int]:
    """(op name -> planned seconds, step seconds, train micro-batches) of `spec`'s plan,
    priced as `rollplex plan` prices it (`calibration.path`: none, or the shipped default)."""
    result = plan_for(spec)
    plan = result.plan
    times: dict[str, float] = {}
    for dev in plan.devices:
        for s in dev.steps:
            key = s.op if s.kind not in ("offload", "onload") else f"{s.op} {s.kind}"
            times[key] = times.get(key, 0.0) + s.solo_s
    return times, plan.step_time_s, plan.meta["train_micro_batches"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", default="qwen2_5_vl_7b")
    add_workload_arguments(ap)
    ap.add_argument("--schedule", default="serial_dedup")
    ap.add_argument("--calibration", choices=("none", "shipped"), default="none")
    ap.add_argument("--rerun", type=Path, help="a gpu_step run folder (its config.json)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("extra", nargs="*", help="more Hydra overrides (not with --rerun)")
    # what gpu_step's `overrides` reads besides the workload: a plan of one H200 step
    ap.set_defaults(folder=None, device="cuda", steps=1, hardware="h200")
    args = ap.parse_args()
    calibration = {"path": None if args.calibration == "shipped" else "none"}
    if args.rerun:
        cfg = json.loads((args.rerun / "config.json").read_text())
        cfg["calibration"] = {**(cfg.get("calibration") or {}), **calibration}
        # the recorded runs ran their own training prefix forward (before prefill_once)
        cfg["schedule"] = {**cfg["schedule"], "prefill_once": False}
        spec = RunSpec.model_validate(cfg)
    else:
        items = [o for o in overrides(args, args.schedule) if not o.startswith("train.device")]
        spec = compose_spec(items, job="plan")
        spec = spec.model_copy(
            update={"calibration": spec.calibration.model_copy(update=calibration)}
        )
    times, step, micro = op_times(spec)
    print(f"step {step:.3f} s, train micro-batches {micro}")
    for op, t in times.items():
        print(f"{op:<32}{t:>9.4f}")
    if args.rerun:  # per kind, over the ops the run's calibration file measured
        measured = json.loads((args.rerun / "calibration.json").read_text())["entries"]
        kinds: dict[str, list[float]] = {}
        for e in measured:
            if e["op"] in times:
                k = kinds.setdefault(e["kind"], [0.0, 0.0])
                k[0] += times[e["op"]]
                k[1] += e["measured_s"]
        for kind, (p, m) in kinds.items():
            print(f"kind {kind:<20} predicted {p:.9g}  measured {m:.9g}")
    if args.json:
        args.json.write_text(json.dumps({"step_s": step, "micro": micro, "ops": times}))


if __name__ == "__main__":
    main()
