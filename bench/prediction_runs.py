"""The recorded GPU runs that bench/prediction_check.py re-prices (CPU only, no model).

A run folder `runs_<shape>_run<N>/[round<k>/]<schedule>/` of bench/results/gpu_step/ holds
the run's config.json, metrics.csv (every step's seconds) and tb/measured0.*.pt.trace.json
(each traced step's ops as the GPU timed them). Re-planned here on this code:
- as the run ran: `schedule.prefill_once=false` and `schedule.decode_once=false` where
  the config predates them;
- at the workload's distribution (the planner's prediction), or at one step's drawn lengths
  (`drawn_workload`: `train.response_lengths=workload` draws them from (seed, step), so they
  are known exactly), which separates the model's error from the draw's.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from trace_kernels import load

from rollplex.backends import rollout_capabilities, trainer_capabilities
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.cost_model import CostModel
from rollplex.planner.simulate import union_length
from rollplex.runtime.rollout_ops import forced_lengths
from rollplex.specs.run import RunSpec
from rollplex.specs.workload import ResponseLengthSpec, WorkloadSpec

COPY_KINDS = ("onload", "offload")
TRACE = "tb/measured0.000001.pt.trace.json"


@dataclass(slots=True)
class TracedStep:
    """One traced RL step: its seconds, the seconds some op ran, and each op's seconds."""

    step: int  # 1-based, as metrics.csv counts
    seconds: float
    busy_s: float  # the union of every op's span, all streams
    ops: dict[str, float]  # op -> GPU seconds (its chunks summed), ops that ran alone
    issued: int  # op steps the host issued in it (copies included)


@dataclass(slots=True)
class RecordedRun:
    folder: Path
    label: str  # path under the results folder
    run: int  # the N of runs_<shape>_runN
    config: dict
    step_s: list[float]  # every step, metrics.csv order
    timed_from: int  # first timed step (1-based)
    traced: list[TracedStep]

    @property
    def timed_s(self) -> list[float]:
        return self.step_s[self.timed_from - 1 :]

    @property
    def measured_s(self) -> float:
        """Median of the timed steps: what the bench reports."""
        return statistics.median(self.timed_s)


def find_runs(root: Path) -> list[RecordedRun]:
    """Every run folder under `root` with a config and step times, in run order."""
    runs = []
    for config in root.glob("runs_*_run*/**/config.json"):
        folder = config.parent
        if not (folder / "metrics.csv").exists():
            continue  # the run died (verl's OOM in run 10): nothing measured
        number = int(re.search(r"_run(\d+)", str(folder.relative_to(root))).group(1))
        with open(folder / "metrics.csv") as f:
            steps = [float(r["step_time_s"]) for r in csv.DictReader(f)]
        runs.append(
            RecordedRun(
                folder,
                str(folder.relative_to(root)),
                number,
                json.loads(config.read_text()),
                steps,
                _timed_from(root, number),
                _traced(folder, len(steps)),
            )
        )
    return sorted(runs, key=lambda r: (r.run, r.label))


def _timed_from(root: Path, run: int) -> int:
    """The bench's first timed step (`paired_from_step`; 2 where the JSON predates it:
    step 1 pays each run's warm-up, as the README's tables say)."""
    for path in root.glob(f"gpu_step_*_run{run}.json"):
        return int(json.loads(path.read_text()).get("paired_from_step") or 2)
    return 2


def _traced(folder: Path, steps: int) -> list[TracedStep]:
    """The traced steps (the run's last `train.trace_steps`), from its measured trace."""
    path = folder / TRACE
    if not path.exists():
        return []
    events = load(path)
    marks = sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")]
    out = []
    for k, mark in enumerate(marks):
        lo, hi = mark["ts"], mark["ts"] + mark["dur"]
        mine = sorted((e for e in spans if lo <= e["ts"] < hi), key=lambda e: e["ts"])
        busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in mine])
        ops: dict[str, float] = {}
        for e in mine:
            if e["cat"] == "kernel" and e.get("args", {}).get("corun", "none") == "none":
                name = e["name"].split("#")[0]
                ops[name] = ops.get(name, 0.0) + e["dur"] / 1e6
        step = steps - len(marks) + k + 1
        out.append(TracedStep(step, mark["dur"] / 1e6, busy / 1e6, ops, len(mine)))
    return out


def spec_of(run: RecordedRun) -> RunSpec:
    """The run's config as this code validates it, planned as it ran."""
    cfg = json.loads(json.dumps(run.config))
    cfg["calibration"] = {"path": "none", "strict": False}  # priced by the caller's model
    schedule = cfg["schedule"]
    schedule.setdefault("prefill_once", False)
    schedule.setdefault("decode_once", False)
    schedule.setdefault("pack_responses", False)  # runs before packing scored padded rows
    schedule.setdefault("write_back", "step_end")  # runs before it wrote back at the end
    schedule.setdefault("offload_in_part", False)  # and moved optimizer state whole
    return RunSpec.model_validate(cfg)


class DrawnLengths(ResponseLengthSpec):
    """One step's drawn response lengths in place of their distribution: the longest of n
    rows is the mean over the step's consecutive blocks of n rows (the trainer's
    micro-batches are such blocks), the survivors at a length are counted."""

    drawn: tuple[int, ...] = ()

    def quantile(self, q: float) -> float:
        ordered = sorted(self.drawn)
        return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])

    def expected_max(self, batch: int) -> float:
        n, d = max(1, int(batch)), self.drawn
        if n >= len(d):
            return float(max(d))
        blocks = [max(d[i : i + n]) for i in range(0, len(d) - n + 1, n)]
        return sum(blocks) / len(blocks)

    def survival(self, length: float) -> float:
        return sum(1 for x in self.drawn if x > length) / len(self.drawn)


def drawn_workload(spec: RunSpec, step: int) -> WorkloadSpec:
    """`spec`'s workload at the lengths metrics step `step` drew (the runtime's step
    counter starts at 0)."""
    lengths = spec.workload.response_length
    rows = spec.workload.prompts_per_step * spec.workload.group_size
    drawn = forced_lengths(lengths, rows, spec.train.max_new_tokens, spec.seed, step - 1)
    fields = {**lengths.model_dump(), "mean": statistics.mean(drawn), "drawn": tuple(drawn)}
    drawn_lengths = DrawnLengths.model_construct(**fields)
    return spec.workload.model_copy(update={"response_length": drawn_lengths})


@dataclass(slots=True)
class Priced:
    step_s: float
    ops: dict[str, tuple[str, float]]  # op -> (kind, solo seconds, chunks summed), no copies
    issued: int  # op steps in the plan but copies: each pays `dispatch_s`


def price(spec: RunSpec, cost_model: CostModel, workload: WorkloadSpec | None = None) -> Priced:
    """`spec`'s step planned by `cost_model` (as `rollplex plan` plans it, the budget not
    enforced: configs of older runs may no longer fit this code's memory model)."""
    result = plan_step(
        spec.model,
        workload or spec.workload,
        spec.algo,
        spec.hardware,
        spec.schedule,
        cost_model=cost_model,
        enforce_budget=False,
        rollout=rollout_capabilities(spec.backend),
        trainer=trainer_capabilities(spec.backend, spec.hardware.num_gpus),
    )
    ops: dict[str, tuple[str, float]] = {}
    issued = 0
    for dev in result.plan.devices:
        for s in dev.steps:
            if s.kind not in COPY_KINDS:
                issued += 1
                kind, t = ops.get(s.op, (s.kind, 0.0))
                ops[s.op] = (kind, t + s.solo_s)
    return Priced(result.plan.step_time_s, ops, issued)
