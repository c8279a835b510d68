"""Which constants price a plan (jobs/pricing.py): the H200 presets' shipped constants, the
bare cost model elsewhere, a file whose provenance is checked (a warning naming the device
or model it came from, a refusal with calibration.strict=true, unknown op kinds refused by
name), and `calibration=auto` picking the latest matching run's file."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rollplex.cli import _conf_dir
from rollplex.jobs.pipeline import plan_step
from rollplex.jobs.pricing import (
    UNCALIBRATED,
    pricing_for,
    provenance,
    resolve_auto,
)
from rollplex.ops.calibration import load_calibration
from rollplex.planner.cost_model import CostModel, write_calibration
from rollplex.planner.shipped_calibration import H200
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS
from rollplex.specs.calibration import CalibrationError
from rollplex.specs.run import RunSpec

ROOT = Path(__file__).resolve().parents[2]
OLD_7B = ROOT / "bench/results/calibration_h200_qwen2_5_vl_7b.json"  # no provenance
PRICING_LOG = "rollplex.jobs.pricing"
PICKED = ("model=", "hardware=", "calibration=", "calibration.path=", "calibration.strict=")


@functools.cache
def _composed(overrides: tuple[str, ...]) -> RunSpec:
    with initialize_config_dir(config_dir=_conf_dir(), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, "job=plan"])
    raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    raw.pop("hydra", None)
    return RunSpec.model_validate(raw)


def spec_of(*overrides: str) -> RunSpec:
    """The spec `rollplex plan <overrides>` validates; model=, hardware= and calibration=
    are set on one composed spec (composing costs ~1 s)."""
    picks = dict(o.split("=", 1) for o in overrides if o.startswith(PICKED))
    spec = _composed(tuple(o for o in overrides if not o.startswith(PICKED)))
    raw = spec.model_dump()
    if "model" in picks:
        raw["model"] = MODEL_PRESETS[picks["model"]].model_dump()
    if "hardware" in picks:
        raw["hardware"] = HARDWARE_PRESETS[picks["hardware"]].model_dump()
    for key in ("calibration", "calibration.path", "calibration.strict"):
        if key in picks:
            field = key.split(".")[1] if "." in key else "path"
            value = picks[key] == "true" if field == "strict" else picks[key]
            raw["calibration"] = dict(raw["calibration"]) | {field: value}
    return RunSpec.model_validate(raw)


def step_s(spec: RunSpec) -> float:
    return plan_step(
        spec.model, spec.workload, spec.algo, spec.hardware, spec.schedule,
        cost_model=pricing_for(spec).cost_model, enforce_budget=False,
    ).plan.step_time_s  # fmt: skip


def calibration_file(path: Path, spec: RunSpec, device: str, kinds=("decode", "backward")):
    entries = [{"kind": k, "op": k, "predicted_s": 1.0, "measured_s": 2.0} for k in kinds]
    write_calibration(path, device, entries, provenance(spec))
    return path


@pytest.mark.parametrize("model", ["qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen2_5_vl_32b"])
@pytest.mark.parametrize("hardware", ["h200", "h200x2", "h200x8", "h100", "h800x32", "cpu"])
def test_h200_presets_ship_measured_constants_and_others_are_uncalibrated(model, hardware):
    spec = spec_of(f"model={model}", f"hardware={hardware}", "workload.prompts_per_step=8")
    source = pricing_for(spec).source
    # one set, fit pooled over both measured shapes (shipped_calibration.py)
    shipped = "shipped h200 defaults (measured on qwen2_5_vl_3b and qwen2_5_vl_7b)"
    if hardware.startswith("h200"):
        assert source == shipped
    elif hardware == "h100":  # the same constants, checked against H100 runs
        assert source == shipped + ", applied to the H100 (checked on 3B H100 runs)"
    else:
        assert source == UNCALIBRATED
    bare = spec_of(f"model={model}", f"hardware={hardware}", "workload.prompts_per_step=8",
                   "calibration=none")  # fmt: skip
    assert pricing_for(bare).source == UNCALIBRATED


@pytest.mark.parametrize("model", ["qwen2_5_vl_3b", "qwen2_5_vl_7b"])
def test_the_shipped_constants_are_applied_on_h200_and_h100_only(model):
    """On H200 (and H100) each shipped kind's efficiency is the cost model's times its scale,
    with its fixed seconds and the per-op dispatch; other GPUs get the bare model. A step of those
    kinds (all measured slower than their roofline) is priced longer."""
    over = (f"model={model}", "hardware=h200", "workload.prompts_per_step=4")
    spec = spec_of(*over)
    priced, base = pricing_for(spec).cost_model, CostModel(spec.hardware)
    for kind, k in H200.scales.items():
        assert 0 < k < 1
        assert priced.eff(kind).compute == pytest.approx(base.eff(kind).compute * k)
        assert priced.eff(kind).bandwidth == pytest.approx(base.eff(kind).bandwidth * k)
    assert priced.fixed_s == H200.fixed_s and priced.dispatch_s == H200.dispatch_s > 0
    h100 = spec_of(f"model={model}", "hardware=h100", "workload.prompts_per_step=4")
    on_h100, h100_base = pricing_for(h100).cost_model, CostModel(h100.hardware)
    for kind, k in H200.scales.items():  # the H100's own roofline, scaled alike
        assert on_h100.eff(kind).bandwidth == pytest.approx(h100_base.eff(kind).bandwidth * k)
    assert on_h100.fixed_s == H200.fixed_s and on_h100.dispatch_s == H200.dispatch_s
    other = pricing_for(spec_of(f"model={model}", "hardware=h800x32")).cost_model
    assert other.fixed_s == {} and other.dispatch_s == 0
    assert other.efficiency == CostModel(other.hardware).efficiency
    # with room for everything: offload copies, which no constant prices, stay out of it
    assert step_s(_roomy(spec)) > step_s(_roomy(spec_of(*over, "calibration=none")))


def _roomy(spec: RunSpec) -> RunSpec:
    return spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"hbm_gib": 1e3})})


def test_a_file_of_the_same_gpu_and_model_applies_silently(tmp_path, caplog):
    spec = spec_of("model=qwen2_5_vl_3b", "hardware=h200")
    path = calibration_file(tmp_path / "c.json", spec, "NVIDIA H200")
    tuned = spec_of("model=qwen2_5_vl_3b", "hardware=h200", f"calibration={path}")
    with caplog.at_level(logging.INFO, logger=PRICING_LOG):
        assert pricing_for(tuned).source == str(path)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"plan priced by: {path}" in caplog.text


@pytest.mark.parametrize(
    ("made_on", "device", "planned", "named"),
    [
        (("model=qwen2_5_vl_7b", "hardware=h200"), "NVIDIA H200", ("model=qwen2_5_vl_32b",
         "hardware=h800x32"), ["'NVIDIA H200'", "'NVIDIA H800'", "qwen2_5_vl_7b",
         "qwen2_5_vl_32b"]),
        (("model=qwen2_5_vl_7b", "hardware=h200"), "NVIDIA H200", ("model=qwen2_5_vl_3b",
         "hardware=h200"), ["qwen2_5_vl_7b", "qwen2_5_vl_3b"]),
        (("model=qwen2_5_vl_3b", "hardware=h200"), "NVIDIA H100 80GB HBM3",
         ("model=qwen2_5_vl_3b", "hardware=h200"), ["'NVIDIA H100 80GB HBM3'", "'NVIDIA H200'"]),
        (None, None, ("model=qwen2_5_vl_7b", "hardware=h200"), ["records no model shape"]),
    ],
)  # fmt: skip
def test_a_file_from_elsewhere_warns_by_name_and_strict_refuses(
    tmp_path, caplog, made_on, device, planned, named
):
    path = OLD_7B if made_on is None else calibration_file(
        tmp_path / "c.json", spec_of(*made_on), device
    )  # fmt: skip
    spec = spec_of(*planned, f"calibration={path}")
    with caplog.at_level(logging.WARNING, logger=PRICING_LOG):
        assert pricing_for(spec).path == str(path)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(path) in warning and all(n in warning for n in named), warning
    strict = spec_of(*planned, f"calibration.path={path}", "calibration.strict=true")
    with pytest.raises(CalibrationError, match=r"calibration\.strict=true") as err:
        pricing_for(strict)
    assert str(path) in str(err.value) and all(n in str(err.value) for n in named)


def test_an_unknown_op_kind_is_refused_by_name(tmp_path):
    spec = spec_of("model=qwen2_5_vl_3b")
    path = calibration_file(tmp_path / "c.json", spec, "NVIDIA H200", ("decode", "decoder"))
    with pytest.raises(CalibrationError, match=r"entries\[1\]\.kind: unknown op kind 'decoder'"):
        load_calibration(path)
    with pytest.raises(CalibrationError, match="'decoder'"):
        pricing_for(spec_of("model=qwen2_5_vl_3b", f"calibration={path}"))


def test_auto_takes_the_newest_file_of_the_same_gpu_and_model(tmp_path, caplog):
    spec3 = spec_of("model=qwen2_5_vl_3b", "hardware=h200")
    spec7 = spec_of("model=qwen2_5_vl_7b", "hardware=h200")
    runs = tmp_path / "outputs" / "train"
    made = {}
    # oldest to newest: a match, a newer match, another model, another GPU, the run itself
    for i, (name, spec, device) in enumerate([
        ("old", spec3, "NVIDIA H200"),
        ("new", spec3, "NVIDIA H200"),
        ("other_model", spec7, "NVIDIA H200"),
        ("other_gpu", spec3, "NVIDIA H100 80GB HBM3"),
        ("this_run", spec3, "NVIDIA H200"),
    ]):  # fmt: skip
        (runs / name).mkdir(parents=True)
        made[name] = calibration_file(runs / name / "calibration.json", spec, device)
        os.utime(made[name], (1000 + i, 1000 + i))
    (runs / "broken").mkdir()
    (runs / "broken" / "calibration.json").write_text("{not json")
    auto = spec_of("model=qwen2_5_vl_3b", "hardware=h200", "calibration=auto")
    chosen = resolve_auto(auto, runs / "this_run").calibration.path
    assert chosen == str(made["new"])
    # a plan job's run folder (outputs/plan/<time>) finds the train runs' files as well
    assert resolve_auto(auto, tmp_path / "outputs" / "plan" / "t").calibration.path == str(
        made["this_run"]
    )
    # no match: the default (the shipped constants on an H200)
    auto32 = spec_of("model=qwen2_5_vl_32b", "hardware=h200", "calibration=auto")
    with caplog.at_level(logging.INFO, logger=PRICING_LOG):
        none = resolve_auto(auto32, runs / "this_run")
    assert none.calibration.path is None and "no matching calibration.json" in caplog.text
    assert pricing_for(none).source.startswith("shipped h200 defaults")


@pytest.mark.parametrize("strict", [False, True])
def test_the_cli_refuses_an_unknown_kind_or_a_strict_mismatch_in_one_line(
    tmp_path, monkeypatch, capsys, strict
):
    import sys

    from rollplex.cli import main

    spec = spec_of("model=qwen2_5_vl_7b", "hardware=h200")
    kinds = ("decode",) if strict else ("decode", "prefil")
    path = calibration_file(tmp_path / "c.json", spec, "NVIDIA H100 80GB HBM3", kinds)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    over = [f"calibration.path={path}", "calibration.strict=true"] if strict else [
        f"calibration={path}"
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "workload.prompts_per_step=8", *over, f"hydra.run.dir={tmp_path / 'r'}"])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"calibration file '{path}'" in line
    assert ("'NVIDIA H100 80GB HBM3'" if strict else "unknown op kind 'prefil'") in line


def test_an_unresolved_auto_is_refused_not_read_as_a_file():
    with pytest.raises(CalibrationError, match="resolve_auto"):
        pricing_for(spec_of("model=qwen2_5_vl_3b", "calibration=auto"))
