"""DataSpec/RewardSpec: conf/data and conf/reward equal the presets; a run composes them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rollplex.specs import DATA_PRESETS, REWARD_PRESETS, DataSpec, RewardSpec
from rollplex.specs.run import RunSpec

CONF = Path(__file__).resolve().parents[2] / "conf"
FILE_CONFS = ("jsonl", "parquet")  # need data.path=…, so they have no preset


@pytest.mark.parametrize(
    "group, presets, cls",
    [("data", DATA_PRESETS, DataSpec), ("reward", REWARD_PRESETS, RewardSpec)],
)
def test_conf_files_equal_the_presets(group: str, presets: dict, cls: type) -> None:
    files = {p.stem: p for p in (CONF / group).glob("*.yaml")}
    assert set(files) - set(FILE_CONFS) == set(presets)
    for name, path in files.items():
        raw = yaml.safe_load(path.read_text())
        if name in FILE_CONFS:
            assert raw["path"] == "???" and raw["source"] == name
            continue
        assert cls.model_validate(raw) == presets[name], name


def _run(*overrides: str) -> RunSpec:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return RunSpec.model_validate(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))


def test_a_run_composes_data_and_reward() -> None:
    run = _run()
    assert run.data == DATA_PRESETS["synthetic"] and run.reward == REWARD_PRESETS["exact_match"]
    run = _run("data=jsonl", "data.path=/d/train.jsonl", "reward=math", "data.max_rows=8")
    assert (run.data.source, run.data.path, run.data.max_rows) == ("jsonl", "/d/train.jsonl", 8)
    assert [c.name for c in run.reward.components] == ["math", "format"]
    with pytest.raises(Exception, match="path"):
        _run("data=parquet")  # data.path is mandatory


def test_template_and_paths_are_checked() -> None:
    spec = DataSpec(template="{problem} Put it in \\boxed{}.")
    assert spec.user_turn("2+2?") == "2+2? Put it in \\boxed{}."
    with pytest.raises(ValueError, match="template must contain"):
        DataSpec(template="Answer briefly.")
    with pytest.raises(ValueError, match=r"needs data\.path"):
        DataSpec(source="jsonl")
    with pytest.raises(ValueError, match="not 'synthetic'"):
        DataSpec(path="x.jsonl")
    with pytest.raises(ValueError, match="questions is for the synthetic sources"):
        DataSpec(source="easyvqa", questions=("count",))
    with pytest.raises(ValueError, match="extra"):
        DataSpec(prompt_column="q")
