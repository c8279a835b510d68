"""Plan only what the chosen roles can do: graph passes driven by the roles' declared
capabilities (`RoleCapabilities`, data in specs/roles.py). They run on the algorithm's
graph before the deduplicating passes (`plan_step(..., rollout=caps)`), and they are all
the planner knows about roles.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, Phase
from rollplex.specs.roles import RoleCapabilities


def apply_rollout_capabilities(graph: Graph, caps: RoleCapabilities) -> tuple[Graph, bool]:
    """`graph` rewritten for a rollout role with `caps` (a new graph); (graph, changed).

    - `fused_prefix` (an engine such as vLLM that encodes, prefills and prefix-caches inside
      its own steps): the rollout's vision_encode -> prefix_prefill -> decode chain becomes
      one `generate` op over pixels + text. No rollout prefix work is left to place and no
      rollout features or KV for the reference or trainer to reuse: they encode their own,
      and that prefix work can still overlap the engine's decode window on another stream
      (schedules/rollplex.py keeps them as candidates);
    - `piggyback_rows` false: the decode window op gets `meta["piggyback_rows"] = False`,
      and the rollplex schedule offers no piggyback placement on it;
    - `static_kv` (the torch engine) goes on the `decode` op (`meta["static_kv"]`): its cost
      is the engine's static workspace, held all step (planner/api.py);
    - `weights_layout`: "engine" and "replica" (a copy of its own) make `weight_sync` mode
      "load", priced as a full copy rather than a free alias; an engine that reads the
      trainer's storage (vLLM with `weights=share`: "algebra") keeps the alias, and its
      `generate` op says so (`meta["own_weights"]`); "torch_tp" (the FSDP2 shared rollout)
      and "replica" also go on the sync as `attrs["layout"]`, so the planner charges that
      rollout's own layout (planner/shared_weights.py), not the algebra's best one;
    - `sleep_levels` go on the `generate` op (`meta["sleep_levels"]`): an engine that can
      drop its weights and KV (level 2) lets the plan free its copy and KV pool after the
      rollout and bring them back at the weight sync and the next rollout (lifetimes.py);
      one that cannot holds both all step.
    A torch rollout (prefix KV exported, rows piggybacked, weights aliased) leaves the graph
    as it is, apart from the meta flag (and, under the FSDP2 trainer, the sync's layout)."""
    ops: list[Op] = []
    changed = False
    fused: dict[str, Op] = {}  # decode name -> its generate op
    dropped: set[str] = set()
    if caps.fused_prefix:
        for op in graph:
            if op.kind == "decode" and op.phase is Phase.ROLLOUT:
                gen, gone = _fuse(graph, op)
                fused[op.name], dropped = gen, dropped | gone
    for op in graph:
        if op.name in dropped:
            changed = True
            continue
        new = fused.get(op.name, op).clone()
        window = new.kind in ("decode", "generate")
        if window and new.meta.get("piggyback_rows") != caps.piggyback_rows:
            new.meta["piggyback_rows"] = caps.piggyback_rows
            changed = True
        if new.kind == "decode" and new.meta.get("static_kv", False) != caps.static_kv:
            new.meta["static_kv"] = caps.static_kv
            changed = True
        if new.kind == "generate" and new.meta.get("sleep_levels") != list(caps.sleep_levels):
            new.meta["sleep_levels"] = list(caps.sleep_levels)
            changed = True
        own = caps.weights_layout in ("engine", "replica")
        if new.kind == "generate" and new.meta.get("own_weights") != own:
            new.meta["own_weights"] = own  # False: it reads the trainer's storage
            changed = True
        if new.kind == "weight_sync":
            changed |= _sync_attrs(new, caps)
        changed |= new.name in fused
        ops.append(new)
    live = {v for op in ops for v in (*op.inputs.values(), *op.outputs.values())}
    values = [v for v in graph.values.values() if v.name in live]
    return Graph(values, ops), changed


def _sync_attrs(op: Op, caps: RoleCapabilities) -> bool:
    """Mark a weight_sync with how the rollout holds its weights; True if changed. An
    engine or a replica has a copy of its own (mode "load"); the FSDP2 shared rollout and
    the replica name their layout (attrs["layout"]), which planner/shared_weights.py
    prices; the algebra's layout is the default and leaves no mark."""
    attrs = dict(op.attrs)
    own = caps.weights_layout in ("engine", "replica")
    if own and attrs.get("mode") == "alias":
        attrs["mode"] = "load"
    if caps.weights_layout in ("torch_tp", "replica"):
        attrs["layout"] = caps.weights_layout
    if attrs == op.attrs:
        return False
    op.attrs = attrs
    return True


def _fuse(graph: Graph, decode: Op) -> tuple[Op, set[str]]:
    """The `generate` op standing for `decode` and the prefix ops it absorbs (those whose
    outputs nothing else reads)."""
    prefill = graph.producer(decode.inputs["kv"])
    vision = graph.producer(prefill.inputs["features"]) if prefill is not None else None
    if prefill is None or prefill.kind != "prefix_prefill" or vision is None:
        raise ValueError(
            f"'{decode.name}': a fused-prefix rollout needs vision_encode -> prefix_prefill "
            "-> decode in the rollout phase"
        )
    gone = {prefill.name}
    if all(c.name == prefill.name for c in graph.consumers(vision.outputs["features"])):
        gone.add(vision.name)
    gen = Op(
        decode.name,  # the same name: plans, traces and tests keep finding the rollout
        "generate",
        Phase.ROLLOUT,
        {
            "pixels": vision.inputs["pixels"],
            "text": prefill.inputs["text"],
            "weights": decode.inputs["weights"],
            "vision_weights": vision.inputs["weights"],
        },
        dict(decode.outputs),
        dict(decode.attrs),
        {**decode.meta, "fused": [vision.name, prefill.name, decode.name]},
    )
    return gen, gone


def apply_trainer_capabilities(graph: Graph, caps: RoleCapabilities) -> tuple[Graph, bool]:
    """`graph` with each backward's gradients in the dtype the trainer with `caps` leaves
    them in: float32 (`float32_grads`, FSDP2's float32 shards) or the weights' own dtype, as
    autograd writes them (the torch trainer; its optimizer step then prices the float32 cast
    onto the masters, ops/formulas/training.py). (new graph, changed)."""
    grads: dict[str, str] = {}
    for op in graph:
        if op.kind == "backward":
            weights = graph.values[op.inputs["weights"]].dtype
            grads[op.outputs["grads"]] = "float32" if caps.float32_grads else weights
    values = [
        v.clone(dtype=grads[v.name]) if grads.get(v.name, v.dtype) != v.dtype else v
        for v in graph.values.values()
    ]
    changed = any(a is not b for a, b in zip(values, graph.values.values(), strict=True))
    if not changed:
        return graph, False
    return Graph(values, [op.clone() for op in graph]), True


def trainer_capabilities_pass(caps: RoleCapabilities):
    """`apply_trainer_capabilities` for `caps` as a named graph pass."""

    def trainer_capabilities(graph: Graph) -> tuple[Graph, bool]:
        return apply_trainer_capabilities(graph, caps)

    return trainer_capabilities


def role_capabilities_pass(caps: RoleCapabilities):
    """`apply_rollout_capabilities` for `caps` as a named graph pass."""

    def role_capabilities(graph: Graph) -> tuple[Graph, bool]:
        return apply_rollout_capabilities(graph, caps)

    return role_capabilities


def engine_can_sleep(op: Op) -> bool:
    """`op` is an engine rollout that can drop its weights and KV between rollouts (sleep
    level 2), as the capabilities pass marked it."""
    return op.kind == "generate" and 2 in op.meta.get("sleep_levels", ())
