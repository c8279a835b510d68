"""CostModel.calibrated: measured kinds take their median ratio; unmeasured kinds with
measured relatives (RELATED_KINDS) take the relatives' pooled ratio; others stay as they
were."""

from __future__ import annotations

import pytest

from rollplex.planner.cost_model import CostModel, write_calibration
from rollplex.specs import HARDWARE_PRESETS

H200 = HARDWARE_PRESETS["h200"]


def _entry(kind: str, predicted: float, measured: float) -> dict:
    op = f"x.{kind}"
    return {"kind": kind, "op": op, "predicted_s": predicted, "measured_s": measured}


def _scale(base: CostModel, calibrated: CostModel, kind: str) -> float:
    before, after = base.eff(kind), calibrated.eff(kind)
    assert after.compute / before.compute == pytest.approx(after.bandwidth / before.bandwidth)
    return after.compute / before.compute


def test_unmeasured_kinds_borrow_their_relatives_pooled_ratio(tmp_path):
    path = tmp_path / "calibration.json"
    entries = [
        _entry("logprob_prefix", 1.0, 2.0),
        _entry("logprob_response", 2.0, 6.0),
        _entry("logprob_response", 2.0, 5.0),
        _entry("decode", 1.0, 3.0),
    ]
    write_calibration(path, "cuda", entries)
    base = CostModel(H200)
    cal = base.calibrated(path)
    # own measurements: the median of predicted / measured
    assert _scale(base, cal, "logprob_response") == pytest.approx((2 / 6 + 2 / 5) / 2)
    assert _scale(base, cal, "decode") == pytest.approx(1 / 3)
    # one pass over prefix + response: the relatives' seconds pooled, 5 predicted / 13
    assert _scale(base, cal, "logprob") == pytest.approx(5 / 13)
    assert _scale(base, cal, "generate") == pytest.approx(1 / 3)
    # no measurement and no measured relative: unchanged
    assert cal.eff("backward") == base.eff("backward")


def test_a_kinds_own_measurements_win_over_its_relatives(tmp_path):
    path = tmp_path / "calibration.json"
    write_calibration(
        path, "cuda", [_entry("logprob", 1.0, 1.25), _entry("logprob_response", 1.0, 4.0)]
    )
    base = CostModel(H200)
    assert _scale(base, base.calibrated(path), "logprob") == pytest.approx(0.8)
