"""skip_dead_prefix: the trainer's own prefix forward reads the step's advantages, so it
runs only the prompts whose groups train (algo.skip_zero_advantage).

Behind a rollout that cannot carry the training prefix's rows in its decode steps
(`piggyback_rows` false: a vLLM engine, which exports no prefill either) the trainer runs
a prefix forward of its own. Its response part already skips the groups whose
advantages are all 0; given the same advantages, the prefix skips their prompts too: no
forward, no saved layer inputs, no backward for them. The price is that the prefix waits
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
    for op in graph:
        if op.kind != "logprob_prefix" or op.phase is not Phase.TRAIN or "saved" not in op.outputs:
            continue
        # every reader of its K/V skips rows, and by the same advantages
        reads = {c.inputs.get("advantages") for c in graph.consumers(op.outputs["kv"])}
        if len(reads) == 1 and None not in reads and "advantages" not in op.inputs:
            op.inputs["advantages"] = reads.pop()
            changed = True
    if changed:
        graph.invalidate()
    return graph, changed


def _window_carries_rows(op: Op) -> bool:
    """A decode window other phases' rows may ride (unmarked: the torch engine's)."""
    return op.kind in ("decode", "generate") and op.meta.get("piggyback_rows", True)
