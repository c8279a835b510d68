"""What an optimizer step may train: versioned weights that the step does not hold frozen.

Frozen by their role, whatever their names: the KL reference (its logprobs feed a
`ref_logprobs` port) and a vision tower of its own (only `vision_encode` reads it; a
trainable tower is part of the model's weights). Trained weights must carry a version, or
the on-policy check would see nothing.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, GraphError, Op, version_model

# Ops that touch weights without computing with them in the step's forward work.
_UPDATE_KINDS = ("backward", "optimizer_step", "weight_sync")


def check_trained(graph: Graph) -> None:
    """Raise GraphError naming the optimizer step that trains unversioned or frozen weights."""
    steps = [op for op in graph.ops.values() if op.kind == "optimizer_step"]
    if not steps:
        return
    reference = _reference_models(graph)
    for op in steps:
        where = f"op '{op.name}' (optimizer_step)"
        name = op.inputs["weights"]
        w = graph.values[name]
        if w.version is None:
            raise GraphError(
                where,
                f"trains '{name}', which has no version ('<model>@<n>'): the on-policy "
                "check could not tell its data's weights apart",
            )
        model = version_model(w.version)
        if model in reference:
            raise GraphError(
                where,
                f"trains '{name}' ({w.version}), the frozen KL reference: its logprobs feed "
                f"'{reference[model]}'",
            )
        readers = [o for o in graph.consumers(name) if o.kind not in _UPDATE_KINDS]
        if readers and all(o.kind == "vision_encode" for o in readers):
            users = sorted(_feature_models(graph, readers))
            raise GraphError(
                where,
                f"trains '{name}', a frozen vision tower of its own (read only by vision_encode, "
                f"feeding {users or 'nothing'}): a trained tower belongs in the model's weights "
                "(model.trainable_vision)",
            )


def _reference_models(graph: Graph) -> dict[str, str]:
    """model -> the op whose `ref_logprobs` port reads that model's logprobs."""
    made = graph.producers()
    out: dict[str, str] = {}
    for op in graph.ops.values():
        src = made.get(op.inputs.get("ref_logprobs", ""))
        w = src.inputs.get("weights") if src is not None else None
        if w is not None and w in graph.values:
            model = version_model(graph.values[w].version)
            if model is not None:
                out.setdefault(model, f"{op.name}.ref_logprobs")
    return out


def _feature_models(graph: Graph, encoders: list[Op]) -> set[str]:
    """The models whose ops read these vision encoders' features."""
    out: set[str] = set()
    for enc in encoders:
        for reader in graph.consumers(enc.outputs.get("features", "")):
            w = reader.inputs.get("weights")
            if w is not None and w in graph.values:
                out.add(str(version_model(graph.values[w].version)))
    return out
