"""skip_dead_prefix: the trainer's own prefix forward (and the vision encode only it reads)
reads the step's advantages, so it runs only the prompts whose groups train
(algo.skip_zero_advantage).

Behind a rollout that cannot carry the training prefix's rows in its decode steps
(`piggyback_rows` false: a vLLM engine, which exports no prefill either) the trainer runs
a prefix forward of its own. Its response part already skips the groups whose
advantages are all 0; given the same advantages, the prefix skips their prompts too: no
forward, no saved layer inputs, no backward for them, and no vision encode where the
trainer encodes for that prefix alone. The price is that the prefix waits
for the advantages, so it cannot overlap the engine's window, which measured at most
1.04x on one H200 (bench/results/tail_overlap_bound.md). A rollout that can carry rows
keeps that choice (rides, prefill once), and so does a disaggregated step, whose trainer
GPUs are idle through the rollout (jobs/pipeline.py `passes_for`).
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, Phase


def skip_dead_prefix(graph: Graph) -> tuple[Graph, bool]:
    if any(_window_carries_rows(op) for op in graph):
        return graph, False
    changed = False
    for kind, port in (("logprob_prefix", "kv"), ("vision_encode", "features")):
        for op in graph:
            if op.kind == kind and op.phase is Phase.TRAIN and "advantages" not in op.inputs:
                changed |= _read_by_skipping(graph, op, port)
    if changed:
        graph.invalidate()
    return graph, changed


def _read_by_skipping(graph: Graph, op: Op, port: str) -> bool:
    """Give `op` the advantages every reader of its `port` skips by (the same for all of
    them; a reference or critic forward reading it skips nothing); True if it was given."""
    if op.kind == "logprob_prefix" and "saved" not in op.outputs:
        return False  # a no-grad prefix (PPO's critic scoring) serves every row
    reads = {c.inputs.get("advantages") for c in graph.consumers(op.outputs[port])}
    if len(reads) != 1 or None in reads:
        return False
    op.inputs["advantages"] = reads.pop()
    return True


def _window_carries_rows(op: Op) -> bool:
    """A decode window other phases' rows may ride (unmarked: the torch engine's)."""
    return op.kind in ("decode", "generate") and op.meta.get("piggyback_rows", True)
