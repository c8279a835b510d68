"""What prefill_once and decode_once share: pairing each training forward with the rollout op
that computed its activations, the same-weights test, and handing the rollout op's held
activations to whatever read the forward's saved ones (the backward)."""

from __future__ import annotations

from collections.abc import Callable

from rollplex.graph.ir import Graph, Op, Value


def rewrite_pairs(
    graph: Graph,
    sources: list[Op],
    is_target: Callable[[Op], bool],
    same: Callable[[Graph, Op, Op], bool],
    rewrite: Callable[[Graph, Op, Op], None],
) -> tuple[Graph, bool]:
    """`rewrite(graph, source, target)` for each target and the first source `same` pairs
    it with; (the rebuilt graph, True) when anything changed, else (graph, False)."""
    changed = False
    for target in list(graph):
        if not is_target(target):
            continue
        source = next((s for s in sources if same(graph, s, target)), None)
        if source is not None:
            rewrite(graph, source, target)
            changed = True
    if not changed:
        return graph, False
    return Graph(graph.values.values(), graph.ops.values()), True


def same_weights(graph: Graph, a: Op, b: Op) -> bool:
    """`a` and `b` read the same weights value, at one known version."""
    w_a, w_b = a.inputs["weights"], b.inputs["weights"]
    if w_a != w_b:
        return False
    version = graph.values[w_a].version
    return version is not None and version == graph.values[w_b].version


def hand_over(graph: Graph, source: Op, port: str, held: Value, saved: Value) -> None:
    """`source` gains output `port` = `held` (once: one source serves every forward), and
    every reader of the forward's `saved` activations reads `held` instead."""
    if held.name not in graph.values:
        graph.add_value(held)
        source.outputs[port] = held.name
    for reader in graph.consumers(saved.name):
        reader.inputs = {p: held.name if v == saved.name else v for p, v in reader.inputs.items()}
    del graph.values[saved.name]
