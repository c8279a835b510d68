"""A/B measurement rules for schedules timed side by side (bench/gpu_step.py).

Pure logic, no torch: which order the schedules run in each round, how a ratio and its
noise band come out of the rounds, and when two runs are the same plan.

- Order: round 0 in the given order, every later round reversed from the one before
  (A B C | C B A | A B C ...), so no schedule always runs first or last: a drift over the
  process's life (clocks, allocator, caches) lands on both sides of each ratio.
- Ratio: per round, the baseline's paired seconds over the candidate's (the same RL steps);
  the value is the mean over rounds, the spread its half-width (max - min) / 2. A ratio
  is beyond noise only when value - spread > 1.
- Same plan: two runs whose plans place the same ops (and kinds), chunks, streams, co-run
  modes and SM partitions in the same issue order, with the same work switches (micro-
  batches, packed rows), run the same work; their ratio measures
  noise, so it is reported as `same_plan: true` and never as a speedup.

It lives in bench/, not in the package: only the benches compare schedules by timing
them, and the package's plan/runtime never needs these rules.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MIN_ROUNDS = 2


def round_orders(schedules: Sequence[str], rounds: int) -> list[list[str]]:
    """The schedules' run order in each round: alternating (A B, B A, A B, ...)."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"rounds={rounds}: an A/B needs at least {MIN_ROUNDS} rounds")
    if len(set(schedules)) != len(schedules) or not schedules:
        raise ValueError(f"schedules {list(schedules)}: need distinct, non-empty names")
    forward = list(schedules)
    return [forward if r % 2 == 0 else forward[::-1] for r in range(rounds)]


@dataclass(frozen=True, slots=True)
class Ratio:
    """baseline seconds / candidate seconds, over rounds."""

    value: float | None  # mean over rounds; None where same_plan (noise, not a speedup)
    spread: float  # half-width over rounds: (max - min) / 2
    per_round: list[float]
    same_plan: bool

    @property
    def beyond_noise(self) -> bool:
        return self.value is not None and self.value - self.spread > 1.0

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"beyond_noise": self.beyond_noise}


def timed_rounds(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each variant's seconds (what its callable returns) per round, the variants run in
    `round_orders`' alternating order: for the CPU benches that time two code paths."""
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for order in round_orders(list(variants), rounds):
        for name in order:
            seconds[name].append(variants[name]())
    return seconds


def report(lines: Sequence[str], md: str | Path | None) -> None:
    """Print a bench's markdown and, given a path, write it there."""
    text = "\n".join(lines)
    print(text)
    if md:
        Path(md).write_text(text + "\n")


def pair_parser(doc: str) -> argparse.ArgumentParser:
    """A two-variant CPU bench's command line: its docstring's first paragraph, --rounds
    (alternating, `timed_rounds`) and --md (where `pair_report` writes)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--md", default=None)
    return ap


def pair_report(
    title: str,
    how: str,
    base: tuple[str, list[float]],
    cand: tuple[str, list[float]],
    md: str | Path | None,
    *,
    notes: Sequence[str] = (),
    unit: str = "s",
    per: str = "run",
) -> None:
    """A two-variant CPU bench's markdown (`report`): the command with `how` it was run,
    each round's seconds of the baseline and the candidate and their ratio, then the mean
    ratio with its spread and the time saved `per` run (or command). `unit`: "s" or "ms"."""
    (base_name, b), (cand_name, c) = base, cand
    ratio = ratio_over_rounds(b, c)
    scale, digits = (1e3, 1) if unit == "ms" else (1.0, 3)  # saved: one digit fewer
    saved = statistics.fmean(x - y for x, y in zip(b, c, strict=True)) * scale
    rows = zip(b, c, ratio.per_round, strict=True)
    report(
        [
            f"# {title}",
            "",
            f"Command: `python {' '.join(sys.argv)}` (alternating order, A B | B A ...; "
            f"bench/ab.py{'; ' + how if how else ''}).",
            *notes,
            "",
            f"| round | {base_name} ({unit}) | {cand_name} ({unit}) | ratio |",
            "|---|---:|---:|---:|",
            *(
                f"| {r} | {x * scale:.{digits}f} | {y * scale:.{digits}f} | {k:.2f} |"
                for r, (x, y, k) in enumerate(rows)
            ),
            "",
            f"Ratio {ratio.value:.2f} +- {ratio.spread:.2f} (mean over rounds +- half-width); "
            f"{saved:.{digits - 1}f} {unit} saved per {per} (mean).",
        ],
        md,
    )


def round_skip(elapsed_s: float, first_round_s: Sequence[float], budget_s: float | None) -> str:
    """Why a later round should not start ('' when it may): a round only some schedules
    finish gives no ratio, and its device time is lost (run 16 ran verl-like's second round
    and then ran out of --budget-s before rollplex's). A round is expected to take what
    round 0's runs took."""
    if budget_s is None:
        return ""
    need = sum(first_round_s)
    if elapsed_s + need <= budget_s:
        return ""
    return (
        f"skipped: round 0 took {need:.0f} s and {max(budget_s - elapsed_s, 0):.0f} s of "
        f"--budget-s {budget_s:.0f} are left"
    )


def ratio_over_rounds(
    baseline_s: Sequence[float], candidate_s: Sequence[float], same_plan: bool = False
) -> Ratio:
    """Per-round ratios of paired seconds (round r of each side), their mean and spread."""
    if len(baseline_s) != len(candidate_s):
        raise ValueError(f"rounds differ: {len(baseline_s)} baseline, {len(candidate_s)} candidate")
    if len(baseline_s) < MIN_ROUNDS:
        raise ValueError(f"{len(baseline_s)} round(s): a spread needs at least {MIN_ROUNDS}")
    if any(s <= 0 for s in (*baseline_s, *candidate_s)):
        raise ValueError("paired seconds must be positive")
    per = [b / c for b, c in zip(baseline_s, candidate_s, strict=True)]
    spread = (max(per) - min(per)) / 2
    return Ratio(None if same_plan else statistics.fmean(per), spread, per, same_plan)


def paired_seconds(runs: dict[str, list[dict]], paired_from: int = 2) -> dict[str, list]:
    """Each schedule's seconds per round over the same RL steps (`paired_from` .. the
    shortest run's last, 1-based; None for a failed run): step k has the same prompts and
    forced lengths under every schedule and round, so the totals compare like with like.
    `runs`: schedule -> one entry per round, with `step_time_s` or an `error`."""
    ok = [e for v in runs.values() for e in v if "error" not in e]
    if not ok:
        return {k: [None] * len(v) for k, v in runs.items()}
    n = min(len(e["step_time_s"]) for e in ok)
    first = min(paired_from, n) - 1
    return {
        k: [None if "error" in e else sum(e["step_time_s"][first:n]) for e in v]
        for k, v in runs.items()
    }


def compare(runs: dict[str, list[dict]], paired: dict, base: str, cand: str) -> dict | None:
    """`base` seconds / `cand` seconds over the rounds both completed, with its spread
    (`ratio_over_rounds`); same_plan where every run of both had one placement (entries'
    `placement_hash`), and then no speedup is claimed. None where either did not run."""
    if base not in runs or cand not in runs:
        return None
    both = [
        (b, c)
        for b, c in zip(paired[base], paired[cand], strict=False)
        if b is not None and c is not None
    ]
    plans = {
        k: sorted({e["placement_hash"] for e in runs[k] if "error" not in e}) for k in (base, cand)
    }
    if len(both) < MIN_ROUNDS:
        return {"error": f"{len(both)} complete round(s), need {MIN_ROUNDS}", "plans": plans}
    same = len(set(plans[base]) | set(plans[cand])) == 1
    return ratio_over_rounds(*zip(*both, strict=True), same_plan=same).as_json() | {"plans": plans}


def placement(plan: dict[str, Any]) -> list[Any]:
    """What a plan runs, and where, from its `plan.json`: per device group, each step's op,
    kind (prefill_once keeps an op's name and changes its kind), chunk, stream and co-run
    mode in issue order, and the streams' SM partitions; then the switches in `meta` that
    change an op's work in place (micro-batches, packed response rows). Predicted
    times, slot offsets and notes are left out: a calibrated and an uncalibrated plan of
    the same placement run the same work."""
    out: list[Any] = [sorted(plan.get("meta", {}).items())]
    for device in plan["devices"]:
        steps = sorted(device["steps"], key=lambda s: s["index"])
        out.append(
            [
                [
                    (s["op"], s["kind"], s["chunk"], s["chunks"], s["stream"], s["corun"])
                    for s in steps
                ],
                sorted((p["stream"], p["partition"]) for p in device["streams"]),
            ]
        )
    return out


def placement_hash(plan: dict[str, Any]) -> str:
    text = json.dumps(placement(plan), sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def same_plan(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return placement_hash(a) == placement_hash(b)
