"""`rollplex --help` and `rollplex <job> --help`, written from the config itself.

The config groups and their options are the folders and yaml files of conf/; a job's
fields, their values and their meaning come from the composed Hydra config and the pydantic
specs' field descriptions (rollplex/specs). Nothing here is a hand-kept list of fields.
"""

from __future__ import annotations

import textwrap
from typing import Any, get_args

from pydantic import BaseModel

from rollplex.jobs.overrides import ConfigError, groups

JOBS: dict[str, str] = {
    "graph": "build the RL step's graph, run the passes, print FLOPs/bytes per phase",
    "plan": "plan the step (streams, memory slots) and compare it with the baselines",
    "train": "run RL training end to end (default: the tiny CPU demo on easy-VQA)",
    "eval": "score a model folder or a train checkpoint on a data split",
    "weights": "report which rollout weight bytes live in the training layout",
}

# The RunSpec sections each job reads (the others are accepted and ignored).
SECTIONS: dict[str, tuple[str, ...]] = {
    "graph": ("model", "algo", "workload"),
    "plan": ("model", "algo", "workload", "schedule", "hardware", "backend", "calibration"),
    "train": (
        "model",
        "algo",
        "workload",
        "schedule",
        "hardware",
        "data",
        "reward",
        "backend",
        "train",
        "seed",
    ),
    "eval": ("model", "algo", "workload", "data", "reward", "backend", "eval", "seed"),
    "weights": ("model", "weights"),
}

# Each one runs as written (tests/jobs/test_readme_commands.py runs them).
EXAMPLES = (
    "rollplex graph model=qwen2_5_vl_7b algo=grpo workload.group_size=8",
    "rollplex plan model=qwen2_5_vl_32b hardware=h800x32",
    "rollplex plan -m schedule=serial,disaggregated,rollplex hardware=h200x8",
    "rollplex train train.steps=200",
    "rollplex eval model=hub model.path=outputs/train/<run>/checkpoints/step-000200",
    "rollplex weights model=qwen2_5_vl_32b weights.train_fsdp=8 weights.rollout_tp=4",
)


def general_help(conf_dir: str) -> str:
    lines = ["usage: rollplex <job> [group=option ...] [key=value ...] [-m]", "", "jobs:"]
    lines += [f"  {name:<8} {what}" for name, what in JOBS.items()]
    lines += ["", "config groups (conf/; choose one option with group=option):"]
    lines += _group_lines(groups(conf_dir), None)
    lines += ["", "examples:"] + [f"  {e}" for e in EXAMPLES]
    lines += [
        "",
        "rollplex <job> --help [section ...]: the job's fields, their values and meaning.",
        "-m sweeps comma-separated values (a Hydra multirun).",
    ]
    return "\n".join(lines)


def job_help(conf_dir: str, job: str, cfg: Any, only: list[str]) -> str:
    """The job's groups (the chosen option first) and every field it reads, with its value in
    `cfg` (the composed config) and its description."""
    from rollplex.specs.run import RunSpec

    lines = [f"usage: rollplex {job} [group=option ...] [key=value ...] [-m]", f"  {JOBS[job]}"]
    choices = cfg.hydra.runtime.choices
    lines += ["", "config groups (chosen option in brackets):"]
    lines += _group_lines(groups(conf_dir), choices)
    unknown = [s for s in only if s not in SECTIONS[job]]
    if unknown:
        raise ConfigError(
            f"unknown section '{unknown[0]}' for `rollplex {job} --help`: "
            f"{job} reads {', '.join(SECTIONS[job])}"
        )
    sections = [s for s in SECTIONS[job] if not only or s in only]
    lines += ["", "fields (key = value: description):"]
    for name in sections:
        info = RunSpec.model_fields[name]
        _field_lines(lines, name, info, cfg.get(name))
    return "\n".join(lines)


def _group_lines(options: dict[str, list[str]], choices: Any) -> list[str]:
    out = []
    for group, names in options.items():
        chosen = choices.get(group) if choices is not None else None
        shown = [f"[{n}]" if n == chosen else n for n in names]
        out.append(f"  {group:<10} {', '.join(shown)}")
    return out


def _field_lines(lines: list[str], key: str, info: Any, value: Any) -> None:
    spec = _spec_type(info.annotation)
    if spec is not None and value is not None and hasattr(value, "keys"):
        for name, sub in spec.model_fields.items():
            _field_lines(lines, f"{key}.{name}", sub, value.get(name))
        return
    shown = _show(value)
    head = f"  {key} = {shown}"
    text = (info.description or "").strip()
    lines.append(head)
    if text:
        lines += textwrap.wrap(
            text,
            96,
            initial_indent="      ",
            subsequent_indent="      ",
            break_on_hyphens=False,
            break_long_words=False,
        )


def _spec_type(annotation: Any) -> type[BaseModel] | None:
    for t in (annotation, *get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def _show(value: Any) -> str:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return "null" if value is None else str(value)
