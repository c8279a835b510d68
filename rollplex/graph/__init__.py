"""The step IR, its builder DSL, lint, serialization and passes."""

from rollplex.graph.builder import Prompts, StepBuilder
from rollplex.graph.ir import Graph, GraphError, Op, Phase, Value, ValueKind
from rollplex.graph.lint import lint
from rollplex.graph.serialize import from_json, stable_hash, to_json

__all__ = [
    "Graph",
    "GraphError",
    "Op",
    "Phase",
    "Prompts",
    "StepBuilder",
    "Value",
    "ValueKind",
    "from_json",
    "lint",
    "stable_hash",
    "to_json",
]
