"""How long planning takes as graphs grow, on one core (a benchmark, not a test).

The graph is K GRPO micro-steps over the same weights (K prompt batches of one long step,
as a 10,000-op program would look), so it has 13K ops after the dedup passes: 770 copies
make 10,010 ops. "planning" is one `plan_step` call on it with `passes=()`: order,
placement, replay, lifetimes, memory slots and residency, validation and the report.
What stresses the planner: the serial schedule keeps every copy's rollout outputs live
until its training phase, so thousands of tensors cross each memory query. HBM is made
unlimited so the memory planner is timed, not the offload search. `--schedule rollplex`
times the overlap search too, whose trials are bounded on long graphs (see
rollplex/planner/schedules/rollplex.py). Prints a markdown table last.

    OMP_NUM_THREADS=1 python bench/planner_scale.py --steps 1 100 770 --repeats 3
    OMP_NUM_THREADS=1 python bench/planner_scale.py --steps 1 100 770 --schedule rollplex

`--gpus N...` times the `rollplex plan` job instead (72B, video, rollplex and its three
baselines at their memory options, run folder and TensorBoard export included) at N GPUs
on each hardware base (`hardware.num_gpus=N` over h800x32 and h200x8), as a subprocess of
the tree on `--tree` (default: this one), so two trees are timed by one script. It reports
wall time and the child's CPU time (user + sys): on the shared VM the CPU time is the figure
that does not move with the load.

    python bench/planner_scale.py --gpus 128 512 2048 [--tree /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rollplex.algos import build_step
from rollplex.graph.ir import Graph, Op, Value
from rollplex.graph.passes import DEDUP_PASSES, run_passes
from rollplex.jobs.pipeline import plan_step
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)


def replicated(k: int) -> Graph:
    """K copies of the GRPO step sharing every external value (weights, optimizer state,
    prompts); every op and internal value name prefixed with its copy."""
    model, work = MODEL_PRESETS["qwen2_5_vl_7b"], WORKLOAD_PRESETS["video"]
    base, _ = run_passes(build_step(model, work, AlgoSpec()), DEDUP_PASSES)
    g = Graph()
    shared = {n for n, v in base.values.items() if v.external}
    for n in base.values:  # in the graph's order, not the set's (hash-seeded) one
        if n not in shared:
            continue
        v = base.values[n]
        g.add_value(Value(n, v.shape, v.dtype, v.kind, v.version, True))

    def rn(name: str, i: int) -> str:
        return name if name in shared else f"s{i}/{name}"

    for i in range(k):
        for n, v in base.values.items():
            if n not in shared:
                g.add_value(Value(rn(n, i), v.shape, v.dtype, v.kind, v.version, v.external))
        for op in base.ops.values():
            g.add_op(
                Op(
                    f"s{i}/{op.name}",
                    op.kind,
                    op.phase,
                    {p: rn(v, i) for p, v in op.inputs.items()},
                    {p: rn(v, i) for p, v in op.outputs.items()},
                    dict(op.attrs),
                )
            )
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 10, 100, 770])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--schedule", default="serial")
    ap.add_argument("--gpus", type=int, nargs="*", help="time `rollplex plan` at these sizes")
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    if args.gpus:
        cluster_scale(args.gpus, args.tree, args.timeout)
        return
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    model, work = MODEL_PRESETS["qwen2_5_vl_7b"], WORKLOAD_PRESETS["video"]
    hw = HARDWARE_PRESETS["h200x8"].model_copy(update={"hbm_gib": 1e6})  # time the planner
    rows = []
    for k in args.steps:
        g = replicated(k)
        sched = ScheduleSpec(name=args.schedule, parallel={"rollout_tp": 1})
        plan_s, pass_s, cpu_s = [], [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            run_passes(g, DEDUP_PASSES)  # the graph compiler, timed on its own
            pass_s.append(time.perf_counter() - t)
            t, c = time.perf_counter(), time.process_time()
            r = plan_step(model, work, AlgoSpec(), hw, sched, graph=g, passes=())
            plan_s.append(time.perf_counter() - t)
            cpu_s.append(time.process_time() - c)
        dev = r.plan.devices[0]
        rows.append(
            (
                k,
                len(r.graph),
                len(r.plan.all_steps()),
                statistics.median(plan_s),
                statistics.median(cpu_s),
                statistics.median(pass_s),
                dev.peak_bytes / dev.lower_bound_bytes,
            )
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print(f"schedule={args.schedule}; medians of {args.repeats}; one core (OMP_NUM_THREADS=1)")
    print(
        "| GRPO copies | ops | plan steps | planning (order, placement, replay, memory, "
        "validate), wall | the same, CPU time | dedup passes + lint | planned peak / lower bound |"
    )
    print("|---|---|---|---|---|---|---|")
    for k, ops, steps, t, cpu, tp, ratio in rows:
        print(f"| {k} | {ops} | {steps} | {t:.3f} s | {cpu:.3f} s | {tp:.3f} s | {ratio:.3f} |")


def cluster_scale(sizes: list[int], tree: Path, timeout: float) -> None:
    """`rollplex plan model=qwen2_5_vl_72b` at each size on each hardware base."""
    print(f"tree {tree}; python {platform.python_version()}, {os.cpu_count()} cpus")
    print("| hardware | GPUs | wall | CPU (user + sys) | load avg | exit |")
    print("|---|---|---|---|---|---|")
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    for hw in ("h800x32", "h200x8"):
        for n in sizes:
            with tempfile.TemporaryDirectory() as out:
                cmd = [
                    sys.executable, "-m", "rollplex.cli", "plan", "model=qwen2_5_vl_72b",
                    f"hardware={hw}", f"hardware.num_gpus={n}", f"hydra.run.dir={out}",
                ]  # fmt: skip
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                try:
                    rc = subprocess.run(cmd, env=env, cwd=out, capture_output=True, timeout=timeout)
                    code = str(rc.returncode)
                except subprocess.TimeoutExpired:
                    code = f"timeout {timeout:.0f} s"
                wall = time.perf_counter() - t
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                load = os.getloadavg()[0]
                print(f"| {hw} | {n} | {wall:.1f} s | {cpu:.1f} s | {load:.1f} | {code} |")


if __name__ == "__main__":
    main()
