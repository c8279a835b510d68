"""`rollplex train` on the peers' shared prompts and model folder, as a user runs it, one
schedule per process: `serial` (with dedup), `rollplex`, and verl-like (`serial` with
`schedule.dedup=false schedule.train_micro_fused=true`: the prefix recomputed per sample and
per phase, forward and backward per micro-batch, as verl's actor runs them).

    python bench/peers/rollplex_grpo.py --model <folder> --data /tmp/peers/easyvqa/train.jsonl \
        --shape qwen2_5_vl_7b --workload easyvqa --schedule rollplex --steps 6 --out row.json

Settings from bench/peers/settings.py (EOS ignored: every response has max_new_tokens);
the step time is metrics.csv's, the peak summary.json's `cuda_max_memory_allocated`.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from peer_row import DevicePeak, row, write  # bench/peers/ is on sys.path as the script's folder
from settings import PeerSettings

SCHEDULES = {
    "serial": ["schedule=serial"],
    "rollplex": ["schedule=rollplex"],
    "verl-like": ["schedule=serial", "schedule.dedup=false", "schedule.train_micro_fused=true"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    PeerSettings.add_inputs(ap)
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="rollplex")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    PeerSettings.add_arguments(ap)
    args = ap.parse_args()
    s = PeerSettings.from_arguments(args)
    run = args.out.with_suffix("")  # beside its row, one folder per run (rounds repeat)
    frames = json.loads(args.data.read_text().splitlines()[0]).get("videos")
    cmd = [
        sys.executable, "-m", "rollplex.cli", "train", "model=hub", f"model.path={args.model}",
        "data=jsonl", f"data.path={args.data}", "data.template='{problem}'",
        f"train.device={args.device}", "train.eval_every=0", "train.checkpoint_every=0",
        "train.progress=false", *SCHEDULES[args.schedule], *s.rollplex_overrides(),
        *([f"workload.frames={len(frames[0])}"] if frames else []), f"hydra.run.dir={run}",
    ]  # fmt: skip
    with DevicePeak() as peak:
        done = subprocess.run(cmd, capture_output=True, text=True)
    error = None
    times: list[float] = []
    summary = {}
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1][:500]
    else:
        times = [float(r["step_time_s"]) for r in csv.DictReader((run / "metrics.csv").open())]
        summary = json.loads((run / "summary.json").read_text())
    result = row(
        "rollplex",
        args.schedule,
        args.shape,
        args.workload,
        times,
        s.prompts_per_step * s.group_size * s.max_new_tokens,
        peak_device_bytes=peak.peak,
        error=error,
        predicted_step_s=summary.get("plan_step_time_s"),
        plan_peak_bytes=summary.get("plan_peak_bytes"),
        settings=s.as_dict(),
        command=" ".join(cmd),
    )
    result["peak_bytes"] = summary.get("cuda_max_memory_allocated")  # the child's allocator
    write(args.out, result)
    print(json.dumps({k: result[k] for k in ("step_time_s", "tokens_per_s", "error")}))


if __name__ == "__main__":
    main()
