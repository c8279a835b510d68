"""Measured constants shipped with the H200 presets: what an H200 plan is priced with when
the user names no calibration file (`calibration.path` null).

Each entry pools one op kind's measured/predicted seconds from a `rollplex train` run on one
H200 (sources in the comment below); a model between shapes takes the nearest one's
constants (by LLM width), and the plan says which.
"""

from __future__ import annotations

from rollplex.specs.calibration import CalibrationEntry, CalibrationFile
from rollplex.specs.hardware import HardwareSpec, gpu_model
from rollplex.specs.model import ModelSpec

# Sources (4 video prompts x G=8, the torch backend as it ships):
#   qwen2_5_vl_3b: bench/results/gpu_step/runs_qwen2_5_vl_3b_run5/serial_dedup/calibration.json
#   qwen2_5_vl_7b: bench/results/gpu_step/runs_qwen2_5_vl_7b_run9/serial_dedup/calibration.json
# Kinds priced by their launch alone (reward, advantage, policy_loss, weight_sync) are left
# out: an efficiency scale does not reach them.
# model -> (kind, predicted s, measured s): each kind summed over its entries in the file.
# logprob_response's and backward's predicted seconds are re-priced at the width the runtime
# pads scoring rows to (ops/response_width.py): the file's, times new over old pricing of
# the same plan (bench/pricing_padded_tokens.py --rerun <run>/serial_dedup), so each
# measured ratio stays the time the model still misses, not the padding it now prices.
_H200: dict[str, tuple[tuple[str, float, float], ...]] = {
    "qwen2_5_vl_3b": (
        ("vision_encode", 0.0714995, 0.129387),
        ("prefix_prefill", 0.0831491, 0.132654),
        ("decode", 3.55336, 9.11291),
        ("logprob_prefix", 0.166298, 0.264142),
        ("logprob_response", 1.29889, 2.05924),
        ("backward", 1.68680, 3.18753),
        ("optimizer_step", 0.0514723, 0.183909),
    ),
    "qwen2_5_vl_7b": (
        ("vision_encode", 0.0717167, 0.124857),
        ("prefix_prefill", 0.191136, 0.212258),
        ("decode", 7.8173, 9.56358),
        ("logprob_prefix", 0.382272, 0.443433),
        ("logprob_response", 2.87249, 3.5383),
        ("backward", 3.76456, 5.10417),
        ("optimizer_step", 0.126967, 0.277607),
    ),
}
_WIDTH = {"qwen2_5_vl_3b": 2048, "qwen2_5_vl_7b": 3584}  # LLM hidden size of each


def _file(model: str) -> CalibrationFile:
    return CalibrationFile(
        format="rollplex-calibration/1",
        device="NVIDIA H200",
        hardware="h200",
        model=model,
        entries=tuple(
            CalibrationEntry(kind=k, op=f"{k} (pooled)", predicted_s=p, measured_s=m)
            for k, p, m in _H200[model]
        ),
    )


def shipped_for(hardware: HardwareSpec, model: ModelSpec) -> tuple[CalibrationFile, str] | None:
    """The shipped constants for this GPU and the nearest measured model, and a line
    naming them; None where the GPU has none."""
    if gpu_model(hardware.gpu) != "H200":
        return None
    nearest = min(_WIDTH, key=lambda m: abs(_WIDTH[m] - model.hidden_size))
    return _file(nearest), f"shipped h200 defaults (measured on {nearest})"
