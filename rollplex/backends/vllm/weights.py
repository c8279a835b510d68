"""New weights into a running vLLM engine, in place, under the checkpoint's tensor names.

Live parameters stream from memory under their Hub names, whatever the trainer's module
tree. `collective_rpc("reload_weights", ...)` is the path that works on CPU too (FACTS.md);
after it the prefix, multimodal-processor and encoder caches are all reset, or the next
image prompt reads stale features.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from rollplex.backends.base import BackendError, CheckpointWeights, LiveWeights, WeightsSource
from rollplex.models.files import to_hub_name

NamedTensors = Iterator[tuple[str, torch.Tensor]]


def _module_tensors(module: torch.nn.Module) -> NamedTensors:
    tied = bool(getattr(getattr(module, "config", None), "tie_word_embeddings", False))
    for name, t in module.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # vLLM ties it itself, as a checkpoint leaves it out
        yield to_hub_name(name), t.detach()


def live_tensors(params: Any) -> NamedTensors:
    """Hub-named tensors of the trainer's parameters: a handle with `.module` (the torch
    backend's WeightsHandle), an nn.Module, or a name -> tensor mapping."""
    module = getattr(params, "module", params)
    if isinstance(module, torch.nn.Module):
        return _module_tensors(module)
    if isinstance(module, Mapping):
        return ((to_hub_name(k), v.detach()) for k, v in module.items())
    raise BackendError(
        f"LiveWeights.params is {type(params).__name__}: expected an nn.Module, a handle "
        "with .module, or a mapping of tensor names to tensors"
    )


def checkpoint_tensors(folder: Path) -> NamedTensors:
    """The tensors of a folder's safetensors files, one at a time (names as stored)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise BackendError(f"{folder}: no *.safetensors file to load weights from")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield k, f.get_tensor(k)


def tensors_of(source: WeightsSource) -> NamedTensors:
    if isinstance(source, LiveWeights):
        return live_tensors(source.params)
    if isinstance(source, CheckpointWeights):
        return checkpoint_tensors(source.folder)
    raise BackendError(f"unknown weights source {source!r}")


def reset_caches(llm: Any) -> None:
    """Drop every cache entry computed with the previous weights."""
    llm.reset_prefix_cache()
    llm.reset_mm_cache()
    llm.llm_engine.reset_encoder_cache()


def reload_in_place(llm: Any, tensors: NamedTensors, reset: bool = True) -> None:
    """Load `tensors` into the running engine's model, then reset its caches (`reset=False`
    exists only for the test that shows stale caches survive without it)."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
    if reset:
        reset_caches(llm)
