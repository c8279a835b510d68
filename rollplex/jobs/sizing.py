"""A train job sized from what the user gave, before any model loads.

On a GPU the hardware comes from the device (`read_device`; a `hardware=` that does not
describe it is refused) and conf/train_gpu.yaml fills what the command line left unset.
`train.response_lengths=model` plans responses `train.max_new_tokens` long. Which keys the
user set is read from Hydra's overrides; a spec built in Python is taken as given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollplex.jobs.run_folder import is_rank0
from rollplex.specs.hardware import (
    DeviceInfo,
    HardwareSpec,
    device_disagreement,
    hardware_for_device,
)
from rollplex.specs.run import RunSpec
from rollplex.specs.workload import ResponseLengthSpec

log = logging.getLogger(__name__)
GPU_DEFAULTS_FILE = "train_gpu.yaml"
RESPONSE_KEY = "workload.response_length"


@dataclass(slots=True)
class Sized:
    spec: RunSpec
    notes: list[str] = field(default_factory=list)  # one line per decision, for the log


def command_line_keys() -> frozenset[str] | None:
    """The dotted keys of this Hydra run's command-line overrides (`hardware=h200` gives
    'hardware'); None outside a Hydra run."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        overrides = HydraConfig.get().overrides.task
    except (ImportError, ValueError):
        return None
    return frozenset(o.split("=", 1)[0].lstrip("+~") for o in overrides)


def is_set(key: str, keys: frozenset[str]) -> bool:
    """Whether the command line set `key`, itself or through a parent (`workload=tiny`)."""
    return any(o == key or key.startswith(o + ".") for o in keys)


def read_device(device: str) -> DeviceInfo | None:
    """The CUDA device `device` names (None for a CPU device); the caller checked that this
    torch can run on it (jobs/validate_run.py run_facts)."""
    if not device.startswith("cuda"):
        return None
    import torch

    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(props.name, int(props.total_memory), torch.cuda.device_count())


def gpu_defaults(conf_dir: Path | None = None) -> dict[str, Any]:
    """conf/train_gpu.yaml as flat dotted keys."""
    from omegaconf import OmegaConf

    if conf_dir is None:
        from rollplex.jobs.conf import conf_dir as find_conf_dir

        conf_dir = Path(find_conf_dir())
    raw = OmegaConf.to_container(OmegaConf.load(conf_dir / GPU_DEFAULTS_FILE), resolve=True)
    return dict(_flatten(raw))


def _flatten(tree: Any, prefix: str = ""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], tree


def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for p in parents:
        tree = tree[p]
    tree[leaf] = value


def size_train(
    spec: RunSpec,
    keys: frozenset[str] | None,
    device: DeviceInfo | None,
    defaults: dict[str, Any] | None = None,
) -> Sized:
    """`spec` sized for `device` (None: a CPU run) given the command line's `keys` (None:
    a spec built in Python). ValueError naming the field when the spec contradicts it."""
    raw = spec.model_dump()
    notes: list[str] = []
    if device is not None:
        if keys is not None:
            _gpu_defaults(raw, keys, gpu_defaults() if defaults is None else defaults, notes)
        _hardware(raw, spec.hardware, keys, device, notes)
    _response_cap(raw, keys, notes)
    _cosine_span(raw, spec, notes)
    return Sized(RunSpec.model_validate(raw), notes)


def _cosine_span(raw: dict[str, Any], spec: RunSpec, notes: list[str]) -> None:
    """algo.lr_schedule=cosine spans the run's updates unless algo.lr_total_updates says."""
    from rollplex.algos.updates import mini_batches

    algo = spec.algo
    if algo.lr_schedule != "cosine" or algo.lr_total_updates is not None:
        return
    try:
        per_step = len(mini_batches(spec.workload.prompts_per_step, algo))
    except ValueError:
        return  # validate_run names the mini-batch that does not fit
    raw["algo"]["lr_total_updates"] = spec.train.steps * per_step
    notes.append(
        f"algo.lr_total_updates={spec.train.steps * per_step} (train.steps x {per_step} "
        "updates a step): the cosine's span"
    )


def _gpu_defaults(
    raw: dict[str, Any], keys: frozenset[str], defaults: dict[str, Any], notes: list[str]
) -> None:
    applied = [k for k in defaults if not is_set(k, keys)]
    for k in applied:
        _set(raw, k, defaults[k])
    if applied:
        shown = ", ".join(f"{k}={defaults[k]}" for k in applied)
        notes.append(f"GPU defaults ({GPU_DEFAULTS_FILE}): {shown}")


def _hardware(
    raw: dict[str, Any],
    given: HardwareSpec,
    keys: frozenset[str] | None,
    device: DeviceInfo,
    notes: list[str],
) -> None:
    """The device's spec where the user named none (with any `hardware.<field>=` they gave
    on top); either way refused by name if it does not describe the device."""
    explicit = is_set("hardware", keys) if keys is not None else given.name != "cpu"
    hw = given
    if not explicit:
        hw, how = hardware_for_device(device)
        fields = sorted({o.split(".")[1] for o in keys or () if o.startswith("hardware.")})
        hw = HardwareSpec.model_validate(hw.model_dump() | {f: getattr(given, f) for f in fields})
        notes.append(how + "".join(f", {f}={getattr(hw, f)}" for f in fields))
        raw["hardware"] = hw.model_dump()
    why = device_disagreement(hw, device)
    if why is not None:
        raise ValueError(
            f"hardware={hw.name} does not match the device: {why}; leave hardware unset "
            "to read it from the device"
        )


def _response_cap(raw: dict[str, Any], keys: frozenset[str] | None, notes: list[str]) -> None:
    """Responses end at eos or max_new_tokens: the plan's are fixed at the cap (a step waits
    for its longest), unless the command line set `workload.response_length.*` (a workload
    preset such as `workload=video` does not count: it did not choose the cap)."""
    train = raw["train"]
    explicit = keys is None or any(o.split(".")[:2] == RESPONSE_KEY.split(".") for o in keys)
    if train["response_lengths"] != "model" or explicit:
        return
    cap = train["max_new_tokens"]
    fixed = ResponseLengthSpec(distribution="fixed", mean=cap, min=1, max=cap).model_dump()
    if raw["workload"]["response_length"] != fixed:
        raw["workload"]["response_length"] = fixed
        notes.append(f"{RESPONSE_KEY}: fixed at train.max_new_tokens={cap}")


def record_sizing(given: RunSpec, sized: RunSpec, notes: tuple[str, ...], out: Path) -> None:
    """Log each sizing decision and rewrite the run folder's config.json with the spec the
    job runs (rank 0 only under torchrun)."""
    for note in notes:
        log.info("sized: %s", note)
    if is_rank0() and sized != given and (out / "config.json").is_file():
        (out / "config.json").write_text(sized.model_dump_json(indent=1))
