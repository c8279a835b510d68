"""Fit the shipped H200 constants (planner/shipped_calibration.py) from recorded runs.

Observations: each op of each traced step that ran alone, its GPU seconds beside its bare
price (the cost model without constants) at that step's drawn lengths, and the runs its
fixed cost is paid per (CostModel.fixed_s: a trainer micro-batch; one layer of one decode
step; else one). Per kind, least squares of measured against
- `raw / k` (SCALE_ONLY: the forwards of one pass, the optimizer): an efficiency;
- `raw / k + runs * fixed` (SCALE_AND_FIXED: the trainer's response forward and backward,
  which measure a fixed part per micro-batch no efficiency reaches: in run 10 the response
  forward takes 0.34-0.53 s over 117-256 columns where run 11's takes 0.81-0.86 s over
  819-1024);
- `raw + runs * fixed` (FIXED_ONLY: decode keeps the bare 77% of HBM bandwidth and pays
  fixed seconds per layer per step: 5.4 ms a step at 7B, 3.7-4.0 at 3B, against 4.2 and
  2.0 of bandwidth, the same ~45 us a layer);
- `runs * fixed` for the rest (rewards, losses, attach, sync: priced by their launch).
An op at over 3x its kind's median measured/raw (a recompile at a new shape: run 10's
round 0 serial + dedup, reference response logprobs 2.2 s in step 3) is left out of the
fit, not out of the check. `dispatch_s` is each traced step's time outside any op over the
ops its plan issues.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from prediction_runs import RecordedRun, drawn_workload, price, spec_of

from rollplex.planner.cost_model import CostModel
from rollplex.planner.shipped_calibration import CostConstants

SCALE_ONLY = ("vision_encode", "prefix_prefill", "logprob_prefix", "logprob", "optimizer_step")
SCALE_AND_FIXED = ("logprob_response", "backward")
FIXED_ONLY_SCALED = ("decode",)
OUTLIER = 3.0
PROBE = 1e-9  # fixed seconds per run that count the runs without moving a decision


@dataclass(slots=True, frozen=True)
class Observation:
    run: int
    workload: str  # model, frames, mean length: the fit weighs each workload alike
    label: str
    step: int
    op: str
    kind: str
    raw_s: float  # bare cost model, at the step's drawn lengths
    runs: float  # runs that pay the kind's fixed seconds
    measured_s: float


@dataclass(slots=True, frozen=True)
class StepGap:
    run: int
    workload: str
    gap_s: float  # the step's seconds outside every op
    issued: int  # ops the plan issues (each pays dispatch_s)


def observe(runs: list[RecordedRun]) -> tuple[list[Observation], list[StepGap]]:
    """Every traced op of `runs` against its bare price at its step's lengths."""
    obs, gaps = [], []
    for run in runs:
        spec = spec_of(run)
        w = spec.workload
        workload = f"{spec.model.name} {w.frames} frames mean {w.response_length.mean}"
        bare = CostModel(spec.hardware)
        kinds = {k for k in _kinds(spec, bare)}
        probe = CostModel(spec.hardware, fixed_s={k: PROBE for k in kinds})
        for t in run.traced:
            workload = drawn_workload(spec, t.step)
            raw, counted = price(spec, bare, workload), price(spec, probe, workload)
            gaps.append(StepGap(run.run, workload, t.seconds - t.busy_s, raw.issued))
            for op, seconds in t.ops.items():
                if op not in raw.ops or op not in counted.ops:
                    continue
                kind, raw_s = raw.ops[op]
                runs_ = max(0.0, round((counted.ops[op][1] - raw_s) / PROBE, 3))
                where = (run.run, workload, run.label, t.step, op, kind)
                obs.append(Observation(*where, raw_s, runs_, seconds))
    return obs, gaps


def _kinds(spec, bare: CostModel) -> set[str]:
    return {kind for kind, _ in price(spec, bare).ops.values()}


def fit(obs: list[Observation], gaps: list[StepGap]) -> CostConstants:
    """The constants that fit `obs` and `gaps` (module docstring)."""
    scales: dict[str, float] = {}
    fixed: dict[str, float] = {}
    for kind in sorted({o.kind for o in obs}):
        mine = _inliers([o for o in obs if o.kind == kind and o.raw_s > 0])
        if not mine:
            continue
        wt = _weights([o.workload for o in mine])
        x = [o.raw_s * w for o, w in zip(mine, wt, strict=True)]
        n = [o.runs * w for o, w in zip(mine, wt, strict=True)]
        y = [o.measured_s * w for o, w in zip(mine, wt, strict=True)]
        if kind in SCALE_ONLY:
            scales[kind] = _dot(x, x) / _dot(x, y)
        elif kind in SCALE_AND_FIXED:
            a, c = _two(x, n, y)
            scales[kind], fixed[kind] = 1 / a, c
        elif kind in FIXED_ONLY_SCALED:
            rest = [yi - xi for xi, yi in zip(x, y, strict=True)]
            fixed[kind] = max(0.0, _dot(n, rest) / _dot(n, n))
        elif any(n):  # a kind that pays no fixed runs (a sync: priced by its link) is left
            per = [(yi - xi) / ni for xi, ni, yi in zip(x, n, y, strict=True) if ni > 0]
            fixed[kind] = max(0.0, statistics.median(per))
    wt = _weights([g.workload for g in gaps])
    issued = [g.issued * w for g, w in zip(gaps, wt, strict=True)]
    gap = [g.gap_s * w for g, w in zip(gaps, wt, strict=True)]
    dispatch = _dot(issued, gap) / _dot(issued, issued) if gaps else 0.0
    return CostConstants(scales, {k: v for k, v in fixed.items() if v > 0}, dispatch)


def _weights(workloads: list[str]) -> list[float]:
    """Least-squares row weights that give each workload the same total weight: one
    measured by more schedules or rounds does not decide the fit alone."""
    count = {w: workloads.count(w) for w in set(workloads)}
    return [count[w] ** -0.5 for w in workloads]


def _inliers(obs: list[Observation]) -> list[Observation]:
    if len(obs) < 3:
        return obs
    mid = statistics.median(o.measured_s / o.raw_s for o in obs)
    return [o for o in obs if o.measured_s / o.raw_s <= OUTLIER * mid]


def _dot(a: list[float], b: list[float]) -> float:
    return sum(p * q for p, q in zip(a, b, strict=True))


def _two(x: list[float], n: list[float], y: list[float]) -> tuple[float, float]:
    """Least squares y = a x + c n with c >= 0 (a alone where c would be negative)."""
    sxx, snn, sxn = _dot(x, x), _dot(n, n), _dot(x, n)
    sxy, sny = _dot(x, y), _dot(n, y)
    det = sxx * snn - sxn * sxn
    if det > 1e-12 * sxx * snn:
        a = (sxy * snn - sny * sxn) / det
        c = (sny * sxx - sxy * sxn) / det
        if c >= 0 and a > 0:
            return a, c
    return sxy / sxx, 0.0


def literal(c: CostConstants) -> str:
    """`c` as the Python literal shipped_calibration.py holds."""
    scales = "".join(f'        "{k}": {v:.4g},\n' for k, v in sorted(c.scales.items()))
    fixed = "".join(f'        "{k}": {v:.4g},\n' for k, v in sorted(c.fixed_s.items()))
    return (
        "H200 = CostConstants(\n    scales={\n" + scales + "    },\n    fixed_s={\n"
        + fixed + f"    }},\n    dispatch_s={c.dispatch_s:.4g},\n)"
    )  # fmt: skip
