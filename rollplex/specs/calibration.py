"""The calibration file (`rollplex-calibration/1`): measured op times that rescale the
cost model, and where they were measured (device, model shape, software). Validated here,
before the cost model reads it, so a bad file (or an unknown op kind in it) ends the run
with one line naming the file and the field. CalibrationSpec is the run's choice of one."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from pydantic import Field, model_validator

from rollplex.specs.base import Spec
from rollplex.specs.model import ModelSpec

FORMAT = "rollplex-calibration/1"
# One op on one GPU: a microsecond is below any kernel launch, a day is a typo.
MIN_S, MAX_S = 1e-6, 86_400.0
# predicted/measured per kind: outside this the file describes another machine or a bug.
MAX_SCALE = 1e4


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and the field."""


class CalibrationEntry(Spec):
    """One measured op step that ran alone."""

    kind: str = Field(..., min_length=1, description="Op kind whose efficiency it rescales.")
    op: str = Field("", description="The op or step measured (for people).")
    predicted_s: float = Field(
        ..., ge=0, le=MAX_S, description="The cost model's solo time (0: entry ignored)."
    )
    measured_s: float = Field(..., ge=MIN_S, le=MAX_S, description="Measured solo time.")
    flops: float = Field(0.0, ge=0, description="FLOPs the cost model assigns the op.")
    bytes: float = Field(0.0, ge=0, description="HBM bytes the cost model assigns the op.")


class PricedWith(Spec):
    """planner/shipped_calibration.CostConstants, as a file records them."""

    scales: dict[str, float] = Field(
        default_factory=dict, description="kind -> efficiency scale over the bare model."
    )
    fixed_s: dict[str, float] = Field(
        default_factory=dict, description="kind -> fixed seconds per run."
    )
    dispatch_s: float = Field(0.0, ge=0, description="Host seconds per op.")

    @model_validator(mode="after")
    def _positive(self) -> PricedWith:
        for name, values in (("scales", self.scales), ("fixed_s", self.fixed_s)):
            for kind, v in values.items():
                if not (v > 0 if name == "scales" else v >= 0) or v > MAX_S:
                    raise ValueError(f"{name}['{kind}'] = {v} is out of range")
        return self


class CalibrationFile(Spec):
    format: Literal["rollplex-calibration/1"] = Field(..., description="File format tag.")
    device: str = Field(
        ..., description="Device the times were measured on (its CUDA name, e.g. NVIDIA H200)."
    )
    entries: tuple[CalibrationEntry, ...] = Field(..., description="Measured op steps.")
    # provenance (files written before it have none: they are applied with a warning)
    hardware: str | None = Field(None, description="Hardware spec the run was planned for.")
    model: str | None = Field(None, description="Model name (a preset, or hub).")
    model_shape: dict[str, Any] | None = Field(
        None, description="The model's shape: every ModelSpec field but name and path."
    )
    software: dict[str, str | None] | None = Field(
        None, description="torch, triton and transformers versions of the run."
    )
    priced_with: PricedWith | None = Field(
        None,
        description="The constants over the bare cost model that priced `predicted_s` (the "
        "H200's shipped ones, or a calibration's): a calibration from this file rescales "
        "that model. None (files before it): the bare model priced them.",
    )

    @model_validator(mode="after")
    def _scales_are_sane(self) -> CalibrationFile:
        for kind, k in out_of_range(self.scales()).items():
            raise ValueError(
                f"kind '{kind}': predicted/measured is {k:.3g}, outside "
                f"[{1 / MAX_SCALE:g}, {MAX_SCALE:g}]"
            )
        return self

    def scales(self) -> dict[str, float]:
        """kind -> median predicted/measured over its entries (<1: slower than predicted)."""
        dispatch = self.priced_with.dispatch_s if self.priced_with else 0.0
        return kind_scales(((e.kind, e.predicted_s, e.measured_s) for e in self.entries), dispatch)


def in_op_rows(
    entries: Iterable[tuple[str, float, float]], dispatch_s: float
) -> Iterator[tuple[str, float, float]]:
    """(kind, predicted_s, measured_s) entries as an op's measured window sees them: each
    prediction less the host's dispatch gap before the op, which the window leaves out
    (without it, an aliased weight sync timed at a microsecond read 1e4 times "faster"
    than a prediction that was all gap); entries that predicted or measured nothing
    dropped."""
    for kind, predicted_s, measured_s in entries:
        predicted = predicted_s - dispatch_s
        if predicted > 0 and measured_s > 0:  # dispatch_s >= 0: predicted_s > 0 too
            yield kind, predicted, measured_s


def kind_scales(entries: Iterable[tuple[str, float, float]], dispatch_s: float) -> dict[str, float]:
    """kind -> median predicted/measured over `in_op_rows(entries, dispatch_s)`."""
    ratios: dict[str, list[float]] = {}
    for kind, predicted, measured in in_op_rows(entries, dispatch_s):
        ratios.setdefault(kind, []).append(predicted / measured)
    return {kind: statistics.median(rs) for kind, rs in ratios.items()}


def out_of_range(scales: dict[str, float]) -> dict[str, float]:
    """The kinds whose scale says the file describes another machine or a bug."""
    return {kind: k for kind, k in scales.items() if not 1 / MAX_SCALE <= k <= MAX_SCALE}


def model_shape(model: ModelSpec) -> dict[str, Any]:
    """What of a model spec its op times depend on: every field but its name and folder."""
    return model.model_dump(mode="json", exclude={"name", "path"})


class CalibrationSpec(Spec):
    """Which measured op times price the plan (`calibration=<file>` sets `path` alone)."""

    path: str | None = Field(
        None,
        description="None: the hardware's shipped constants where it has some (H200), else "
        "none; 'auto': the latest calibration.json of the same model and GPU among the "
        "earlier runs beside this one (outputs/); 'none': the bare cost model; else a "
        "rollplex-calibration/1 file (e.g. a train run's calibration.json).",
    )
    strict: bool = Field(
        False,
        description="Refuse a file measured on another GPU or model, or recording neither "
        "(default: apply it with a warning naming both).",
    )

    @model_validator(mode="before")
    @classmethod
    def _a_bare_path(cls, data: Any) -> Any:
        return {"path": data} if data is None or isinstance(data, str) else data
