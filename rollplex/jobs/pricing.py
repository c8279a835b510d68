"""Which constants price a plan, said once in the run log and in the summaries: the bare
cost model ("uncalibrated"), the hardware's shipped constants (planner/shipped_calibration),
or a calibration file. A file measured on another GPU or model is applied with a warning
naming both, or refused with `calibration.strict=true`; `calibration=auto` takes the
latest calibration.json of the same model shape and GPU from the runs beside this one.
Every train run writes its own calibration.json with that provenance (`provenance`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollplex.ops.calibration import load_calibration
from rollplex.planner.cost_model import CostModel
from rollplex.planner.shipped_calibration import CostConstants, shipped_cost_model
from rollplex.specs.calibration import CalibrationError, CalibrationFile, model_shape
from rollplex.specs.hardware import gpu_model
from rollplex.specs.run import RunSpec

log = logging.getLogger(__name__)
UNCALIBRATED = "uncalibrated"
CALIBRATION_FILE = "calibration.json"
UNKNOWN_DEVICES = {"CUDA", ""}  # files written before provenance: "cuda", not its name


@dataclass(slots=True, frozen=True)
class Pricing:
    cost_model: CostModel
    source: str  # "uncalibrated", "shipped h200 defaults (...)" or the file's path
    path: str | None  # the file, when one priced it


_cache: dict[str, Pricing] = {}


def pricing_for(spec: RunSpec) -> Pricing:
    """The cost model for `spec` (its `calibration.path` already resolved: no 'auto'),
    logged once per spec and process. CalibrationError (a ValueError) for a bad file."""
    key = spec.model_dump_json()
    if key not in _cache:
        _cache[key] = _price(spec)
        log.info("plan priced by: %s", _cache[key].source)
    return _cache[key]


def _price(spec: RunSpec) -> Pricing:
    base = CostModel(spec.hardware)
    path = spec.calibration.path
    if path == "none":
        return Pricing(base, UNCALIBRATED, None)
    if path == "auto":  # a job resolves it against its run folder first
        raise CalibrationError("calibration=auto: call resolve_auto(spec, run folder) first")
    if path is None:
        shipped = shipped_cost_model(spec.hardware, base)
        if shipped is None:
            return Pricing(base, UNCALIBRATED, None)
        return Pricing(*shipped, None)
    file = load_calibration(path)  # one line naming the file and field if it is bad
    mismatch = provenance_mismatch(file, spec)
    if mismatch:
        where = f"calibration file '{path}'"
        if spec.calibration.strict:
            raise CalibrationError(f"{where}: {mismatch} (calibration.strict=true)")
        log.warning("%s: %s; applied anyway (calibration.strict=true refuses)", where, mismatch)
    if file.priced_with is not None:  # rescale the model that priced its predictions
        base = CostConstants(**file.priced_with.model_dump()).applied_to(base)
    return Pricing(base.calibrated(path), str(path), str(path))


def provenance_mismatch(file: CalibrationFile, spec: RunSpec) -> str | None:
    """Why `file` may not describe `spec`'s GPU and model (None: it records both, and
    both match)."""
    problems = []
    device = gpu_model(file.device)
    if device in UNKNOWN_DEVICES:
        problems.append(f"it records no device name (device '{file.device}')")
    elif device != gpu_model(spec.hardware.gpu):
        problems.append(f"measured on '{file.device}', planning for '{spec.hardware.gpu}'")
    if file.model_shape is None:
        problems.append("it records no model shape")
    elif file.model_shape != model_shape(spec.model):
        problems.append(
            f"measured with model '{file.model}' ({_shape_line(file.model_shape)}), planning "
            f"'{spec.model.name}' ({_shape_line(model_shape(spec.model))})"
        )
    return "; ".join(problems) or None


def _shape_line(shape: dict[str, Any]) -> str:
    return f"hidden {shape.get('hidden_size')}, {shape.get('num_layers')} layers"


def resolve_auto(spec: RunSpec, out: Path) -> RunSpec:
    """`calibration=auto` made concrete: the newest calibration.json of an earlier run
    (out/../../*/*/: outputs/<job>/<time>/) whose device and model shape match `spec`'s;
    none found: the default (the shipped constants, or none)."""
    if spec.calibration.path != "auto":
        return spec
    # outputs/<job>/<time>/calibration.json: this job's runs and the other jobs' alike
    candidates = [
        p
        for p in out.parent.parent.glob(f"*/*/{CALIBRATION_FILE}")
        if p.parent.resolve() != out.resolve()
    ]
    found = None
    for p in sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            file = load_calibration(p)
        except CalibrationError:
            continue
        if provenance_mismatch(file, spec) is None:
            found = p
            break
    chosen = str(found) if found else None
    log.info(
        "calibration=auto: %s",
        f"{found}" if found else f"no matching {CALIBRATION_FILE} beside {out}; the default",
    )
    update = {"calibration": spec.calibration.model_copy(update={"path": chosen})}
    return spec.model_copy(update=update)


def provenance(spec: RunSpec) -> dict[str, Any]:
    """What a run's calibration.json records about where it was measured."""
    from rollplex.runtime.compile_cache import software_versions

    return {
        "hardware": spec.hardware.name,
        "model": spec.model.name,
        "model_shape": model_shape(spec.model),
        "software": software_versions(),
    } | _priced_with(spec)


def _priced_with(spec: RunSpec) -> dict[str, Any]:
    """The constants that priced `spec`'s plan ('auto' unresolved: none known)."""
    if spec.calibration.path == "auto":
        return {}
    return {"priced_with": CostConstants.of(pricing_for(spec).cost_model).as_dict()}


def device_name(device: str) -> str:
    """The CUDA name of a torch device ("NVIDIA H200"), or "cpu"."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def report_prediction(summary: dict[str, Any]) -> None:
    """Log a train run's planned step beside its measured one (the median over its
    steps) and their ratio, and add the ratio to its summary."""
    planned, measured = summary.get("plan_step_time_s"), summary.get("median_step_time_s")
    if not planned or not measured:
        return
    summary["measured_over_predicted"] = measured / planned
    log.info(
        "step time: predicted %.2f s (priced by %s), measured %.2f s (median of %d steps), "
        "measured/predicted %.2f",
        planned,
        summary.get("priced_by"),
        measured,
        summary.get("steps_run", 0),
        measured / planned,
    )
