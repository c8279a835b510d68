"""The command line's overrides, checked before Hydra runs anything.

Every override is parsed and tried against the composed config (each value of a sweep on
its own): an unknown preset or key, or a malformed override, ends the run with one line that
names it and lists the valid names, and nothing is written (Hydra would exit 1 with a usage
paragraph after making a run folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig


class ConfigError(ValueError):
    """A bad command line: the message is the one line the user sees."""


@dataclass(slots=True)
class Checked:
    cfg: DictConfig  # composed with every sweep at its first value, the hydra node included
    multirun: bool


def groups(conf_dir: str) -> dict[str, list[str]]:
    """Each config group (a folder of conf/) and its options (the yaml files in it)."""
    root = Path(conf_dir)
    return {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(root.iterdir())
        if d.is_dir() and any(d.glob("*.yaml"))
    }


def compose_config(conf_dir: str, config_name: str, overrides: list[str]) -> DictConfig:
    """The config Hydra would build for `overrides` (non-sweep), with its hydra node."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        return compose(config_name, overrides=overrides, return_hydra_config=True)


def check_overrides(
    conf_dir: str, config_name: str, job: str, overrides: list[str], multirun: bool
) -> Checked:
    """Parse and try `overrides`; raise ConfigError naming the first bad one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as err:
        raise ConfigError(f"cannot parse the overrides {overrides}: {_one_line(err)}") from None
    options = groups(conf_dir)
    firsts, group_firsts, keys = [], [], []
    for o in parsed:
        key = o.key_or_group
        sweep = o.is_sweep_override()
        if sweep and not multirun:
            raise ConfigError(
                f"'{o.input_line}' lists several values: sweep them with `rollplex {job} -m ...`"
            )
        values = list(o.sweep_string_iterator()) if sweep else [o.get_value_element_as_str()]
        first = o.input_line if not sweep else f"{_prefix(o)}{key}={values[0]}"
        firsts.append(first)
        if key in options and not o.is_delete():
            for value in values:
                if value not in options[key]:
                    raise ConfigError(
                        f"unknown {key} '{value}': the {key} presets are {', '.join(options[key])}"
                    )
            group_firsts.append(first)
        elif not (o.is_add() or o.is_force_add() or key.split(".")[0] == "hydra"):
            keys.append(key)
    # Compose once on the way that works (a compose costs every command ~80 ms warm); only
    # a failure composes the presets alone, to name an unknown key and list its neighbours.
    try:
        cfg = compose_config(conf_dir, config_name, [*firsts, f"job={job}"])
    except HydraException as err:
        failure = err
    else:
        return Checked(cfg, multirun)
    try:
        base = compose_config(conf_dir, config_name, [f"job={job}", *group_firsts])
    except HydraException as err:
        raise ConfigError(_one_line(err)) from None
    for key in keys:
        _check_key(base, key)
    raise ConfigError(f"bad override: {_one_line(failure)}") from None


def _check_key(cfg: DictConfig, key: str) -> None:
    node: Any = cfg
    parts = key.split(".")
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "the config"
        if isinstance(node, DictConfig):
            keys = list(node)  # `in` is False for a '???' value; the key list holds it
            if part not in keys:
                names = ", ".join(str(k) for k in keys if k != "hydra")
                raise ConfigError(f"unknown key '{key}': {where} has {names}")
            node = node._get_node(part)
        else:  # a list, or a leaf value: Hydra's own check applies
            return


def _prefix(o) -> str:
    return "++" if o.is_force_add() else "+" if o.is_add() else ""


def _one_line(err: Exception) -> str:
    lines = [s.strip() for s in str(err).splitlines() if s.strip()]
    return "; ".join(lines)
