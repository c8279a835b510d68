"""check_overrides (jobs/overrides.py): a good command line composes once into the config
Hydra will run; a bad one ends in one ConfigError naming the override at fault."""

from __future__ import annotations

import pytest

from rollplex.cli import _conf_dir
from rollplex.jobs import overrides
from rollplex.jobs.overrides import ConfigError, check_overrides


def check(*args: str, multirun: bool = False) -> overrides.Checked:
    return check_overrides(_conf_dir(), "train", "train", list(args), multirun)


def test_a_good_line_composes_once_into_the_config_hydra_runs(monkeypatch):
    calls = []
    compose = overrides.compose_config
    monkeypatch.setattr(overrides, "compose_config", lambda *a: calls.append(a[2]) or compose(*a))
    checked = check("train.steps=7", "algo=rloo", "+extra.note=hi")
    assert len(calls) == 1
    cfg = checked.cfg
    assert cfg.train.steps == 7 and cfg.algo.name == "rloo" and cfg.extra.note == "hi"
    assert cfg.hydra.job.name is not None  # the hydra node, for the run folder


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train.stepz=3"], r"unknown key 'train.stepz': train has .*steps"),
        (["nonsense.key=1"], r"unknown key 'nonsense.key': the config has .*train"),
        (["algo=grpoo"], r"unknown algo 'grpoo': the algo presets are .*grpo"),
        (["train.steps=[1"], r"cannot parse the overrides"),
        (["train.steps=1,2"], r"lists several values: sweep them with `rollplex train -m"),
    ],
)
def test_a_bad_override_is_named_in_one_line(args, message):
    with pytest.raises(ConfigError, match=message) as err:
        check(*args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("+train.steps=3", "An item is already at 'train.steps'"),
        ("~train.steps=999", "The value of 'train.steps' is"),
    ],
)
def test_an_override_of_a_known_key_that_hydra_refuses_is_named(arg, message):
    # the key exists, so only the full compose fails: Hydra's reason, on one line
    with pytest.raises(ConfigError, match=r"^bad override: ") as err:
        check(arg)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_sweep_checks_its_first_value_and_every_preset_it_names():
    assert check("train.steps=3,5", multirun=True).cfg.train.steps == 3
    with pytest.raises(ConfigError, match=r"unknown algo 'nope'"):
        check("algo=grpo,nope", multirun=True)
