"""Time to accuracy: `rollplex train` and TRL's GRPOTrainer from the same random
initialisation, on the same easy-VQA rows and held-out split, with the same settings, over
seeds; held-out greedy accuracy (rollplex's exact match) against steps and wall-clock.

    python bench/peers/accuracy.py --model <folder> --steps 300 --eval-every 50 \
        --seeds 0,1,2 --out bench/results/peers [--device cuda --vllm]

Writes `accuracy.json` (rows with the peers.json keys plus `curve`: [step, wall_s,
accuracy]), one PNG per framework pair (accuracy against steps and against wall-clock,
every seed), and the curves as TensorBoard scalars under `<out>/tb/<framework>_seed<N>`.
Wall-clock counts training steps only (evaluation excluded), each framework its own.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from peer_row import device_name, steady, write  # bench/peers/ is on sys.path (script folder)
from prompts import write_rows
from settings import PeerSettings

HERE = Path(__file__).resolve().parent
# The embedded demo's GRPO (conf/algo/grpo_demo.yaml, conf/train.yaml): one-word answers.
DEMO = PeerSettings(
    prompts_per_step=4, group_size=16, max_new_tokens=1, lr=3e-4, kl_coef=0.2, steps=300
)


def rollplex_curve(args, s: PeerSettings, data: Path, test: Path, run: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "rollplex.cli", "train", "model=hub", f"model.path={args.model}",
        "data=jsonl", f"data.path={data}", f"data.eval_path={test}", "data.template='{problem}'",
        "algo=grpo_demo", "workload=tiny", f"hardware={'h200' if args.device == 'cuda' else 'cpu'}",
        f"train.device={args.device}", f"train.eval_every={args.eval_every}",
        f"train.eval_prompts={args.eval_rows}", f"train.checkpoint_every={s.steps}",
        "train.progress=false", *(["train.threads=1"] if args.device == "cpu" else []),
        f"workload.prompts_per_step={s.prompts_per_step}", f"workload.group_size={s.group_size}",
        f"train.max_new_tokens={s.max_new_tokens}", f"algo.lr={s.lr}", f"algo.kl_coef={s.kl_coef}",
        f"algo.temperature={s.temperature}", f"train.steps={s.steps}", f"seed={s.seed}",
        f"hydra.run.dir={run}",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {
            "error": done.stderr.strip().splitlines()[-1][:500],
            "curve": [],
            "step_times_s": [],
        }
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    times = [float(r["step_time_s"]) for r in rows]
    wall = {int(r["step"]): sum(times[: int(r["step"])]) for r in rows}
    summary = json.loads((run / "summary.json").read_text())
    curve = [[0, 0.0, summary["eval_accuracy_first"]]]
    curve += [[int(r["step"]), wall[int(r["step"])], float(r["eval_accuracy"])]
              for r in rows if r["eval_accuracy"] not in ("", None)]  # fmt: skip
    return {"error": None, "curve": curve, "step_times_s": times}


def trl_curve(args, s: PeerSettings, data: Path, test: Path, run: Path) -> dict[str, Any]:
    run.mkdir(parents=True, exist_ok=True)
    out = run / "trl_row.json"
    cmd = [
        sys.executable, str(HERE / "trl_grpo.py"), "--model", str(args.model), "--data", str(data),
        "--eval-data", str(test), "--eval-every", str(args.eval_every), "--shape", args.shape,
        "--workload", "easyvqa", "--out", str(out), "--no-ignore-eos",
        *(["--vllm"] if args.vllm else []),
        *(f"--{k.replace('_', '-')}={v}" for k, v in s.as_dict().items()),
    ]  # fmt: skip
    env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if args.device == "cpu" else {})}
    subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=run)
    if not out.is_file():
        return {"error": "trl_grpo.py wrote no row", "curve": [], "step_times_s": []}
    got = json.loads(out.read_text())
    return {
        "error": got["error"],
        "curve": got.get("accuracy", []),
        "step_times_s": got["step_times_s"],
    }


RUNNERS = {"rollplex": rollplex_curve, "trl": trl_curve}


def plot(rows: list[dict[str, Any]], pair: tuple[str, str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_wall) = plt.subplots(1, 2, figsize=(11, 4))
    colours = dict(zip(pair, ("tab:blue", "tab:orange"), strict=True))
    for r in rows:
        if r["framework"] not in pair or not r["curve"]:
            continue
        steps, wall, acc = zip(*r["curve"], strict=True)
        label = f"{r['framework']} seed {r['seed']}"
        by_step.plot(steps, acc, marker="o", color=colours[r["framework"]], alpha=0.7, label=label)
        by_wall.plot(wall, acc, marker="o", color=colours[r["framework"]], alpha=0.7, label=label)
    by_step.set_xlabel("RL step")
    by_wall.set_xlabel("training wall-clock (s)")
    for ax in (by_step, by_wall):
        ax.set_ylabel("held-out greedy accuracy")
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=7)
    fig.suptitle(f"{pair[0]} vs {pair[1]}: easy-VQA, same settings ({rows[0]['device_name']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def to_tensorboard(rows: list[dict[str, Any]], tb: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    for r in rows:
        w = SummaryWriter(str(tb / f"{r['framework']}_seed{r['seed']}"))
        for step, wall, acc in r["curve"]:
            w.add_scalar("accuracy/by_step", acc, step)
            w.add_scalar("accuracy/by_wall_ms", acc, int(wall * 1000))
        w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vllm", action="store_true", help="TRL generates with colocated vLLM")
    ap.add_argument("--frameworks", default="rollplex,trl")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=DEMO.steps)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--train-rows", type=int, default=4096)
    ap.add_argument("--eval-rows", type=int, default=512)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    work = args.out / "accuracy_runs"
    data = write_rows("easyvqa", args.train_rows, work / "data")
    test = write_rows("easyvqa", args.eval_rows, work / "data", split="test")
    rows = []
    for seed in [int(x) for x in args.seeds.split(",")]:
        for fw in args.frameworks.split(","):
            s = PeerSettings(**{**DEMO.as_dict(), "steps": args.steps, "seed": seed})
            run = work / f"{fw}_seed{seed}"  # rollplex claims it; TRL's runner makes it
            got = RUNNERS[fw](args, s, data, test, run)
            step = steady(got["step_times_s"]) if got["step_times_s"] else None
            rows.append({
                "framework": fw, "schedule": "rollplex" if fw == "rollplex" else "trl generate",
                "shape": args.shape, "workload": "easyvqa", "device_name": device_name(),
                "step_time_s": step, "tokens_per_s": None if not step
                else s.prompts_per_step * s.group_size * s.max_new_tokens / step,
                "peak_bytes": None, "seed": seed, "settings": s.as_dict(), **got,
            })  # fmt: skip
            last = got["curve"][-1] if got["curve"] else None
            print(f"{fw} seed {seed}: step {step}, last {last}, error {got['error']}", flush=True)
    write(args.out / "accuracy.json", {"rows": rows, "command": " ".join(sys.argv)})
    frameworks = args.frameworks.split(",")
    for other in frameworks[1:]:
        plot(rows, (frameworks[0], other), args.out / f"accuracy_{frameworks[0]}_vs_{other}.png")
    to_tensorboard(rows, args.out / "tb")


if __name__ == "__main__":
    main()
