"""The embedded default learns easy-VQA: reward and held-out accuracy of `rollplex train`.

    python bench/learning_curve.py [--steps 1000] [--eval-every 100] [--eval-prompts 512]
                                   [--seed 0] [--tag NAME] [overrides ...]

Runs the README's main job (`conf/train.yaml`: the demo model folder, easy-VQA, GRPO) for
longer, through the CLI, and writes `learning_curve.csv` (reward per step) and
`learning_curve.md`: the command, windowed mean reward, held-out accuracy at each
evaluation, and the majority-answer baseline of the same held-out prompts (always giving
the split's most common answer), and the PPO clip fraction per window (nonzero only with
several updates a step: `algo.ppo_mini_batch_size`, `algo.ppo_epochs`). `--tag` names
the files of a variant (learning_curve_<tag>...). CPU only.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WINDOW = 50


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-prompts", type=int, default=512)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--seed", type=int, default=0, help="the run's seed (0: the demo's)")
    ap.add_argument("--tag", default="", help="a variant's name in the output file names")
    ap.add_argument("overrides", nargs="*", help="more `rollplex train` overrides")
    args = ap.parse_args()
    suffix = (f"_{args.tag}" if args.tag else "") + ("" if args.seed == 0 else f"_seed{args.seed}")
    overrides = [
        f"seed={args.seed}",
        f"train.steps={args.steps}",
        f"train.eval_every={args.eval_every}",
        f"train.eval_prompts={args.eval_prompts}",
        f"train.checkpoint_every={args.steps}",
        "train.threads=1",
        "train.progress=false",
        *args.overrides,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "rollplex.cli", "train", *overrides]
        t0 = time.monotonic()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([*cmd, f"hydra.run.dir={run}"], check=True, env=env)
        wall = time.monotonic() - t0
        rows = list(csv.DictReader((run / "metrics.csv").open()))
        summary = json.loads((run / "summary.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / f"learning_curve{suffix}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "reward", "clip_frac", "eval_accuracy"])
        for r in rows:
            w.writerow([r["step"], r["reward"], r["clip_frac"], r["eval_accuracy"]])
    rewards = [float(r["reward"]) for r in rows]
    clips = [float(r["clip_frac"] or 0) for r in rows]
    lines = [
        "# The embedded default learns easy-VQA (CPU)",
        "",
        f"`python bench/learning_curve.py --steps {args.steps} --eval-every {args.eval_every} "
        f"--eval-prompts {args.eval_prompts} --seed {args.seed}` ran "
        f"`rollplex train {' '.join(overrides)}` (conf/train.yaml: the demo folder, "
        f"easy-VQA, GRPO, G=16) in {wall / 60:.1f} min on one thread.",
        "",
        f"Held-out: the test split's first {summary['eval_prompts']} prompts in the seeded "
        f"order; greedy answers; exact match. Always answering the most common one "
        f"('{summary['majority_answer']}') scores {summary['majority_accuracy']:.3f} there.",
        "",
        f"| steps | mean reward (window of {WINDOW}) | mean clip_frac | held-out accuracy |",
        "|---|---|---|---|",
    ]
    for r in rows:
        step = int(r["step"])
        if r["eval_accuracy"] or step % WINDOW == 0:
            lo = max(0, step - WINDOW)
            window = statistics.fmean(rewards[lo:step])
            clip = statistics.fmean(clips[lo:step])
            acc = f"{float(r['eval_accuracy']):.3f}" if r["eval_accuracy"] else ""
            lines.append(f"| {lo + 1}-{step} | {window:.3f} | {clip:.4f} | {acc} |")
    lines += [
        "",
        f"Held-out accuracy {summary['eval_accuracy_first']:.3f} before training, "
        f"{summary['eval_accuracy_last']:.3f} after (baseline "
        f"{summary['majority_accuracy']:.3f}). Examples after training (question, answer, "
        "response):",
        "",
        *(f"- {q!r} -> {a!r}: {r!r}" for q, a, r in summary["eval_examples"]),
    ]
    (args.out / f"learning_curve{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
