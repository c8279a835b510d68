"""The step IR: values (tensors with a kind and a weights version) and ops over them.

A `Graph` is a closed set of node kinds in the torch.fx spirit: ops come from the one
registry in `rollplex.ops`, every value has exactly one producer (or is external), and a
free `meta` dict on each op carries pass annotations. Program order is insertion order,
which makes every traversal deterministic without ever sorting by name.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import networkx as nx

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int64": 8, "int32": 4, "uint8": 1}


class ValueKind(StrEnum):
    WEIGHTS = "weights"
    ACTIVATION = "activation"
    KV_CACHE = "kv_cache"
    BOUNDARY = "boundary"  # prefix activations kept for a later backward
    GRAD = "grad"
    OPTIMIZER_STATE = "optimizer_state"
    HOST_DATA = "host_data"


class Phase(StrEnum):
    ROLLOUT = "rollout"
    REFERENCE = "reference"
    TRAIN = "train"
    UPDATE = "update"


def version_model(version: str | None) -> str | None:
    """`"policy@0"` -> `"policy"`. Versions name the weights that determined a value."""
    return None if version is None else version.split("@", 1)[0]


@dataclass(slots=True)
class Value:
    """A tensor of the step. `version` is the weights version it was computed under
    (`"<model>@<n>"`, n counted from the step's start), or None for plain data."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: ValueKind
    version: str | None = None
    external: bool = False  # supplied from outside the step (initial weights, prompts)

    def clone(self, **changes: Any) -> Value:
        return replace(self, **changes)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(slots=True)
class Op:
    """One op: a registry kind applied to named input ports, writing named output ports."""

    name: str
    kind: str
    phase: Phase
    inputs: dict[str, str] = field(default_factory=dict)  # port -> value name
    outputs: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def clone(self) -> Op:
        """A copy whose port, attribute and meta dicts can be edited on their own."""
        return Op(
            self.name,
            self.kind,
            self.phase,
            dict(self.inputs),
            dict(self.outputs),
            dict(self.attrs),
            dict(self.meta),
        )


class GraphError(ValueError):
    """An invalid graph. `where` names the op or value at fault."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


class Graph:
    """Values and ops in program order, with a networkx view for ordering queries."""

    def __init__(self, values: Iterable[Value] = (), ops: Iterable[Op] = ()) -> None:
        self.values: dict[str, Value] = {}
        self.ops: dict[str, Op] = {}
        self._nx: nx.DiGraph | None = None
        self._made: dict[str, Op] | None = None
        for v in values:
            self.add_value(v)
        for op in ops:
            self.add_op(op)

    # -- construction -------------------------------------------------------------------
    def add_value(self, value: Value) -> Value:
        if value.name in self.values:
            raise GraphError(f"value '{value.name}'", "defined twice")
        self.values[value.name] = value
        self.invalidate()
        return value

    def add_op(self, op: Op) -> Op:
        if op.name in self.ops:
            raise GraphError(f"op '{op.name}'", "defined twice")
        self.ops[op.name] = op
        self.invalidate()
        return op

    def invalidate(self) -> None:
        """Drop cached indexes; call after editing an op's ports in place."""
        self._nx = None
        self._made = None

    def copy(self) -> Graph:
        """A deep-enough copy for passes: new Value/Op records, shared immutable leaves."""
        return Graph(
            [v.clone() for v in self.values.values()], [o.clone() for o in self.ops.values()]
        )

    # -- queries ------------------------------------------------------------------------
    def producer(self, value: str) -> Op | None:
        return self.producers().get(value)

    def producers(self) -> dict[str, Op]:
        """value name -> producing op (the last one if lint would reject duplicates)."""
        if self._made is None:
            self._made = {v: op for op in self.ops.values() for v in op.outputs.values()}
        return self._made

    def consumers(self, value: str) -> list[Op]:
        return [op for op in self.ops.values() if value in op.inputs.values()]

    def inputs_of(self, op: Op) -> dict[str, Value]:
        return {port: self.values[v] for port, v in op.inputs.items()}

    def outputs_of(self, op: Op) -> dict[str, Value]:
        return {port: self.values[v] for port, v in op.outputs.items()}

    def weights_read(self, op: Op) -> dict[str, str | None]:
        """port -> version of each weights input: the hook that proves piggybacking safe."""
        return {p: v.version for p, v in self.inputs_of(op).items() if v.kind is ValueKind.WEIGHTS}

    def phase_ops(self, phase: Phase) -> list[Op]:
        return [op for op in self.ops.values() if op.phase is phase]

    @property
    def nx(self) -> nx.DiGraph:
        """Op-level dependency graph; edges carry the value names that flow along them."""
        if self._nx is None:
            g = nx.DiGraph()
            for i, name in enumerate(self.ops):
                g.add_node(name, index=i)
            made = self.producers()
            for op in self.ops.values():
                for v in op.inputs.values():
                    src = made.get(v)
                    if src is not None:
                        if g.has_edge(src.name, op.name):
                            g.edges[src.name, op.name]["values"].append(v)
                        else:
                            g.add_edge(src.name, op.name, values=[v])
            self._nx = g
        return self._nx

    def topo_order(self) -> list[Op]:
        """Dependencies first; among ready ops, program order (never names) breaks ties.

        Kahn's algorithm over program indices with a heap of the ready ones; when program
        order already has every producer first (builders write it so), it is the answer."""
        ops = list(self.ops.values())
        index = {op.name: i for i, op in enumerate(ops)}
        made = self.producers()
        reads = ((i, v) for i, op in enumerate(ops) for v in op.inputs.values())
        if all(index[made[v].name] < i for i, v in reads if v in made):
            return ops
        after: list[list[int]] = [[] for _ in ops]
        waits = [0] * len(ops)
        for i, op in enumerate(ops):
            for src in {index[made[v].name] for v in op.inputs.values() if v in made}:
                after[src].append(i)
                waits[i] += 1
        ready = [i for i, w in enumerate(waits) if w == 0]  # ascending: already a heap
        out: list[Op] = []
        while ready:
            i = heapq.heappop(ready)
            out.append(ops[i])
            for j in after[i]:
                waits[j] -= 1
                if waits[j] == 0:
                    heapq.heappush(ready, j)
        if len(out) < len(ops):
            raise GraphError("graph", "has a dependency cycle (lint names it)")
        return out

    def subgraph(self, phase: Phase) -> Graph:
        """The ops of one phase; values made elsewhere become external inputs."""
        ops = [op for op in self.ops.values() if op.phase is phase]
        made = {v for op in ops for v in op.outputs.values()}
        used = [v for op in ops for v in (*op.inputs.values(), *op.outputs.values())]
        values = [
            self.values[n].clone(external=self.values[n].external or n not in made)
            for n in dict.fromkeys(used)
        ]
        return Graph(values, [o.clone() for o in ops])

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops.values())

    def __len__(self) -> int:
        return len(self.ops)

    def __repr__(self) -> str:
        return f"Graph({len(self.ops)} ops, {len(self.values)} values)"
