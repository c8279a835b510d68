"""Backends that run a plan's ops, behind a lazy registry: a backend's module (and its
heavy imports: transformers, vLLM) loads only when that backend is selected.

    backend_class("torch")   # -> TorchBackend
    backend_class("vllm")    # -> BackendUnavailable, saying why

An entry is either importable (a module path and class name) or a known backend that is
not built yet, with the reason; selecting the latter never falls back to another one.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from rollplex.backends.base import BackendUnavailable


@dataclass(slots=True, frozen=True)
class BackendEntry:
    name: str
    module: str | None  # None: not built
    cls: str | None
    requires: tuple[str, ...] = ()  # distributions that must be importable
    why_missing: str = ""  # why it cannot be selected yet


REGISTRY: dict[str, BackendEntry] = {
    "torch": BackendEntry(
        "torch", "rollplex.backends.torch.backend", "TorchBackend", ("torch", "transformers")
    ),
    "vllm": BackendEntry(
        "vllm",
        None,
        None,
        ("vllm",),
        "the vLLM rollout backend is not implemented yet (the RolloutRole interface it will "
        "implement is in rollplex.backends.base); use backend 'torch'",
    ),
    "fsdp": BackendEntry(
        "fsdp", "rollplex.backends.fsdp.backend", "FsdpBackend", ("torch", "transformers")
    ),
}


def available_backends() -> list[str]:
    """Names that can be selected here (built, with their packages installed)."""
    return [n for n, e in REGISTRY.items() if e.module and not _missing(e)]


def _missing(entry: BackendEntry) -> list[str]:
    return [m for m in entry.requires if importlib.util.find_spec(m) is None]


def backend_class(name: str) -> type:
    """The backend class registered as `name`, imported now. Raises BackendUnavailable
    (unknown, not built, or a required package missing) with the reason."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise BackendUnavailable(f"unknown backend {name!r}; known: {sorted(REGISTRY)}")
    missing = _missing(entry)
    if entry.module is None:
        note = f" (and {', '.join(missing)} is not installed)" if missing else ""
        raise BackendUnavailable(f"backend {name!r} is unavailable: {entry.why_missing}{note}")
    if missing:
        raise BackendUnavailable(
            f"backend {name!r} needs {', '.join(missing)}, which is not installed here"
        )
    return getattr(importlib.import_module(entry.module), entry.cls)


__all__ = ["REGISTRY", "BackendEntry", "BackendUnavailable", "available_backends", "backend_class"]
