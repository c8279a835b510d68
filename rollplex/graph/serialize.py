"""JSON round-trip of a Graph, and a stable content hash.

The hash covers values and ops in program order with sorted keys, so it changes exactly
when the graph's meaning or order changes, never with dict iteration details."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rollplex.graph.ir import Graph, GraphError, Op, Phase, Value, ValueKind

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


def from_dict(data: Any) -> Graph:
    """A Graph from `to_dict`'s form; a malformed entry raises GraphError naming it."""
    if not isinstance(data, dict):
        raise GraphError("graph JSON", f"must be an object, got {type(data).__name__}")
    if data.get("format") != FORMAT_VERSION:
        raise GraphError("graph JSON", f"format {data.get('format')!r} is not {FORMAT_VERSION}")
    values = [_value(v, i) for i, v in enumerate(_list(data, "values"))]
    ops = [_op(o, i) for i, o in enumerate(_list(data, "ops"))]
    return Graph(values, ops)


_VALUE_FIELDS = {"name", "shape", "dtype", "kind", "version", "external"}
_OP_FIELDS = {"name", "kind", "phase", "inputs", "outputs", "attrs", "meta"}


def _list(data: dict, key: str) -> list:
    items = data.get(key)
    if not isinstance(items, list):
        raise GraphError("graph JSON", f"'{key}' must be a list, got {type(items).__name__}")
    return items


def _entry(item: Any, fields: set[str], where: str) -> tuple[dict, str]:
    if not isinstance(item, dict):
        raise GraphError(where, f"must be an object, got {type(item).__name__}")
    if isinstance(item.get("name"), str):
        where = f"{where} ('{item['name']}')"
    if set(item) != fields:
        missing, extra = sorted(fields - set(item)), sorted(set(item) - fields)
        raise GraphError(where, f"missing fields {missing}, unknown fields {extra}")
    if not isinstance(item["name"], str) or not item["name"]:
        raise GraphError(where, f"name {item['name']!r} must be a non-empty string")
    return item, where


def _value(item: Any, i: int) -> Value:
    v, where = _entry(item, _VALUE_FIELDS, f"values[{i}]")
    shape = v["shape"]
    if not isinstance(shape, list) or not all(type(d) is int for d in shape):
        raise GraphError(where, f"shape {shape!r} must be a list of integers")
    if not isinstance(v["dtype"], str):
        raise GraphError(where, f"dtype {v['dtype']!r} must be a string")
    if v["version"] is not None and not isinstance(v["version"], str):
        raise GraphError(where, f"version {v['version']!r} must be a string or null")
    if not isinstance(v["external"], bool):
        raise GraphError(where, f"external {v['external']!r} must be true or false")
    kind = _enum(ValueKind, v["kind"], where, "kind")
    return Value(v["name"], tuple(shape), v["dtype"], kind, v["version"], v["external"])


def _op(item: Any, i: int) -> Op:
    o, where = _entry(item, _OP_FIELDS, f"ops[{i}]")
    if not isinstance(o["kind"], str):
        raise GraphError(where, f"kind {o['kind']!r} must be a string")
    for key in ("inputs", "outputs"):
        ports = o[key]
        if not isinstance(ports, dict) or not all(isinstance(v, str) for v in ports.values()):
            raise GraphError(where, f"{key} must map port names to value names")
    for key in ("attrs", "meta"):
        if not isinstance(o[key], dict):
            raise GraphError(where, f"{key} must be an object")
    phase = _enum(Phase, o["phase"], where, "phase")
    return Op(
        o["name"],
        o["kind"],
        phase,
        dict(o["inputs"]),
        dict(o["outputs"]),
        dict(o["attrs"]),
        dict(o["meta"]),
    )


def _enum(enum: type, value: Any, where: str, field: str):
    try:
        return enum(value)
    except (ValueError, TypeError):
        known = [str(e) for e in enum]
        raise GraphError(where, f"{field} {value!r} is not one of {known}") from None


def to_json(graph: Graph, indent: int | None = None) -> str:
    return json.dumps(to_dict(graph), sort_keys=True, indent=indent)


def from_json(text: str) -> Graph:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise GraphError("graph JSON", f"is not JSON: {err}") from None
    return from_dict(data)


def stable_hash(graph: Graph) -> str:
    """sha256 of the canonical JSON; `meta` is excluded (it is annotation, not meaning)."""
    data = to_dict(graph)
    for op in data["ops"]:
        op.pop("meta")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
