"""JSON round-trip of a Graph, and a stable content hash.

The hash covers values and ops in program order with sorted keys, so it changes exactly
when the graph's meaning or order changes, never with dict iteration details."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rollplex.graph.ir import Graph, Op, Phase, Value, ValueKind

FORMAT_VERSION = 1


def to_dict(graph: Graph) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "values": [
            {
                "name": v.name,
                "shape": list(v.shape),
                "dtype": v.dtype,
                "kind": str(v.kind),
                "version": v.version,
                "external": v.external,
            }
            for v in graph.values.values()
        ],
        "ops": [
            {
                "name": o.name,
                "kind": o.kind,
                "phase": str(o.phase),
                "inputs": o.inputs,
                "outputs": o.outputs,
                "attrs": o.attrs,
                "meta": o.meta,
            }
            for o in graph.ops.values()
        ],
    }


def from_dict(data: dict[str, Any]) -> Graph:
    if data.get("format") != FORMAT_VERSION:
        raise ValueError(f"graph format {data.get('format')!r} is not {FORMAT_VERSION}")
    values = [
        Value(
            v["name"],
            tuple(v["shape"]),
            v["dtype"],
            ValueKind(v["kind"]),
            v["version"],
            v["external"],
        )
        for v in data["values"]
    ]
    ops = [
        Op(
            o["name"],
            o["kind"],
            Phase(o["phase"]),
            dict(o["inputs"]),
            dict(o["outputs"]),
            dict(o["attrs"]),
            dict(o["meta"]),
        )
        for o in data["ops"]
    ]
    return Graph(values, ops)


def to_json(graph: Graph, indent: int | None = None) -> str:
    return json.dumps(to_dict(graph), sort_keys=True, indent=indent)


def from_json(text: str) -> Graph:
    return from_dict(json.loads(text))


def stable_hash(graph: Graph) -> str:
    """sha256 of the canonical JSON; `meta` is excluded (it is annotation, not meaning)."""
    data = to_dict(graph)
    for op in data["ops"]:
        op.pop("meta")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
