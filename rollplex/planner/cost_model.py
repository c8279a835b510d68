"""Op time on one GPU: a roofline over the op's Cost, with efficiency factors.

    time = max(flops / (peak * compute_eff), bytes / (hbm_bw * bandwidth_eff))
           + launches * launch_s + exposed communication
           + runs * fixed_s[kind] + dispatch_s
Micro-batches re-read the weights and pay their launches each; a calibration file rescales
each kind's efficiency by the median measured ratio (docs/architecture.md, Planner).
`fixed_s` and `dispatch_s` are what a roofline cannot reach, measured: a kind's fixed
seconds per run (a trainer micro-batch; one layer of one decode step) and the host's time
between two ops. The bare model has none; the shipped H200 constants set them
(planner/shipped_calibration.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rollplex.ops.formulas import Cost
from rollplex.specs import HardwareSpec
from rollplex.specs.calibration import in_op_rows, kind_scales

CALIBRATION_FORMAT = "rollplex-calibration/1"
BANDWIDTH_KINDS = frozenset(
    {"decode", "generate", "weight_sync", "expand_group", "select_rows", "optimizer_step"}
)

# Kinds whose ops run what their relatives' ops run, in other proportions. A calibration
# without a kind's own measurements rescales it by its relatives' measured over predicted
# seconds (pooled): verl's one-pass `logprob` over prefix and response is what a
# prefix-shared schedule measures as `logprob_prefix` + `logprob_response`, and vLLM's
# `generate` is mostly decode.
RELATED_KINDS: dict[str, tuple[str, ...]] = {
    "logprob": ("logprob_prefix", "logprob_response"),
    "generate": ("decode",),
}


@dataclass(slots=True, frozen=True)
class Efficiency:
    compute: float = 0.6
    bandwidth: float = 0.8


DEFAULT_EFFICIENCY: dict[str, Efficiency] = {
    "decode": Efficiency(compute=0.6, bandwidth=0.77),
    "generate": Efficiency(compute=0.6, bandwidth=0.77),  # mostly decode
    "optimizer_step": Efficiency(compute=0.5, bandwidth=0.7),
    "expand_group": Efficiency(compute=0.5, bandwidth=0.6),
    "select_rows": Efficiency(compute=0.5, bandwidth=0.6),
}


@dataclass(slots=True, frozen=True)
class Timing:
    """Predicted solo time of one op on one GPU, and why."""

    seconds: float
    compute_s: float
    memory_s: float
    comm_s: float
    rate_class: str  # "bandwidth" if memory-bound, else "compute"
    scratch_bytes: float = 0.0  # transient memory while it runs
    # what kernel launches add to max(compute_s, memory_s): micro-batches too small to
    # hide them (memory_s already holds every micro-batch's weight reads), and the kind's
    # fixed seconds per run (CostModel.fixed_s)
    launch_bound_s: float = 0.0


@dataclass(slots=True)
class CostModel:
    hardware: HardwareSpec
    efficiency: dict[str, Efficiency] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))
    launch_s: float = 20e-6  # one CUDA-graph replay or kernel launch
    # kind -> seconds each run of it pays beyond its roofline (see the module docstring)
    fixed_s: dict[str, float] = field(default_factory=dict)
    dispatch_s: float = 0.0  # host time the runtime spends between two ops, per op

    def eff(self, kind: str) -> Efficiency:
        return self.efficiency.get(kind, Efficiency())

    def time(
        self,
        kind: str,
        cost: Cost,
        launches: int = 1,
        comm_bytes: float = 0.0,
        comm_gbps: float | None = None,
        overlap_comm: bool = False,
        micro_batches: int = 1,
        kernels: int = 0,
        fixed_runs: int | None = None,
    ) -> Timing:
        """`micro_batches`: runs of 1/m of the rows each; `kernels`: launches per run;
        `fixed_runs`: runs that pay `fixed_s[kind]` (default: the micro-batches)."""
        if micro_batches < 1 or kernels < 0 or (fixed_runs is not None and fixed_runs < 0):
            raise ValueError(
                f"micro_batches={micro_batches} must be >= 1, kernels and fixed_runs >= 0"
            )
        e = self.eff(kind)
        hw = self.hardware
        m = micro_batches
        bandwidth = hw.hbm_bandwidth * e.bandwidth
        compute = cost.flops / (hw.peak_flops * e.compute)
        # each micro-batch reads the weights once more (the first read is in cost.bytes)
        memory = (cost.bytes + (m - 1) * cost.weight_bytes) / bandwidth
        launched = m * kernels * self.launch_s
        link = (comm_gbps or hw.nvlink_gbps) * 1e9
        comm = comm_bytes / link
        body = max(compute, memory, launched)
        exposed = max(0.0, comm - body) if overlap_comm else comm
        bound = "bandwidth" if memory >= compute or kind in BANDWIDTH_KINDS else "compute"
        runs = micro_batches if fixed_runs is None else fixed_runs
        fixed = runs * self.fixed_s.get(kind, 0.0)
        seconds = body + exposed + launches * self.launch_s + fixed + self.dispatch_s
        # launch_bound_s: everything the body adds to the roofline (launches, fixed runs)
        extra = body - max(compute, memory) + fixed
        return Timing(seconds, compute, memory, comm, bound, launch_bound_s=extra)

    def transfer_s(self, nbytes: float, gbps: float) -> float:
        return nbytes / (gbps * 1e9) + self.launch_s

    # -- calibration --------------------------------------------------------------------
    def calibrated(self, path: str | Path) -> CostModel:
        """A copy whose per-kind times match the measured times in `path`; kinds measured
        there get their median ratio, unmeasured RELATED_KINDS their relatives'. The ratio
        rescales a kind's efficiencies and its fixed seconds alike: `path`'s predictions
        must be this model's (jobs/pricing.py applies a file's `priced_with` first)."""
        data = json.loads(Path(path).read_text())
        if data.get("format") != CALIBRATION_FORMAT:
            raise ValueError(
                f"{path}: 'format' must be {CALIBRATION_FORMAT!r}, got {data.get('format')!r}"
            )
        return self.calibrated_by(data.get("entries", []), where=str(path))

    def calibrated_by(self, entries: list[dict], where: str = "calibration") -> CostModel:
        """`calibrated` from entries already read ({"kind", "predicted_s", "measured_s"}).
        A predicted solo time includes this model's `dispatch_s`, the host's gap before the
        op, which its measured window leaves out: the ratios compare the rest."""
        rows = []
        for i, entry in enumerate(entries):
            for key in ("kind", "predicted_s", "measured_s"):
                if key not in entry:
                    raise ValueError(f"{where}: entries[{i}] lacks '{key}'")
            rows.append((entry["kind"], entry["predicted_s"], entry["measured_s"]))
        scale = kind_scales(rows, self.dispatch_s)  # <1: slower
        seconds: dict[str, list[float]] = {}  # kind -> [predicted, measured] summed
        for kind, predicted, measured in in_op_rows(rows, self.dispatch_s):
            total = seconds.setdefault(kind, [0.0, 0.0])
            total[0] += predicted
            total[1] += measured
        for kind, relatives in RELATED_KINDS.items():
            measured = [seconds[r] for r in relatives if r in seconds]
            if kind not in scale and measured:
                scale[kind] = sum(p for p, _ in measured) / sum(m for _, m in measured)
        eff, fixed = dict(self.efficiency), dict(self.fixed_s)
        for kind, k in scale.items():
            base = self.eff(kind)
            eff[kind] = Efficiency(base.compute * k, base.bandwidth * k)
            if kind in fixed:  # the kind's whole time: its fixed part scales alike
                fixed[kind] /= k
        return CostModel(self.hardware, eff, self.launch_s, fixed, self.dispatch_s)


# Kernels one decoder layer (or vision block) launches per micro-batch, counted in
# transformers' eager Qwen2 layer (aten ops other than views, a torch dispatch mode, torch
# 2.13 CPU, SDPA attention): 30 in the forward, 67 in its backward.
FORWARD_KERNELS_PER_LAYER = 30
BACKWARD_KERNELS_PER_LAYER = 67


def write_calibration(
    path: str | Path, device: str, entries: list[dict], provenance: dict | None = None
) -> None:
    """The file `CostModel.calibrated` reads: one entry per measured op, and where they
    were measured (`provenance`: hardware, model, model_shape, software).

    entry = {"kind", "op", "predicted_s", "measured_s", "flops", "bytes"}"""
    data = {"format": CALIBRATION_FORMAT, "device": device, **(provenance or {})}
    Path(path).write_text(json.dumps({**data, "entries": entries}, indent=1))
