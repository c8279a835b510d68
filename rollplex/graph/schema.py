"""The op schema beside the IR: each kind's ports and shape rule, and the one registry.

Built-in kinds register in `rollplex.graph.kinds`; costs live in `rollplex.ops.costs`, which
depends on this module, never the other way. Ports name dimensions with symbols (`"S"`:
samples, `"B"`: prefix rows ...) that lint binds across an op's ports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollplex.graph.ir import GraphError, Op, ValueKind

FLOAT = "float"  # any floating dtype
INT = "int64"


@dataclass(slots=True, frozen=True)
class Port:
    kinds: frozenset[ValueKind]
    dtype: str | None = None  # FLOAT, a concrete dtype, or None for any
    dims: tuple[str | None, ...] | None = None  # symbols per axis; None: rank unchecked
    optional: bool = False

    def accepts_dtype(self, dtype: str) -> bool:
        if self.dtype is None:
            return True
        if self.dtype == FLOAT:
            return dtype in ("bfloat16", "float16", "float32")
        return dtype == self.dtype


def port(
    *kinds: ValueKind,
    dtype: str | None = None,
    dims: tuple[str | None, ...] | None = None,
    optional: bool = False,
) -> Port:
    return Port(frozenset(kinds), dtype, dims, optional)


CheckFn = Callable[[Op, dict[str, int]], str | None]


@dataclass(slots=True)
class OpKind:
    """Schema and formulas of one op kind."""

    name: str
    doc: str
    inputs: dict[str, Port]
    outputs: dict[str, Port]
    check: CheckFn | None = None  # extra rule over the bound symbols (e.g. S == B * G)
    prefix: bool = False  # response-independent work that may move into the decode window
    variadic_inputs: str | None = None  # ports named "<this>_<i>" share this port's schema
    attrs: dict[str, Any] = field(default_factory=dict)  # attribute defaults

    def input_port(self, name: str) -> Port | None:
        if name in self.inputs:
            return self.inputs[name]
        if self.variadic_inputs and name.startswith(self.variadic_inputs + "_"):
            return self.inputs[self.variadic_inputs]
        return None


_REGISTRY: dict[str, OpKind] = {}


def register(kind: OpKind) -> OpKind:
    if kind.name in _REGISTRY:
        raise ValueError(f"op kind '{kind.name}' registered twice")
    _REGISTRY[kind.name] = kind
    return kind


def get_kind(name: str) -> OpKind:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise GraphError(
            f"op kind '{name}'", f"unknown; known kinds: {sorted(_REGISTRY)}"
        ) from None


def all_kinds() -> dict[str, OpKind]:
    return dict(_REGISTRY)
