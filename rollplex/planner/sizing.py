"""Sizing: how many bytes per GPU each value of a plan's graph takes on one device group.

Weights, gradients and optimizer state are FSDP-sharded over the training GPUs, rows split
over data-parallel ranks, KV heads over TP; values are whole and padded to the graph's
response width, as the runtime holds them. Sizes are kept per (shape, dtype, kind, phase,
saved part).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from rollplex.graph.ir import Graph, Phase, Value, ValueKind
from rollplex.ops.formulas import kv_fraction, saved_activation_bytes
from rollplex.ops.formulas.llm import LogprobPart
from rollplex.ops.micro_batches import (
    micro_batch_count,
    micro_batches_run,
    trained_forward,
    trained_units,
)
from rollplex.planner.plan import DevicePlan
from rollplex.planner.shared_weights import (
    holds_own_copy,
    rollout_copy_bytes,
    rolls_out,
    weights_layout,
)
from rollplex.specs import ModelSpec, WorkloadSpec

PERSISTENT = (ValueKind.WEIGHTS, ValueKind.OPTIMIZER_STATE)
SAVED_PARTS: dict[str, LogprobPart] = {
    "logprob": "full",
    "logprob_prefix": "prefix",
    "logprob_response": "response",
}


@dataclass(slots=True)
class DeviceSizer:
    graph: Graph
    model: ModelSpec
    workload: WorkloadSpec
    dev: DevicePlan
    train_gpus: int
    micro_tokens: int
    train_tp: int = 1
    micro_recompute: bool = False  # the response forward keeps nothing (runs again later)
    _micro: int = field(default=0, init=False, repr=False, compare=False)  # computed once
    # Sizes depend on a value's shape, dtype and kind only: the K copies of a step share them.
    _sizes: dict[tuple, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _bound: int = field(default=-1, init=False, repr=False, compare=False)
    _copies: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _aliased: bool | None = field(default=None, init=False, repr=False, compare=False)

    def size_bound(self) -> int:
        """At least the summed size of every record `device_lifetimes` can emit for this
        device, less step scratch: each value at its larger size, weights with two
        rollout copies (each at least a TP shard: a replicated tensor's rebuild can exceed
        it). A plan whose bound plus scratch fits the budget fits unshared."""
        if self._bound < 0:
            total = 0
            for v, phase, count in _value_shapes(self.graph):
                # its maker may run on another device: try both sizings
                size = max(self.value_bytes(v, phase), self.value_bytes(v, None))
                if v.kind is ValueKind.WEIGHTS:
                    shard = math.ceil(v.nbytes / max(1, self.dev.tp))
                    size += 2 * max(shard, self.rollout_copy_bytes(v))
                total += count * size
            self._bound = total
        return self._bound

    def rollout_copy_bytes(self, v: Value) -> int:
        """Per GPU bytes of the rollout's copy of weights `v`: aliased only where the
        rollout runs beside the trainer on these GPUs (not in a rollout or train pool)."""
        size = self._copies.get(v.name)
        if size is None:
            if self._aliased is None:
                colocated = self.dev.name != "rollout" and rolls_out(self.dev)
                self._aliased = colocated and not holds_own_copy(self.graph)
            size = self._copies[v.name] = rollout_copy_bytes(
                self.model,
                v,
                self.train_gpus,
                self.train_tp,
                self.dev.tp,
                self._aliased,
                weights_layout(self.graph),
            )
        return size

    def micro_batches(self) -> int:
        """The step's training micro-batch count (`train_micro_batches`): what the plan
        carries and the trainer runs; it bounds op scratch, not the values' sizes."""
        if not self._micro:
            self._micro = train_micro_batches(
                self.model, self.workload, self.graph, self.train_gpus, self.micro_tokens
            )
        return self._micro

    def value_bytes(self, v: Value, producer_phase: Phase | None) -> int:
        part = saved_part(self.graph, v)
        key = (v.shape, v.dtype, v.kind, producer_phase, part)
        size = self._sizes.get(key)
        if size is None:
            size = self._sizes[key] = self._value_bytes(v, producer_phase, part)
        return size

    def _value_bytes(self, v: Value, producer_phase: Phase | None, part: str | None) -> int:
        if v.kind in PERSISTENT or v.kind is ValueKind.GRAD:
            return math.ceil(v.nbytes / self.train_gpus)
        rollout = producer_phase is Phase.ROLLOUT or (
            producer_phase is None and self.dev.name == "rollout"
        )
        dp = self.dev.dp if rollout else self.train_gpus
        if part is not None:
            return math.ceil(self._saved_bytes(v, part, dp))
        size = v.nbytes / dp
        if v.kind is ValueKind.KV_CACHE and rollout:
            size *= kv_fraction(self.model.num_kv_heads, self.dev.tp)  # heads per TP rank
        return math.ceil(size)

    def _saved_bytes(self, v: Value, part: LogprobPart, dp: int) -> float:
        """A training forward's `saved` value, (layers, rows, positions, hidden): positions
        are the prefix (prefix part), the response (response part) or both (full)."""
        if self.micro_recompute and part != "prefix":
            return 0.0  # its forward keeps nothing: the backward runs it again (costs.py)
        _, rows, positions, _ = v.shape
        prefix, response = positions, 0
        if part == "response":
            prefix, response = 0, positions
        elif part == "full":  # the padded response width, as its responses input has it
            response = self.graph.inputs_of(self.graph.producers()[v.name])["responses"].shape[1]
            prefix = positions - response
        return saved_activation_bytes(self.model, rows / dp, prefix, response, part)


def saved_part(graph: Graph, v: Value) -> LogprobPart | None:
    """Which logprob part's `saved` output `v` is, or None for any other value."""
    op = graph.producers().get(v.name)
    if op is None or op.outputs.get("saved") != v.name:
        return None
    return SAVED_PARTS.get(op.kind)


def train_micro_batches(
    model: ModelSpec, workload: WorkloadSpec, graph: Graph, train_gpus: int, micro_tokens: int
) -> int:
    """How many micro-batches one training GPU runs a step's forward and backward in: its
    samples' expected tokens (prefix + mean response) over `schedule.train_micro_tokens`,
    at most one per unit of `graph`'s training forwards (a prompt's group where they share
    the prefix, else a sample: ops/micro_batches.py, the trainer's rule). The planner sizes
    the training forward's and backward's scratch as one of them (their saved activations
    are every micro-batch's); the plan carries the count (`Plan.meta["train_micro_batches"]`)
    and the trainer runs exactly that many."""
    samples = workload.samples_per_step / max(1, train_gpus)
    tokens = samples * (workload.prefix_tokens(model.vision) + workload.response_length.mean)
    count = micro_batch_count(tokens, micro_tokens)
    units = [
        trained_units(graph.inputs_of(op), train_gpus)[0]
        for op in graph.ops.values()
        if op.phase is Phase.TRAIN and trained_forward(graph, op) is op
    ]
    return micro_batches_run(max(units), count) if units else count


_SHAPES: WeakKeyDictionary[Graph, tuple[dict, list[tuple[Value, Phase | None, int]]]] = (
    WeakKeyDictionary()
)


def _value_shapes(graph: Graph) -> list[tuple[Value, Phase | None, int]]:
    """(value, maker's phase, count): one value per (shape, dtype, kind, phase, saved
    part), since
    sizes depend on nothing else and the K copies of a step share them. Kept while the
    graph's producer index stands (a search sizes the same graph once per attempt)."""
    made = graph.producers()
    cached = _SHAPES.get(graph)
    if cached is not None and cached[0] is made:
        return cached[1]
    groups: dict[tuple, list] = {}
    for v in graph.values.values():
        op = made.get(v.name)
        phase = op.phase if op else None
        part = SAVED_PARTS.get(op.kind) if op and op.outputs.get("saved") == v.name else None
        key = (v.shape, v.dtype, v.kind, phase, v.nbytes, part)
        entry = groups.setdefault(key, [v, phase, 0])
        entry[2] += 1
    out = [(v, phase, n) for v, phase, n in groups.values()]
    _SHAPES[graph] = (made, out)
    return out
