"""How much of a measured serial + dedup step could hide in the decode's long tail: a bound.

The measured 3B step (`bench/results/gpu_step/`, run 3) is two-thirds decode, and the
longest of its 32 rows sets the decode's length while most rows finished far earlier. The
response-dependent work of a finished row could run beside the rest of the decode without
breaking on-policy semantics (the weights do not change until the optimizer step):
- its reference and training forwards over its response, as soon as the row ends;
- the backward of a group, once all G rows of the group ended (GRPO's advantages are
  group statistics, so the loss gradient of a row needs its group).
This script replays the measured op times of the serial + dedup step against the run's
forced response lengths (`forced_lengths`: seed 0, the same rows every schedule decoded)
and simulates that overlap (fluid: while side work is pending, the decode and the side
work progress at the rates of a measured pair; once the decode ends, the rest runs alone).
It does not run anything on a GPU and is not a measurement: it bounds what such a
schedule could gain, under three pair rates:
- `ideal`: both sides at full speed together (an upper bound no GPU reaches);
- `green 48/84`: the pair `bench/gpu_green.py` measured on decode 48 / prefix 84 SMs of an
  H200 (1.125x over serial: decode 0.57 and side 0.54 of their solo speeds);
- `streams`: FACTS.md's two plain streams (decode 0.65, side 0.36: 1.01x).

    python bench/tail_overlap_bound.py        # writes results/tail_overlap_bound.md
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from rollplex.runtime.rollout_ops import forced_lengths
from rollplex.specs.workload import ResponseLengthSpec

RUN = Path("bench/results/gpu_step")
PAIRS = {"ideal": (1.0, 1.0), "green 48/84": (0.57, 0.54), "streams": (0.65, 0.36)}


@dataclass(slots=True, frozen=True)
class Work:
    ready_step: int  # the decode step after which it may start
    seconds: float  # its solo time


def measured_ms(table: Path) -> dict[str, float]:
    """Measured ms per plan step of a planned_vs_measured.md."""
    out = {}
    for line in table.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 6 and re.fullmatch(r"\d+", cells[1]):
            out[cells[2]] = float(cells[6])
    return out


def side_work(ms: dict[str, float], lengths: list[int], group: int, backward: bool) -> list[Work]:
    """Each row's response forwards (reference + training) when it ends, and with
    `backward` each group's backward when its last row ends; split by response tokens."""
    tokens = sum(lengths)
    forwards = (ms["reference.logprob_response"] + ms["train.logprob_response"]) / 1e3
    work = [Work(n, forwards * n / tokens) for n in lengths]
    if backward:
        for g in range(0, len(lengths), group):
            rows = lengths[g : g + group]
            work.append(Work(max(rows), ms["train.backward"] / 1e3 * sum(rows) / tokens))
    return work


def overlapped(decode_s: float, steps: int, work: list[Work], rates: tuple[float, float]) -> float:
    """Seconds from the decode's start until the decode and all side work are done."""
    rd, rs = rates
    step_s = decode_s / steps
    pending, t, done_steps = 0.0, 0.0, 0
    queue = sorted(work, key=lambda w: w.ready_step)
    i = 0
    while done_steps < steps:
        while i < len(queue) and queue[i].ready_step <= done_steps:
            pending += queue[i].seconds
            i += 1
        if pending <= 0:
            t += step_s  # nothing beside it: a decode step at full speed
        else:
            dt = step_s / rd  # one decode step beside side work
            pending = max(0.0, pending - dt * rs)
            t += dt
        done_steps += 1
    pending += sum(w.seconds for w in queue[i:])
    return t + pending  # what is left runs alone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="gpu_step_qwen2_5_vl_3b_run3.json")
    ap.add_argument("--steps", default="2,3", help="RL steps whose forced lengths to use")
    ap.add_argument("--out", type=Path, default=Path("bench/results/tail_overlap_bound.md"))
    args = ap.parse_args()
    run = json.loads((RUN / args.run).read_text())
    wl = run["workload"]
    spec = ResponseLengthSpec(**wl["response_length"])
    folder = RUN / args.run.replace("gpu_step_", "runs_").removesuffix(".json")
    ms = measured_ms(folder / "serial_dedup" / "tb" / "planned_vs_measured.md")
    serial = sum(ms.values()) / 1e3
    decode_s = ms["rollout.decode"] / 1e3
    rows, group = wl["prompts"] * wl["group"], wl["group"]
    lines = [
        "# Response work of finished rows beside the decode's tail: a bound "
        f"(`python bench/tail_overlap_bound.py --steps {args.steps}`)",
        "",
        f"Measured op times: serial + dedup, `{folder}/serial_dedup/tb/planned_vs_measured.md` "
        f"(median of its steps): {serial:.2f} s a step, decode {decode_s:.2f} s. "
        f"Forced lengths of {rows} rows (G = {group}, {spec.distribution} mean {spec.mean:g}, "
        f"sigma {spec.sigma:g}, max {spec.max}), seed 0. Simulated, not measured "
        "(see the script's docstring).",
        "",
        "| RL step | longest row | median row | last group ends at | moved | pair | step s "
        "| speedup vs serial + dedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for step in [int(s) for s in args.steps.split(",")]:
        lengths = list(forced_lengths(spec, rows, spec.max, 0, step))
        longest = max(lengths)
        groups = sorted(max(lengths[g : g + group]) for g in range(0, rows, group))
        median = sorted(lengths)[rows // 2]
        for moved, backward in (("forwards", False), ("forwards + backward", True)):
            work = side_work(ms, lengths, group, backward)
            moved_s = sum(w.seconds for w in work)
            for pair, rates in PAIRS.items():
                window = overlapped(decode_s, longest, work, rates)
                step_s = serial - decode_s - moved_s + window
                lines.append(
                    f"| {step} | {longest} | {median} | {groups} | {moved} ({moved_s:.2f} s) "
                    f"| {pair} | {step_s:.2f} | {serial / step_s:.3f}x |"
                )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-13:]))


if __name__ == "__main__":
    main()
