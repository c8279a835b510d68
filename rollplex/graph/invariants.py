"""`lint(graph)`: the invariants every graph holds, checked after every pass.

Structure (producers, acyclic, registered kinds and ports, kinds/dtypes/shapes along every
edge), phase order, training on-policy (by lineage), saved activations, frozen weights and
each update's weights version. The numbered list is on `lint`; each failure raises
`GraphError` naming the op or value at fault.
"""

from __future__ import annotations

from rollplex.graph.frozen import check_trained
from rollplex.graph.ir import (
    DTYPE_BYTES,
    Graph,
    GraphError,
    Op,
    Phase,
    Value,
    ValueKind,
    version_model,
)
from rollplex.graph.lineage import lineage
from rollplex.graph.schema import OpKind, Port, get_kind


def lint(graph: Graph) -> Graph:
    """Raise `GraphError` on the first broken invariant; return the graph unchanged.

    1. every referenced value exists; each has one producer, or is external (and none);
    2. the op graph is acyclic;
    3. ops use registered kinds and only their ports; required ports are wired;
    4. along every edge the value's kind, dtype and shape fit the consuming port;
    5. on-policy: no train/update op reads data made under a policy version other than the
       one the optimizer step updates (external data counts with its own stamp);
    6. a backward's `saved_*` inputs are what training forwards kept for it; phases run in
       order, but for PPO mini-batches (update k+1 reads what update k wrote);
    7. values are well formed: known dtype, positive dims, versions `<model>@<n>`, positive
       `group_size`;
    8. what an optimizer step trains is versioned and not frozen (`graph.frozen`);
    9. each update's gradient path uses the version its optimizer step updates, so only the
       first update may reuse work done with the rollout's weights.
    """
    for v in graph.values.values():
        _check_value(v)
    _check_producers(graph)
    _check_acyclic(graph)
    for op in graph.ops.values():
        _check_op(graph, op, get_kind(op.kind))
    _check_phase_order(graph)
    check_trained(graph)
    _check_on_policy(graph)
    _check_saved(graph)
    _check_update_versions(graph)
    return graph


def _check_value(v: Value) -> None:
    where = f"value '{v.name}'"
    if v.dtype not in DTYPE_BYTES:
        raise GraphError(where, f"has unknown dtype {v.dtype!r} (known: {sorted(DTYPE_BYTES)})")
    if not isinstance(v.shape, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in v.shape
    ):
        raise GraphError(where, f"shape {v.shape!r} must be a tuple of positive integers")
    if not isinstance(v.kind, ValueKind):
        raise GraphError(where, f"kind {v.kind!r} is not one of {[str(k) for k in ValueKind]}")
    if v.version is not None and not _is_version(v.version):
        raise GraphError(where, f"version {v.version!r} is not '<model>@<n>'")


def _is_version(version: object) -> bool:
    if not isinstance(version, str) or version.count("@") != 1:
        return False
    model, n = version.split("@")
    return bool(model) and n.lstrip("-").isdigit()


def _check_producers(graph: Graph) -> dict[str, Op]:
    made: dict[str, Op] = {}
    for op in graph.ops.values():
        for v in (*op.inputs.values(), *op.outputs.values()):
            if v not in graph.values:
                raise GraphError(f"op '{op.name}'", f"references undefined value '{v}'")
        for v in op.outputs.values():
            if v in made:
                raise GraphError(
                    f"value '{v}'", f"has two producers: '{made[v].name}' and '{op.name}'"
                )
            if graph.values[v].external:
                raise GraphError(f"value '{v}'", f"is external but produced by '{op.name}'")
            made[v] = op
    for op in graph.ops.values():
        for p, v in op.inputs.items():
            if v not in made and not graph.values[v].external:
                raise GraphError(
                    f"op '{op.name}'",
                    f"input '{p}' reads '{v}', which nothing produces and is not external",
                )
    return made


def _check_op(graph: Graph, op: Op, kind: OpKind) -> None:
    where = f"op '{op.name}' ({op.kind})"
    if not isinstance(op.phase, Phase):
        raise GraphError(where, f"phase {op.phase!r} is not one of {[str(p) for p in Phase]}")
    g = op.attrs.get("group_size", 1)
    if not isinstance(g, int) or isinstance(g, bool) or g < 1:
        raise GraphError(where, f"group_size={g!r} must be a positive integer")
    for p, schema in kind.inputs.items():
        if p not in op.inputs and not schema.optional:
            raise GraphError(where, f"required input '{p}' is not wired")
    for p, schema in kind.outputs.items():
        if p not in op.outputs and not schema.optional:
            raise GraphError(where, f"required output '{p}' is not wired")
    symbols: dict[str, int] = {}
    for p, v in op.inputs.items():
        schema = kind.input_port(p)
        if schema is None:
            raise GraphError(where, f"has no input port '{p}' (ports: {sorted(kind.inputs)})")
        _check_port(where, f"input '{p}'", schema, graph.values[v], symbols)
    for p, v in op.outputs.items():
        if p not in kind.outputs:
            raise GraphError(where, f"has no output port '{p}' (ports: {sorted(kind.outputs)})")
        _check_port(where, f"output '{p}'", kind.outputs[p], graph.values[v], symbols)
    if kind.check is not None and (msg := kind.check(op, symbols)):
        raise GraphError(where, msg)


def _check_port(where: str, what: str, schema: Port, value: Value, sym: dict[str, int]) -> None:
    if value.kind not in schema.kinds:
        raise GraphError(
            where, f"{what} takes {sorted(schema.kinds)}, got '{value.name}' of kind {value.kind}"
        )
    if not schema.accepts_dtype(value.dtype):
        raise GraphError(
            where, f"{what} expects dtype {schema.dtype}, got '{value.name}' of dtype {value.dtype}"
        )
    if schema.dims is None:
        return
    if len(value.shape) < len(schema.dims) or (not schema.dims and value.shape):
        raise GraphError(
            where,
            f"{what} expects rank {len(schema.dims)}, got '{value.name}' of shape {value.shape}",
        )
    for axis, s in enumerate(schema.dims):
        if s is None:
            continue
        size = value.shape[axis]
        if sym.setdefault(s, size) != size:
            raise GraphError(
                where,
                f"{what} '{value.name}' has {s}={size} on axis {axis}, but "
                f"another port of this op has {s}={sym[s]} (shape mismatch)",
            )


_PHASE_ORDER = {p: i for i, p in enumerate(Phase)}


def _check_phase_order(graph: Graph) -> None:
    made = graph.producers()
    for op in graph.ops.values():
        for p, v in op.inputs.items():
            src = made.get(v)
            if src is None or _PHASE_ORDER[src.phase] <= _PHASE_ORDER[op.phase]:
                continue
            # PPO mini-batches: update k+1's training ops read the weights update k's
            # optimizer step wrote (algos/updates.py); they are ordered by that edge.
            loop = src.kind == "optimizer_step" and op.phase is Phase.TRAIN and p == "weights"
            if not loop:
                raise GraphError(
                    f"op '{op.name}' ({op.phase})",
                    f"input '{p}' reads '{v}', made by '{src.name}' in the later phase "
                    f"{src.phase} (phases run {[str(x) for x in Phase]})",
                )


_FORWARDS = ("logprob", "logprob_prefix", "logprob_response")
_EXPORTERS = ("prefix_prefill", "logprob_prefix")


def _check_saved(graph: Graph) -> None:
    made = graph.producers()
    for op in graph.ops.values():
        if op.kind != "backward":
            continue
        for p, v in op.inputs.items():
            if not p.startswith("saved"):
                continue
            src = made.get(v)
            kept = src is not None and src.kind in _FORWARDS and src.outputs.get("saved") == v
            # prefill once: a no-grad prefix forward's export stands for the training
            # prefix forward's saved inputs (graph/passes/prefill_once.py)
            exported = (
                src is not None and src.kind in _EXPORTERS and (src.outputs.get("exported") == v)
            )
            # decode once: the decode's kept layer outputs stand for the training response
            # forward's (graph/passes/decode_once.py)
            exported = exported or (
                src is not None and src.kind == "decode" and src.outputs.get("kept") == v
            )
            if not (kept or exported):
                raise GraphError(
                    f"op '{op.name}' (backward)",
                    f"input '{p}' reads '{v}', which is not a training forward's 'saved' output "
                    "(nor a prefix forward's 'exported' one, nor a decode's 'kept' one)",
                )
            if src.inputs.get("weights") != op.inputs.get("weights"):
                raise GraphError(
                    f"op '{op.name}' (backward)",
                    f"input '{p}' reads '{v}', kept by '{src.name}' through "
                    f"'{src.inputs.get('weights')}', but it differentiates "
                    f"'{op.inputs.get('weights')}'",
                )


def _check_acyclic(graph: Graph) -> None:
    cycle = graph.find_cycle()
    if cycle is not None:
        raise GraphError(f"op '{cycle[0]}'", f"is on a cycle: {' -> '.join(cycle)}")


def _check_on_policy(graph: Graph) -> None:
    """Every policy version that reaches a train/update input is one the step updates.

    Reads lineage (which weights versions were applied to which data on the way), not the
    builder's one-stamp-per-value: stale data that passes through an op which also reads
    fresh weights keeps its stale pair, so it cannot be relabelled as fresh."""
    updated = {
        graph.values[op.inputs["weights"]].version
        for op in graph.ops.values()
        if op.kind == "optimizer_step"
    }
    models = {version_model(u) for u in updated}
    if not updated:
        return
    tags = lineage(graph)
    for op in graph.ops.values():
        if op.phase not in (Phase.TRAIN, Phase.UPDATE) or op.kind == "weight_sync":
            continue
        for p, vname in op.inputs.items():
            v = graph.values[vname]
            versions = {w for w, _ in tags.get(vname, ()) if w is not None}
            if v.kind is ValueKind.WEIGHTS and v.version is not None:
                versions.add(v.version)
            stale = sorted(w for w in versions if version_model(w) in models and w not in updated)
            if stale:
                raise GraphError(
                    f"op '{op.name}'",
                    f"input '{p}' reads '{vname}', computed with {stale[0]}, but the step "
                    f"updates {sorted(u for u in updated if u)} (stale policy: not on-policy)",
                )


def _check_update_versions(graph: Graph) -> None:
    """Rule 6: the backward reads the weights its optimizer step updates, and every op that
    computes its kept activations or its loss's `logprobs`/`values` (walking back through
    row ops, K/V and features; sampled `responses` are data) reads that model's weights at
    that version too. A stale forward (say the rollout's prefix K/V at policy@0 feeding
    update 1) would give gradients of other weights than the ones stepped."""
    producer = {v: op for op in graph.ops.values() for v in op.outputs.values()}
    step_of = {op.inputs["grads"]: op for op in graph.ops.values() if op.kind == "optimizer_step"}
    for op in graph.ops.values():
        step = step_of.get(op.outputs.get("grads", "")) if op.kind == "backward" else None
        if step is None:
            continue
        want = graph.values[step.inputs["weights"]].version
        have = graph.values[op.inputs["weights"]].version
        if have != want:
            raise GraphError(
                f"op '{op.name}'", f"reads weights {have}, but its gradients update {want}"
            )
        sources = [v for p, v in op.inputs.items() if p.startswith("saved")]
        loss = producer.get(op.inputs["loss"])
        if loss is not None:
            sources += [loss.inputs[p] for p in ("logprobs", "values") if p in loss.inputs]
        for v in sources:
            for who, ver in _forward_versions(graph, producer, v, version_model(want)):
                if ver != want:
                    raise GraphError(
                        f"op '{who}'",
                        f"computes with {ver} what '{op.name}' differentiates for {want}: "
                        f"update of {want} reads work of another weights version",
                    )


def _forward_versions(
    graph: Graph, producer: dict[str, Op], value: str, model: str | None
) -> set[tuple[str, str]]:
    """(op, version) for each op upstream of `value` that reads `model`'s weights."""
    found: set[tuple[str, str]] = set()
    seen: set[str] = set()
    stack = [value]
    while stack:
        op = producer.get(stack.pop())
        if op is None or op.name in seen:
            continue
        seen.add(op.name)
        for port, vname in op.inputs.items():
            v = graph.values[vname]
            if v.kind is ValueKind.WEIGHTS:
                if v.version is not None and version_model(v.version) == model:
                    found.add((op.name, v.version))
            elif port != "responses":
                stack.append(vname)
    return found
