"""Read a `rollplex train` run folder from a GPU run and write what issue 7 asks for:
step time measured against predicted, CUDA's peak allocation against the plan's peak, and
per op where the time goes (measured against the cost model).

    python bench/gpu_train_report.py <run folder> <shape> <out folder>

Writes <out>/train_<shape>.json and .md, and copies the run's TensorBoard traces there.
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import sys
from collections import defaultdict
from datetime import date
from pathlib import Path


def main(run: Path, shape: str, out: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    times = [float(r["step_time_s"]) for r in rows]
    steady = times[1:] or times  # step 1 pays CUDA/cuBLAS warm-up
    calib = json.loads((run / "calibration.json").read_text())
    per_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in calib["entries"]:
        per_kind[e["kind"]][0] += e["measured_s"]
        per_kind[e["kind"]][1] += e["predicted_s"]
    measured_step = statistics.median(steady)
    result = {
        "date": date.today().isoformat(),
        "device": "one NVIDIA H200 (device tool, nvidia-h200)",
        "command": f"bash bench/gpu_train_real_size.sh {shape} {len(rows)}",
        "shape": shape,
        "steps": len(rows),
        "step_time_s": times,
        "step_time_median_s_excluding_first": measured_step,
        "step_time_predicted_s": summary["plan_step_time_s"],
        "measured_over_predicted": measured_step / summary["plan_step_time_s"],
        "cuda_max_memory_allocated_bytes": summary["cuda_max_memory_allocated"],
        "plan_peak_bytes": summary["plan_peak_bytes"],
        "measured_peak_over_planned": (
            summary["cuda_max_memory_allocated"] / summary["plan_peak_bytes"]
            if summary["cuda_max_memory_allocated"]
            else None
        ),
        "executor_peak_resident_bytes": summary["measured_peak_resident_bytes"],
        "reward_per_step": [float(r["reward"]) for r in rows if r["reward"]],
        "response_length_per_step": [
            float(r["response_length"]) for r in rows if r["response_length"]
        ],
        "per_op_kind_s_last_steps": {
            k: {"measured": m, "predicted": p, "ratio": m / p if p else None}
            for k, (m, p) in sorted(per_kind.items(), key=lambda kv: -kv[1][0])
        },
        "decisions": summary.get("decisions"),
        "workload_measured": summary.get("workload_measured"),
    }
    plan = json.loads((run / "plan.json").read_text())
    pools = [s["pool_bytes"] for d in plan["devices"] for s in d["steps"] if s.get("pool_bytes")]
    if pools:  # an engine rollout: the KV pool the plan gave it, and its sleep/wake
        result["engine_kv_pool_bytes_planned"] = max(pools)
        for key in ("engine_sleep_s", "engine_wake_s"):
            vals = [float(r[key]) for r in rows[1:] if r.get(key)]
            result[f"{key}_median"] = statistics.median(vals) if vals else None
    out.mkdir(parents=True, exist_ok=True)
    (out / f"train_{shape}.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# rollplex train at {shape} on one H200 ({result['date']})",
        "",
        f"`{result['command']}`",
        "",
        f"- step time: {measured_step:.2f} s measured (median of steps 2..), "
        f"{summary['plan_step_time_s']:.2f} s predicted "
        f"({result['measured_over_predicted']:.2f}x)",
        f"- peak memory: {(summary['cuda_max_memory_allocated'] or 0) / 2**30:.1f} GiB "
        f"(torch.cuda.max_memory_allocated) vs {summary['plan_peak_bytes'] / 2**30:.1f} GiB "
        "planned",
    ]
    if pools:
        lines.append(
            f"- engine KV pool from the plan: {max(pools) / 2**30:.2f} GiB; sleep "
            f"{result['engine_sleep_s_median'] or 0:.3f} s, wake "
            f"{result['engine_wake_s_median'] or 0:.3f} s a step (median)"
        )
    lines += [
        "",
        "| op kind | measured s | predicted s | ratio |",
        "|---|---|---|---|",
    ]
    for k, v in result["per_op_kind_s_last_steps"].items():
        ratio = f"{v['ratio']:.1f}" if v["ratio"] else "-"
        lines.append(f"| {k} | {v['measured']:.3f} | {v['predicted']:.3f} | {ratio} |")
    (out / f"train_{shape}.md").write_text("\n".join(lines) + "\n")
    for trace in (run / "tb").glob("*.pt.trace.json"):
        shutil.copy(trace, out / f"{shape}_{trace.name}")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
