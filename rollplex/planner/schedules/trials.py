"""Trial plans for the rollplex search: built from steps shared between trials.

A trial is only replayed and scored, so it is patched from the plan without overlap: steps
that wait on nothing off the compute stream are shared objects, the chosen ops and their
readers get steps of their own. Its replay equals, bit for bit, that of `_build`'s plan;
the winner is built again with `PlanBuilder`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from rollplex.graph.ir import Op
from rollplex.planner.cost_model import Timing
from rollplex.planner.placement import op_facts
from rollplex.planner.plan import CoRun, DevicePlan, Event, Plan, Step, StreamPlan
from rollplex.planner.schedules.common import CachedTimer, PlanningContext, packed_order

# _window's pieces (rollplex.py): (op, stream, solo_s, rate_class, chunk, chunks, corun, scratch,
# waits on the decode's first segment)
Piece = tuple[Op, int, float, str, int, int, CoRun, float, bool]


class _MissingProducer(Exception):
    """A step's producer is not placed yet: the full build raises the real error."""


class TrialPlans:
    def __init__(
        self,
        ctx: PlanningContext,
        timer: CachedTimer,
        order: list[Op],
        decode: Op,
        window: Callable[[dict[str, CoRun]], list[Piece]],
    ) -> None:
        self.ctx, self.timer, self.order, self.decode = ctx, timer, order, decode
        self.window = window  # the decode window's steps, in issue order, for a choice
        self._ops = {op.name: op for op in order}
        self._pos = {op.name: float(i) for i, op in enumerate(order)}
        self._sources = {op.name: op_facts(ctx.graph, op) for op in order}
        self._readers: dict[str, list[str]] = {}
        for op in order:
            for src in set(self._sources[op.name][0]):
                self._readers.setdefault(src, []).append(op.name)
        order0, self._packed0 = packed_order(ctx, order)
        # the base compute sequence: ops keyed by position, a packed response at its
        # prefix's position + 0.5 (right after it), every step its shared variant
        self._key0 = dict(self._pos)
        for name, resp in self._packed0.items():
            self._key0[resp.name] = self._pos[name] + 0.5
        self._partner = {n: r.name for n, r in self._packed0.items()}
        self._partner.update({r.name: n for n, r in self._packed0.items()})
        self._shared: dict[tuple[str, bool], Step] = {}  # (op, packed) -> its step
        base = [op.name for op in order0 if op is not decode]
        self._keys0 = [self._key0[n] for n in base]
        self._steps0 = [self._shared_step(n, n in self._partner) for n in base]

    def plan(self, choice: dict[str, CoRun]) -> Plan | None:
        """A plan that replays like `_build(choice)`'s, or None where only the full
        build can say what happens (it raises: a step issued before its producer)."""
        try:
            return self._plan(choice)
        except _MissingProducer:
            return None

    def _timing(self, name: str, packed: bool) -> Timing:
        op = self._ops[name]
        if not packed:
            return self.timer(op)
        partner = self._ops[self._partner[name]]
        if name in self._packed0:
            return self.timer.packed(op, partner)[0]
        return self.timer.packed(partner, op)[1]

    def _shared_step(self, name: str, packed: bool) -> Step:
        step = self._shared.get((name, packed))
        if step is None:
            step = self._shared[(name, packed)] = self._step(name, packed)
        return step

    def _step(self, name: str, packed: bool) -> Step:
        op, t = self._ops[name], self._timing(name, packed)
        # positional, in Step's field order (keywords cost half again per step)
        return Step(
            int(self._pos[name]),
            name,
            op.kind,
            str(op.phase),
            0,  # stream: compute
            0,  # chunk
            1,  # chunks
            t.seconds,
            0.0,  # start_s
            0.0,  # end_s
            [],  # waits
            None,  # signals
            CoRun.NONE,
            self._sources[name][1],  # weights_version
            t.rate_class,
            int(t.scratch_bytes),
            False,  # previous_step
        )

    def _plan(self, choice: dict[str, CoRun]) -> Plan:
        ctx, timer, decode = self.ctx, self.timer, self.decode
        n = ctx.hardware.num_gpus
        plan = Plan(schedule="rollplex", graph_hash=ctx.graph_hash, devices=[])
        dev = DevicePlan("colocated", list(range(n)), tp=timer.rollout.tp, dp=timer.rollout.dp)
        plan.devices.append(dev)
        partitioned = CoRun.PARTITION in choice.values()
        f = ctx.schedule.decode_sm_fraction
        dev.streams = [
            StreamPlan(0, "compute"),
            StreamPlan(1, "copy"),
            StreamPlan(2, "decode", partition=f if partitioned else None),
            StreamPlan(3, "prefix", partition=(1 - f) if partitioned else None),
        ]
        pos, key0, partner = self._pos, self._key0, self._partner
        keys, steps = self._keys0[:], self._steps0[:]

        def at(key: float) -> int:
            i = bisect_left(keys, key)
            if i == len(keys) or keys[i] != key:
                raise RuntimeError(f"trial plan lost track of the op at position {key}")
            return i

        # the pairs the choice breaks: each part alone, the response back at its position
        broken = {m for c in choice if c in partner for m in (c, partner[c])}
        key = dict.fromkeys(broken)
        for name in sorted(choice.keys() | broken, key=key0.__getitem__):
            i = at(key0[name])
            del keys[i], steps[i]
        for name in broken - choice.keys():
            key[name] = pos[name]
            i = bisect_left(keys, pos[name])
            keys.insert(i, pos[name])
            steps.insert(i, self._shared_step(name, False))

        def key_of(name: str) -> float:
            k = key.get(name)
            return key0[name] if k is None else k

        def packed(name: str) -> bool:
            return name in partner and name not in broken

        off = set(choice)  # ops placed off the compute stream
        off.add(decode.name)
        at_decode = key0[decode.name]
        placed: dict[str, list[Step]] = {}  # window op -> its steps
        event_of: dict[int, int] = {}  # step index -> event id

        def event(d: Step) -> int:
            ev = event_of.get(d.index)
            if ev is None:
                ev = event_of[d.index] = len(plan.events)
                plan.events.append(Event(ev, d.index, dev.name, d.stream))
            return ev

        # the window, issued at the decode's place: its producers must be placed by then
        window: list[Step] = []
        first: list[Step] = []
        fresh = len(self.order)  # indices past every compute step's
        for o, stream, solo, rate, chunk, chunks, corun, scratch, after in self.window(choice):
            srcs, version = self._sources[o.name]
            waits: list[int] = []
            for src in srcs:
                made = placed.get(src)
                if made is None:
                    if src in off or key_of(src) > at_decode:
                        raise _MissingProducer(src)
                    made = [self._shared_step(src, packed(src))]
                waits.extend(event(d) for d in made if d.stream != stream)
            if after:
                waits.extend(event(d) for d in first if d.stream != stream)
            s = Step(
                fresh,
                o.name,
                o.kind,
                str(o.phase),
                stream,
                chunk,
                chunks,
                solo,
                waits=waits,
                rate_class=rate,
                corun=corun,
                weights_version=version,
                scratch_bytes=int(scratch),
            )
            fresh += 1
            window.append(s)
            dev.streams[stream].steps.append(s.index)
            placed.setdefault(o.name, []).append(s)
            if o is decode and not first:
                first = [s]

        # readers of the window: a step of their own that waits on it, after the decode
        readers = {r for w in off for r in self._readers.get(w, ()) if r not in off}
        for name in sorted(readers, key=key_of):
            k = key_of(name)
            if k < at_decode:
                raise _MissingProducer(name)
            s = self._step(name, packed(name))
            s.waits = [event(d) for src in self._sources[name][0] for d in placed.get(src, ())]
            steps[at(k)] = s
        dev.steps = steps + window
        dev.streams[0].steps = [s.index for s in steps]
        return plan
