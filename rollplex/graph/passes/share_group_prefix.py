"""share_group_prefix: one prefix computation per prompt, shared by its G samples.

verl repeats each prompt G times before the reference and training forwards; this hoists the
`expand_group` past every prefix op, and response ops read the shared boundary directly.
Valid because prefix ops are row-wise (f(repeat(x)) == repeat(f(x))), and the G samples'
gradients add up in the shared prefix as over G copies.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, Value
from rollplex.graph.schema import get_kind


def share_group_prefix(graph: Graph) -> tuple[Graph, bool]:
    changed = False
    made = dict(graph.producers())  # kept current by hand: no index rebuild per rewrite
    after: dict[str, list[Op]] = {}  # new expand ops, placed after their anchor at the end
    for op in graph.topo_order():
        if get_kind(op.kind).prefix and _hoist(graph, op, made, after):
            changed = True
    if after:
        graph.ops = {
            o.name: o for op in list(graph.ops.values()) for o in (op, *after.get(op.name, ()))
        }
        graph.invalidate()
    for op in list(graph.ops.values()):
        if op.kind in ("logprob_response", "backward") and _fold(graph, op, made):
            changed = True
    return _drop_unused_expands(graph), changed


def _expand_source(made: dict[str, Op], value: str) -> tuple[str, int] | None:
    src = made.get(value)
    if src is None or src.kind != "expand_group":
        return None
    return src.inputs["x"], src.attrs["group_size"]


def _hoist(graph: Graph, op: Op, made: dict[str, Op], after: dict[str, list[Op]]) -> bool:
    rows = {p: v for p, v in op.inputs.items() if p != "weights"}
    sources = {p: _expand_source(made, v) for p, v in rows.items()}
    groups = {s[1] for s in sources.values() if s is not None}
    if None in sources.values() or len(groups) != 1:
        return False
    g = groups.pop()
    for p, (x, _) in sources.items():
        op.inputs[p] = x
    out_ports = list(op.outputs.items())
    for port, name in out_ports:
        old = graph.values.pop(name)
        shape = _rows_div(old, get_kind(op.kind).outputs[port].dims, g)
        shared = Value(f"{name}.shared", shape, old.dtype, old.kind, old.version)
        graph.values[shared.name] = shared
        graph.values[name] = old
        op.outputs[port] = shared.name
        expand = Op(
            f"{op.name}.expand_{port}",
            "expand_group",
            op.phase,
            {"x": shared.name},
            {"y": name},
            {"group_size": g},
            {"inserted_by": "share_group_prefix"},
        )
        after.setdefault(op.name, []).append(expand)
        made[shared.name], made[name] = op, expand
    return True


def _fold(graph: Graph, op: Op, made: dict[str, Op]) -> bool:
    changed = False
    for port, value in list(op.inputs.items()):
        if port == "responses" or port == "weights":
            continue
        src = _expand_source(made, value)
        if src is None or graph.values[value].kind.value not in ("kv_cache", "boundary"):
            continue
        op.inputs[port] = src[0]
        if op.kind == "logprob_response":
            op.attrs["group_size"] = op.attrs.get("group_size", 1) * src[1]
        changed = True
    if changed:
        graph.invalidate()
    return changed


def _rows_div(v: Value, dims: tuple[str | None, ...] | None, g: int) -> tuple[int, ...]:
    """Divide the row axis (the port's "B" symbol) by the group size."""
    axis = dims.index("B") if dims and "B" in dims else 0
    shape = list(v.shape)
    shape[axis] //= g
    return tuple(shape)


def _drop_unused_expands(graph: Graph) -> Graph:
    used = {v for op in graph.ops.values() for v in op.inputs.values()}
    ops = [
        op
        for op in graph.ops.values()
        if not (op.kind == "expand_group" and op.outputs["y"] not in used)
    ]
    live = {v for op in ops for v in (*op.inputs.values(), *op.outputs.values())}
    values = [v for v in graph.values.values() if v.name in live or v.external]
    return Graph(values, ops)
