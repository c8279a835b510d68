"""One schedule of `bench/gpu_step.py`'s workload under torch.profiler, and where its plan
steps' GPU time goes (bench/trace_kernels.py): the issue-31 profile of the ops that run
furthest over their model (backward, response logprobs, vision, decode).

    python bench/gpu_profile_step.py --folder /tmp/qwen2_5_vl_3b --shape qwen2_5_vl_3b \\
        --frames 32 --mean-length 64 --max-length 256      # one GPU; bench/gpu_profile_step.sh

Runs `--steps` RL steps and profiles the last one (`train.profile=true`,
`train.trace_steps=1`); writes <out>/kernels.md and prints it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_step import add_one_schedule_arguments, compose_spec, overrides
from trace_kernels import load, markdown, step_kernels

OPS = (
    "rollout.vision_encode,rollout.prefix_prefill,rollout.decode,reference.logprob_prefix,"
    "reference.logprob_response,train.logprob_prefix,train.logprob_response,train.backward,"
    "update.optimizer_step"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_one_schedule_arguments(ap, steps=3)
    ap.add_argument("--ops", default=OPS)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu_profile"))
    args = ap.parse_args()
    items = [i for i in overrides(args, args.schedule) if not i.startswith("train.trace_steps=")]
    spec = compose_spec([*items, "train.profile=true", "train.trace_steps=1"])

    from rollplex.jobs import run_job

    run = args.out / f"{args.shape}_{args.schedule}"
    run_job(spec, run)
    trace = sorted((run / "tb").glob("measured*.pt.trace.json*"))[-1]
    events = load(trace)
    found = [op for op in args.ops.split(",") if any(e.get("name") == op for e in events)]
    text = markdown([step_kernels(events, op, args.top) for op in found])
    (args.out / f"kernels_{args.shape}_{args.schedule}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
