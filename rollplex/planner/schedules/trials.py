"""Trial plans for the rollplex search: built from steps shared between trials.

A rollplex trial moves a few prefix ops into the decode window; every other op keeps its
place on the compute stream. Building each trial with `PlanBuilder` made ~10,000 fresh
steps per trial (most of the search's time at 10k ops). A trial plan here is only
replayed and scored, never returned, so:
- a compute-stream step that waits on nothing off its stream is the same object in every
  trial (one per op and packing), with an index of its own that no trial reuses;
- steps that wait across streams, and the decode window's steps, are made per trial;
- events are listed on the plan only (the shared steps' `signals` stay unset).
The replay of such a plan gives bit for bit the step time of `_build`'s plan: the same
streams, the same steps in the same order with the same solo times and rate classes, and
each step waiting on the same set of steps (event ids and step indices do not enter the
arithmetic). The steps' scratch is the same too, so the unshared-fit bound matches. The
plan that wins is built again with `PlanBuilder`.
"""

from __future__ import annotations

from collections.abc import Callable

from rollplex.graph.ir import Op
from rollplex.planner.cost_model import Timing
from rollplex.planner.placement import op_facts
from rollplex.planner.plan import CoRun, DevicePlan, Event, Plan, Step, StreamPlan
from rollplex.planner.schedules.common import CachedTimer, PlanningContext, packed_order

# _place_decode's pieces: (op, stream, solo_s, rate_class, chunk, chunks, corun, scratch,
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
        self._order0, self._packed0 = packed_order(ctx, order)
        self._index = {op.name: i for i, op in enumerate(order)}
        # compute steps that wait on nothing, one per op as packed / as placed alone
        self._shared_packed: dict[str, Step] = {}
        self._shared_solo: dict[str, Step] = {}
        self._sources = {op.name: op_facts(ctx.graph, op) for op in order}

    def plan(self, choice: dict[str, CoRun]) -> Plan | None:
        """A plan that replays like `_build(choice)`'s, or None where only the full
        build can say what happens (it raises)."""
        try:
            return self._plan(choice)
        except _MissingProducer:
            return None

    def _packed(self, choice: dict[str, CoRun]) -> tuple[list[Op], dict[str, Op]]:
        # packed_order with `apart=choice` drops exactly the pairs that touch the choice
        # (positions come from `order`, which trials share)
        packed = {
            n: r for n, r in self._packed0.items() if n not in choice and r.name not in choice
        }
        if len(packed) == len(self._packed0):
            return self._order0, packed
        if not packed:
            return self.order, packed
        moved = {r.name for r in packed.values()}
        out: list[Op] = []
        for op in self.order:
            if op.name in moved:
                continue
            out.append(op)
            if op.name in packed:
                out.append(packed[op.name])
        return out, packed

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
        order, packed = self._packed(choice)
        timings: dict[str, Timing] = {}
        for name, resp in packed.items():
            timings[name], timings[resp.name] = timer.packed(ctx.graph.ops[name], resp)
        off = set(choice)  # ops placed off the compute stream
        off.add(decode.name)
        comp: dict[str, Step] = {}  # compute-stream op -> its one step
        placed: dict[str, list[Step]] = {}  # window op -> its steps
        event_of: dict[int, int] = {}  # step index -> event id
        compute, steps = dev.streams[0].steps, dev.steps
        fresh = len(self.order)  # indices past every shared step's
        sources, index = self._sources, self._index
        shared_packed, shared_solo = self._shared_packed, self._shared_solo

        def waits_on(srcs: list[str], stream: int, after: list[Step]) -> list[int]:
            waits: list[int] = []
            for src in srcs:
                made = placed.get(src)
                if made is None:
                    one = comp.get(src)
                    if one is None:
                        raise _MissingProducer(src)
                    made = [one]
                for d in made:
                    if d.stream != stream:
                        waits.append(event(d))
            for d in after:
                if d.stream != stream:
                    waits.append(event(d))
            return waits

        def event(d: Step) -> int:
            ev = event_of.get(d.index)
            if ev is None:
                ev = event_of[d.index] = len(plan.events)
                plan.events.append(Event(ev, d.index, dev.name, d.stream))
            return ev

        for op in order:
            name = op.name
            if name in choice:
                continue
            if op is decode:
                first: list[Step] = []
                for piece in self.window(choice):
                    o, stream, solo, rate, chunk, chunks, corun, scratch, after = piece
                    waits = waits_on(sources[o.name][0], stream, first if after else [])
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
                        weights_version=sources[o.name][1],
                        scratch_bytes=int(scratch),
                    )
                    fresh += 1
                    steps.append(s)
                    dev.streams[stream].steps.append(s.index)
                    placed.setdefault(o.name, []).append(s)
                    if o is decode and not first:
                        first = [s]
                continue
            srcs, version = sources[name]
            if not off.isdisjoint(srcs):
                s = self._step(op, index[name], timings, version)
                s.waits = waits_on(srcs, 0, [])
            else:
                # its producers are compute steps placed before it: `order` is
                # topological, and whatever it reads from the window is in `off`
                cache = shared_packed if name in timings else shared_solo
                s = cache.get(name)
                if s is None:
                    s = cache[name] = self._step(op, index[name], timings, version)
            steps.append(s)
            compute.append(s.index)
            comp[name] = s
        return plan

    def _step(self, op: Op, index: int, timings: dict[str, Timing], version: str | None) -> Step:
        t = timings.get(op.name) or self.timer(op)
        return Step(
            index,
            op.name,
            op.kind,
            str(op.phase),
            0,
            solo_s=t.seconds,
            rate_class=t.rate_class,
            weights_version=version,
            scratch_bytes=int(t.scratch_bytes),
        )
