"""Lifetimes: one `UsageRecord` per tensor a device group holds, from the timed plan.

Positions are the device's steps by predicted start; a value lives from its producer to its
last reader, state that crosses RL steps to the end, scratch for its step. Sizes come from
`sizing.DeviceSizer`; the rollout's weight copy follows the phase-aware rules in
docs/architecture.md (Memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rollplex.graph.ir import Graph, Phase, Value, ValueKind
from rollplex.planner.capabilities import engine_can_sleep
from rollplex.planner.happens_before import ordered_before
from rollplex.planner.memory.records import UsageRecord
from rollplex.planner.plan import DevicePlan, Step
from rollplex.planner.shared_weights import HELD_LAYOUTS, weights_layout
from rollplex.planner.sizing import PERSISTENT, DeviceSizer
from rollplex.planner.transfers import handover_values

MAIN_LANE = 0  # every schedule's first stream: compute, where the step's own state lives


@dataclass(slots=True)
class Lifetime:
    """A record and what it stands for."""

    record: UsageRecord
    value: str
    kind: str  # value kind, or "rollout_weights" / "scratch"
    first_step: int  # plan-wide step index
    last_step: int


def positions(dev: DevicePlan) -> tuple[list[Step], dict[int, int], dict[int, int], int]:
    """(steps in start order, step index -> first position, -> last position, last position).

    Positions are the distinct instants at which any step starts or ends; a value read by
    step c is live over [producer start, c end), so records that share a position really
    coexist in time, across streams too."""
    steps = sorted(dev.steps, key=lambda s: (s.start_s, s.index))
    times = sorted({t for s in steps for t in (s.start_s, s.end_s)})
    at = {t: i for i, t in enumerate(times)}
    end = max(0, len(times) - 2)
    begin: dict[int, int] = {}
    until: dict[int, int] = {}
    for s in steps:
        b = begin[s.index] = min(at[s.start_s], end)
        until[s.index] = max(b, at[s.end_s] - 1)
    return steps, begin, until, end


def trained_weights(graph: Graph) -> set[str]:
    """The weights values an optimizer step updates; every other weights value is frozen."""
    return {op.inputs["weights"] for op in graph.ops.values() if op.kind == "optimizer_step"}


def device_lifetimes(
    graph: Graph, dev: DevicePlan, sizer: DeviceSizer, rollout_tp_copy: bool
) -> list[Lifetime]:
    """Every tensor the device group holds over one step, as lifetimes."""
    trained = trained_weights(graph)
    steps, begin, until, end = positions(dev)

    syncs = [s for s in steps if s.kind == "weight_sync"]
    made: dict[str, list[Step]] = {}  # value -> the steps that write it, in start order
    used: dict[str, list[Step]] = {}  # value -> the steps that read it
    ops = graph.ops
    for s in steps:
        op = ops.get(s.op)
        if op is None or s.kind == "transfer":
            continue
        for table, names in ((made, op.outputs), (used, op.inputs)):
            for v in names.values():
                if v in table:
                    table[v].append(s)
                else:
                    table[v] = [s]
    for value, readers in _held_to_backward(graph, used).items():
        used[value] = used[value] + readers
    out: list[Lifetime] = []
    no_steps: list[Step] = []
    engine_sleeps = _engine_sleeps(graph, steps, syncs, dev)
    held = weights_layout(graph) in HELD_LAYOUTS  # the FSDP2 rollouts never drop theirs
    handover = _Handover(dev, until) if len({s.stream for s in steps}) > 1 else None
    for name in dict.fromkeys([*made, *used]):
        v = graph.values[name]
        producers, consumers = made.get(name, no_steps), used.get(name, no_steps)
        persistent = v.kind in PERSISTENT
        if persistent and producers:
            continue  # optimizer outputs update the same storage in place
        if consumers and not producers and all(s.previous_step for s in consumers):
            continue  # lands in a buffer counted where it is used
        if v.kind is ValueKind.WEIGHTS and dev.name == "rollout":
            # A rollout pool holds only its TP copy; the weight sync writes into it.
            if any(s.phase == Phase.ROLLOUT.value for s in consumers):
                out.append(
                    _life(
                        f"{name}@rollout",
                        "rollout_weights",
                        math.ceil(v.nbytes / dev.tp),
                        0,
                        end,
                        0,
                        steps[0],
                        steps[-1],
                    )
                )
            continue
        if persistent:
            first, last = 0, end
            first_step, last_step = steps[0], steps[-1]
        else:
            # Steps are listed in start order, and positions rise with it: the first step
            # holds the first position.
            # It lives until its last reader ends, and never before its last writer does:
            # a segmented op writes it in every segment, read or not.
            first_step = (producers or consumers)[0]
            first = begin[first_step.index]
            touching = consumers if consumers and len(producers) < 2 else producers + consumers
            if len(touching) == 1:
                last_step = touching[0]
                last = until[last_step.index]
            else:
                last = max(until[s.index] for s in touching)
                last_step = max(touching, key=_end_s)
            if _workspace_held(graph, name, producers):
                first, last = 0, end
                first_step, last_step = steps[0], steps[-1]
        phase = _PHASES[producers[0].phase] if producers else None
        size = sizer.value_bytes(v, phase)
        lane = producers[0].stream if producers else 0
        if handover is not None and producers and consumers:
            lane, first = handover.lane(producers[0], consumers, lane, first)
        out.append(_life(name, _KINDS[v.kind], size, first, last, lane, first_step, last_step))
        if v.kind is ValueKind.WEIGHTS and rollout_tp_copy:
            drops = not held and (name in trained if engine_sleeps is None else engine_sleeps)
            size = sizer.rollout_copy_bytes(v)
            out += _rollout_copy(v, size, consumers, until, begin, end, steps, syncs, dev, drops)
    pooled: set[str] = set()  # ops whose pool is held (a segmented decode's, once)
    for s in steps:
        scratch, i = s.scratch_bytes, s.index
        if s.pool_bytes and not engine_sleeps:
            # An engine that cannot sleep holds its KV pool all step.
            if s.op not in pooled:
                pooled.add(s.op)
                name = f"{s.name}.kv_pool"
                pool = s.pool_bytes
                out.append(_life(name, "engine_kv", pool, 0, end, s.stream, steps[0], steps[-1]))
            scratch -= s.pool_bytes
        if scratch:
            name = f"{s.name}.scratch"
            out.append(_life(name, "scratch", scratch, begin[i], until[i], s.stream, s, s))
    return out


def _held_to_backward(graph: Graph, used: dict[str, list[Step]]) -> dict[str, list[Step]]:
    """The prefix K/V a training forward with grad reads, and the backward steps that hold
    them: a response micro-batch's graph keeps its prefix rows' K/V (it attends to them)
    until its backward, and recompute and fused modes run that forward again there. A
    decode-once `attach_response` keeps no `saved` (the backward reads the decode's `kept`),
    but its replayed layers attend to the same K/V in that backward."""
    out: dict[str, list[Step]] = {}
    for op in graph.ops.values():
        kv, saved = op.inputs.get("kv"), op.outputs.get("saved")
        if op.kind == "attach_response":
            saved = op.inputs.get("kept")
        if op.phase is Phase.TRAIN and kv in used and saved in used:
            backward = [s for s in used[saved] if s.kind == "backward"]
            if backward:
                out.setdefault(kv, []).extend(backward)
    return out


def hold_for_handover(
    graph: Graph, dev: DevicePlan, steps: dict[int, Step], transfers, lives: list[Lifetime]
) -> list[Lifetime]:
    """The rollout's outputs that the hand-over moves to the trainers (a transfer step of
    the training pool): in the rollout pool they live until that step, which its ranks
    issue after all of their own; in the training pool from that step, where they arrive,
    not only from their first reader. `steps`: every step of the plan by index;
    `transfers`: the plan's Transfer records."""
    hand = [t.step for t in transfers if t.what == "rollout outputs"]
    if not hand or not lives:
        return lives
    at = steps[hand[0]]
    sent = set(handover_values(graph))
    if any(s.index == at.index for s in dev.steps):  # the receiving pool
        _, begin, _, _ = positions(dev)
        arrive = begin[at.index]
        return [
            _arrives(lf, arrive, at.index) if lf.value in sent and lf.record.first > arrive else lf
            for lf in lives
        ]
    end = max(lf.record.last for lf in lives)
    return [
        Lifetime(replace(lf.record, last=end), lf.value, lf.kind, lf.first_step, at.index)
        if lf.value in sent
        else lf
        for lf in lives
    ]


def _arrives(lf: Lifetime, first: int, step: int) -> Lifetime:
    return Lifetime(replace(lf.record, first=first), lf.value, lf.kind, step, lf.last_step)


def _engine_sleeps(graph: Graph, steps: list[Step], syncs: list[Step], dev: DevicePlan):
    """None without an engine-held rollout (a `generate` op); else whether it sleeps
    between rollouts: it can drop weights and KV (level 2) and a weight sync in this
    group rebuilds them. Its copies then all come and go together (vLLM frees every
    weight it holds, frozen ones too); a rollout pool of its own never needs to."""
    gens = [graph.ops[s.op] for s in steps if s.kind == "generate" and s.op in graph.ops]
    if not gens:
        return None
    return dev.name != "rollout" and bool(syncs) and engine_can_sleep(gens[0])


class _Handover:
    """Where a value made on a side stream and read only on the main one lives.

    Arenas are per stream lane so that reusing bytes never needs an event the plan lacks.
    A value that one stream hands to another (a prefix boundary made in the decode window
    and read by the backward) would hold bytes in the side arena long after the window,
    on top of that arena's own peak: the main arena's peak (the backward) and the side
    one's add although the tensors are never live together. It lives in the main arena
    instead (lane 0: where the long-lived state lives), reserved from the end
    of the last reader-stream step that its maker is ordered after (stream order and
    events): any bytes it reuses there were freed before it can be written."""

    __slots__ = ("_before", "_dev", "_pos", "_until")

    def __init__(self, dev: DevicePlan, until: dict[int, int]) -> None:
        self._dev, self._until = dev, until
        self._before: dict[int, dict[int, int]] | None = None
        self._pos = {i: k for st in dev.streams for k, i in enumerate(st.steps)}

    def lane(self, maker: Step, readers: list[Step], lane: int, first: int) -> tuple[int, int]:
        target = readers[0].stream
        if target != MAIN_LANE or target == lane or any(r.stream != target for r in readers):
            return lane, first
        last = self._ordered_before(maker).get(target)
        return target, 0 if last is None else min(first, self._until[last] + 1)

    def _ordered_before(self, step: Step) -> dict[int, int]:
        """stream -> the latest step of that stream that `step` is ordered after."""
        if self._before is None:
            self._before = ordered_before(self._dev, self._pos)
        return self._before.get(step.index, {})


_PHASES = {p.value: p for p in Phase}
_KINDS = {k: k.value for k in ValueKind}


def _workspace_held(graph: Graph, name: str, producers: list[Step]) -> bool:
    """Decode once's kept buffer from the torch engine: it lives in the engine's workspace,
    which the engine keeps across steps (its CUDA graphs write into it), so it is held all
    step, through the optimizer's peak, not only from the decode to the backward."""
    for s in producers:
        op = graph.ops.get(s.op)
        if op is not None and op.meta.get("static_kv") and op.outputs.get("kept") == name:
            return True
    return False


def _end_s(step: Step) -> float:
    return step.end_s


def _rollout_copy(
    v: Value,
    size: int,
    consumers: list[Step],
    until: dict[int, int],
    begin: dict[int, int],
    end: int,
    steps: list[Step],
    syncs: list[Step],
    dev: DevicePlan,
    drops: bool,
) -> list[Lifetime]:
    """The TP-layout copy rollout decodes with. If it `drops` (trained weights, or an
    engine that sleeps): live until its last rollout use, then rebuilt by the weight sync
    for the next step. Otherwise (frozen weights): kept."""
    roll = [s for s in consumers if s.phase == Phase.ROLLOUT.value]
    if not roll:
        return []
    if dev.name == "rollout" or not syncs or not drops:
        return [_life(f"{v.name}@rollout", "rollout_weights", size, 0, end, 0, steps[0], steps[-1])]
    last_roll = max(roll, key=lambda s: s.end_s)
    return [
        _life(
            f"{v.name}@rollout",
            "rollout_weights",
            size,
            0,
            until[last_roll.index],
            0,
            steps[0],
            last_roll,
        ),
        _life(
            f"{v.name}@rollout.next",
            "rollout_weights",
            size,
            begin[syncs[0].index],
            end,
            0,
            syncs[0],
            steps[-1],
        ),
    ]


def _life(
    name: str,
    kind: str,
    size: int,
    first: int,
    last: int,
    lane: int,
    first_step: Step,
    last_step: Step,
) -> Lifetime:
    return Lifetime(
        UsageRecord(size=int(size), first=first, last=last, lane=lane, name=name),
        name,
        kind,
        first_step.index,
        last_step.index,
    )
