"""The step IR, its op schema, builder DSL, lint, serialization and passes.

Imports run one way: `ir` (values, ops, graph) <- `schema` (ports, op kinds, registry) <-
`kinds` (the built-in kinds, registered here on import) <- `invariants`, `builder`,
`serialize`. `rollplex.ops` (costs) imports this package, never the reverse.
"""

from __future__ import annotations

from rollplex.graph import kinds as _builtin_kinds  # noqa: F401  (registers the built-ins)
from rollplex.graph.builder import Prompts, StepBuilder
from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph, GraphError, Op, Phase, Value, ValueKind
from rollplex.graph.schema import OpKind, Port, all_kinds, get_kind, register
from rollplex.graph.serialize import from_json, stable_hash, to_json

__all__ = [
    "Graph",
    "GraphError",
    "Op",
    "OpKind",
    "Phase",
    "Port",
    "Prompts",
    "StepBuilder",
    "Value",
    "ValueKind",
    "all_kinds",
    "from_json",
    "get_kind",
    "lint",
    "register",
    "stable_hash",
    "to_json",
]
