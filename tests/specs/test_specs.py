"""Specs: presets agree with conf/, bad fields are rejected by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ModelSpec,
    ResponseLengthSpec,
    ScheduleSpec,
    WorkloadSpec,
)

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize(
    "group, presets, cls",
    [
        ("model", MODEL_PRESETS, ModelSpec),
        ("workload", WORKLOAD_PRESETS, WorkloadSpec),
        ("hardware", HARDWARE_PRESETS, type(HARDWARE_PRESETS["h200"])),
    ],
)
def test_conf_files_equal_the_presets(group: str, presets: dict, cls: type) -> None:
    # model/hub.yaml is not a preset: it reads the architecture from a folder
    files = {p.stem: p for p in (CONF / group).glob("*.yaml") if p.stem != "hub"}
    assert set(files) == set(presets)
    for name, path in files.items():
        assert cls.model_validate(yaml.safe_load(path.read_text())) == presets[name], name


def test_bad_fields_are_named() -> None:
    with pytest.raises(ValidationError, match="group_size"):
        WorkloadSpec(prompts_per_step=4, group_size=0)
    with pytest.raises(ValidationError, match="mrope_section"):
        MODEL_PRESETS["tiny"].model_validate(
            {**MODEL_PRESETS["tiny"].model_dump(), "mrope_section": (4, 4, 4)}
        )
    with pytest.raises(ValidationError, match="kl_coef"):
        AlgoSpec(use_reference=False, kl_coef=0.1)
    with pytest.raises(ValidationError, match="extra"):
        AlgoSpec(learning_rate=1.0)


def test_video_preset_matches_the_measured_prefix() -> None:
    w, v = WORKLOAD_PRESETS["video"], MODEL_PRESETS["qwen2_5_vl_7b"].vision
    assert w.visual_tokens(v) == 2048 and w.prefix_tokens(v) == 2304  # FACTS.md's setup
    assert w.patches(v) == 8192


@pytest.mark.parametrize("dist", ["fixed", "uniform", "lognormal"])
def test_response_lengths_are_consistent(dist: str) -> None:
    r = ResponseLengthSpec(distribution=dist, mean=100, min=1, max=400)
    assert r.survival(0) == pytest.approx(1.0, abs=1e-6)
    assert r.survival(400) == 0.0
    assert r.expected_active(8, 10) >= r.expected_active(8, 150)
    assert r.expected_max(64) >= r.expected_max(2)
    # The mean is the area under the survival curve (before the cap bites).
    area = sum(r.survival(t) for t in range(400))
    assert area == pytest.approx(100, rel=0.12)


@pytest.mark.parametrize(
    "group, cls",
    [
        ("schedule", ScheduleSpec),
        ("algo", AlgoSpec),
        ("workload", WorkloadSpec),
        ("hardware", type(HARDWARE_PRESETS["h200"])),
    ],
)
def test_every_spec_field_can_be_set_from_the_command_line(group: str, cls: type) -> None:
    # Hydra refuses `group.key=` for a key its yaml lacks: a field missing here is a
    # setting no user can reach (schedule.train_micro_fused was)
    for path in (CONF / group).glob("*.yaml"):
        missing = set(cls.model_fields) - _keys(path)
        assert not missing, f"{path.name} lacks {sorted(missing)}"


def _keys(path: Path) -> set[str]:
    """The keys a group option gives Hydra: its own, and those of the options of its group
    that its defaults list takes in (algo/reinforce_plus_plus_baseline.yaml takes grpo's)."""
    doc = yaml.safe_load(path.read_text())
    keys = set(doc) - {"defaults"}
    for entry in doc.get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            keys |= _keys(path.with_name(f"{entry}.yaml"))
    return keys
