"""A torch.profiler (Kineto) trace of plan steps, made to name its memory by plan step.

torch-tb-profiler names an allocation by the innermost `cpu_op` around it, so each plan
step's `record_function` range is copied as a `cpu_op` onto a "plan steps" lane and every
`[memory]` event inside it moves there; marks become instants at their step's end. The
copies count once more in the Operator view; kernels stay with their aten ops.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence

PLAN_TID = 1  # host lane of the plan steps (OS thread ids are never this small)


def _key(e: dict) -> tuple:
    return (e.get("ts", 0.0), -(e.get("dur") or 0.0))


def attribute_to_steps(
    trace: dict,
    step_names: Iterable[str],
    marks: Sequence[tuple[str, int, str]] = (),
) -> dict:
    """The trace (a `torch.profiler` chrome-trace dict) with its memory named by plan step.

    `marks`: (step name, occurrence, text) instants, e.g. `(name, k, why)` for the k-th
    run of that step (0-based, in time order). Returns a new dict, `traceEvents` last."""
    names = set(step_names)
    events = list(trace.get("traceEvents", []))
    ranges = sorted(
        (
            e
            for e in events
            if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") in names
        ),
        key=_key,
    )
    if not ranges:
        raise ValueError(
            "the profiler trace holds no plan step: was the executor run inside the profiler?"
        )
    pid = ranges[0]["pid"]
    copies = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": r["name"],
            "pid": pid,
            "tid": PLAN_TID,
            "ts": r["ts"],
            "dur": r["dur"],
            "args": {"plan step": r["name"]},
        }
        for r in ranges
    ]
    starts = [r["ts"] for r in ranges]
    out = []
    for e in events:
        if e.get("ph") == "i" and e.get("name") == "[memory]":
            k = bisect.bisect_right(starts, e["ts"]) - 1
            if k >= 0 and e["ts"] < ranges[k]["ts"] + ranges[k]["dur"]:
                e = {**e, "pid": pid, "tid": PLAN_TID}
        out.append(e)
    runs: dict[str, list[dict]] = defaultdict(list)
    for r in ranges:
        runs[r["name"]].append(r)
    for name, k, text in marks:
        if k < len(runs.get(name, ())):
            r = runs[name][k]
            mark = {"ph": "i", "s": "t", "cat": "user_annotation", "name": "plan not followed"}
            out.append(
                mark
                | {"pid": pid, "tid": PLAN_TID, "ts": r["ts"] + r["dur"], "args": {"text": text}}
            )
    meta = [
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": PLAN_TID,
         "args": {"name": "plan steps"}},
        {"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": PLAN_TID,
         "args": {"sort_index": 0}},
    ]  # fmt: skip
    rest = {k: v for k, v in trace.items() if k != "traceEvents"}
    return rest | {"traceEvents": meta + out + copies}
