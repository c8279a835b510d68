"""The step IR, its builder DSL, lint, serialization and passes.

The IR is imported eagerly; the builder, lint and serialization lazily (PEP 562), because
they depend on the op registry, which itself depends on the IR.
"""

from __future__ import annotations

import importlib
from typing import Any

from rollplex.graph.ir import Graph, GraphError, Op, Phase, Value, ValueKind

_LAZY = {
    "Prompts": "rollplex.graph.builder",
    "StepBuilder": "rollplex.graph.builder",
    "lint": "rollplex.graph.invariants",
    "from_json": "rollplex.graph.serialize",
    "to_json": "rollplex.graph.serialize",
    "stable_hash": "rollplex.graph.serialize",
}

__all__ = ["Graph", "GraphError", "Op", "Phase", "Value", "ValueKind", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rollplex.graph' has no attribute {name!r}")
