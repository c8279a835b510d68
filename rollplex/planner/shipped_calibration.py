"""Measured constants shipped with the H200 presets (and applied to the H100's): what such a
plan is priced with when the user names no calibration file (`calibration.path` null).

One set for every model (fit pooled over the 3B and 7B runs: the same tower, kernels and
runtime; the model's size enters through the roofline). Per op kind, an efficiency scale
and fixed seconds per run (CostModel.fixed_s: a trainer micro-batch, one layer of one
decode step); and the host's time between two ops (CostModel.dispatch_s). Sources below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollplex.planner.cost_model import CostModel, Efficiency
from rollplex.specs.hardware import HardwareSpec, gpu_model


@dataclass(slots=True, frozen=True)
class CostConstants:
    """What prices a plan beyond the bare cost model. `scales`: kind -> predicted/measured
    seconds of its roofline part (< 1: slower than the bare model), which multiplies both
    its efficiencies; `fixed_s`: kind -> seconds per run; `dispatch_s`: per op."""

    scales: dict[str, float] = field(default_factory=dict)
    fixed_s: dict[str, float] = field(default_factory=dict)
    dispatch_s: float = 0.0

    def applied_to(self, base: CostModel) -> CostModel:
        """`base` with these constants: its efficiencies rescaled, the fixed costs set."""
        eff = dict(base.efficiency)
        for kind, k in self.scales.items():
            e = base.eff(kind)
            eff[kind] = Efficiency(e.compute * k, e.bandwidth * k)
        fixed = {**base.fixed_s, **self.fixed_s}
        return CostModel(base.hardware, eff, base.launch_s, fixed, self.dispatch_s)

    @classmethod
    def of(cls, model: CostModel) -> CostConstants:
        """The constants that make the bare model of `model`'s hardware into `model`: what a
        run's calibration.json records as `priced_with`, so that a calibration from it
        rescales the model that priced its predictions, not the bare one."""
        bare = CostModel(model.hardware)
        scales = {
            kind: e.compute / bare.eff(kind).compute
            for kind, e in model.efficiency.items()
            if e != bare.eff(kind)
        }
        return cls(scales, dict(model.fixed_s), model.dispatch_s)

    def as_dict(self) -> dict:
        return {"scales": self.scales, "fixed_s": self.fixed_s, "dispatch_s": self.dispatch_s}


# Fit by `python bench/prediction_check.py --fit` (bench/prediction_fit.py: the model per
# kind, the outliers left out, each workload weighed alike) from the per-op GPU times of the
# traced steps of every run folder of
#   bench/results/gpu_step/runs_qwen2_5_vl_7b_run10/, runs_qwen2_5_vl_7b_run11/,
#   runs_qwen2_5_vl_3b_run12/ and runs_qwen2_5_vl_7b_run14/
# (one H200; 4 video prompts x G=8 of 448x448 frames, GRPO with a reference, the torch
# backend; run 10: 7B, 32 frames, mean response 64; run 11: 7B, 8 frames, mean 448; run 12:
# 3B, 16 frames, mean 160; run 14: run 10's workload with decode once, whose attach_response
# it alone measures), each op priced at its step's drawn response lengths; dispatch_s from
# each traced step's time outside any op. Runs 1-9 measured older code (decode engine,
# trainer) and are left out of the fit; so is run 13, on an H100.
# bench/results/prediction_check.md checks it run by run, each run held out of its own fit.
H200 = CostConstants(
    scales={
        "backward": 0.9051,
        "logprob": 0.7953,
        "logprob_prefix": 0.8591,
        "logprob_response": 0.9114,
        "optimizer_step": 0.4862,
        "prefix_prefill": 0.8698,
        "vision_encode": 0.7136,
    },
    fixed_s={
        "advantage": 0.0002758,
        "attach_prefix": 0.005387,
        "attach_response": 0.07366,
        "backward": 0.2018,
        "decode": 4.553e-05,
        "expand_group": 0.0007264,
        "logprob_response": 0.06184,
        "policy_loss": 0.003889,
        "reward": 0.006922,
    },
    dispatch_s=0.01983,
)
MEASURED_ON = ("qwen2_5_vl_3b", "qwen2_5_vl_7b")

# The H100 (SXM) is priced with the H200's constants: the scales multiply the roofline of the
# preset's own bandwidth and peak, and the fixed and dispatch seconds are the host's and the
# runtime's. Checked, not fit, on the H100 runs 22, 23 and 25 (3B, 8 frames, mean 448; the
# "not fit (h100)" rows of bench/results/prediction_check.md): measured / predicted
# 0.92-1.10, apart from one first-run outlier (1.73); the bare model was 1.42-3.09.
SHIPPED = {"H200": H200, "H100": H200}
CHECKED_ON = {"H100": "checked on 3B H100 runs"}


def shipped_cost_model(hardware: HardwareSpec, base: CostModel) -> tuple[CostModel, str] | None:
    """`base` priced with the shipped constants of this GPU, and a line naming them; None
    where the GPU has none."""
    gpu = gpu_model(hardware.gpu)
    if gpu not in SHIPPED:
        return None
    line = f"shipped h200 defaults (measured on {' and '.join(MEASURED_ON)})"
    if gpu != "H200":
        line += f", applied to the {gpu} ({CHECKED_ON[gpu]})"
    return SHIPPED[gpu].applied_to(base), line
