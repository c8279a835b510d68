"""PlanBuilder: append steps to streams; events appear exactly where a dependency crosses
streams (or device groups). Same-stream order needs no event: a stream runs in order."""

from __future__ import annotations

from weakref import WeakKeyDictionary

from rollplex.graph.ir import Graph, Op, ValueKind
from rollplex.planner.plan import CoRun, DevicePlan, Event, Plan, Step, StreamPlan


class PlanBuilder:
    def __init__(self, schedule: str, graph: Graph, graph_hash: str) -> None:
        self.graph = graph
        self.plan = Plan(schedule=schedule, graph_hash=graph_hash, devices=[])
        self._steps_of: dict[str, list[Step]] = {}
        self._where: dict[int, tuple[str, int]] = {}
        self._event_of: dict[int, int] = {}
        self._made: dict | None = None  # the producer index `_fact_of` belongs to
        self._fact_of: dict[str, tuple[list[str], str | None]] = {}

    def device(self, name: str, ranks: list[int], tp: int = 1, dp: int = 1) -> DevicePlan:
        dev = DevicePlan(name=name, ranks=list(ranks), tp=tp, dp=dp)
        self.plan.devices.append(dev)
        return dev

    def stream(self, dev: DevicePlan, name: str, partition: float | None = None) -> int:
        sid = len(dev.streams)
        dev.streams.append(StreamPlan(sid, name, partition=partition))
        return sid

    def steps_of(self, op: str) -> list[Step]:
        return self._steps_of.get(op, [])

    def add(
        self,
        dev: DevicePlan,
        stream: int,
        op: Op,
        solo_s: float,
        rate_class: str,
        chunk: int = 0,
        chunks: int = 1,
        after: list[Step] | None = None,
        corun: CoRun = CoRun.NONE,
        op_name: str | None = None,
        previous_step: bool = False,
        scratch_bytes: float = 0,
    ) -> Step:
        """Append one step; it waits for every step of its inputs' producers, plus `after`.
        `previous_step`: it carries the previous step's result, so has no producer here."""
        steps_of, where = self._steps_of, self._where
        sources, version = self._facts(op)
        here = (dev.name, stream)
        waits: list[int] = []
        if not previous_step:
            for src in sources:
                made = steps_of.get(src)
                if not made:
                    raise RuntimeError(f"step for '{op.name}' issued before its producer '{src}'")
                for d in made:  # an event only where a dependency crosses streams
                    if where[d.index] != here:
                        ev = self._event(d)
                        if ev not in waits:
                            waits.append(ev)
        if after:
            for d in after:
                if where[d.index] != here:
                    ev = self._event(d)
                    if ev not in waits:
                        waits.append(ev)
        index = len(where)
        name = op_name or op.name
        # positional, in Step's field order (keywords cost half again per step)
        step = Step(
            index,
            name,
            op.kind,
            str(op.phase),
            stream,
            chunk,
            chunks,
            solo_s,
            0.0,  # start_s
            0.0,  # end_s
            waits,
            None,  # signals
            corun,
            version,  # weights_version
            rate_class,
            int(scratch_bytes),
            previous_step,
        )
        dev.steps.append(step)
        dev.streams[stream].steps.append(index)
        where[index] = here
        if name in steps_of:
            steps_of[name].append(step)
        else:
            steps_of[name] = [step]
        return step

    def _facts(self, op: Op) -> tuple[list[str], str | None]:
        """`op_facts`, through this builder's handle on the per-graph cache (a weak-key
        lookup per add cost a fifth of a plan attempt)."""
        made = self.graph.producers()
        if made is not self._made:
            self._made, self._fact_of = made, _facts_of(self.graph)
        facts = self._fact_of.get(op.name)
        if facts is None or self.graph.ops.get(op.name) is not op:
            return op_facts(self.graph, op)
        return facts

    def _event(self, step: Step) -> int:
        if step.index not in self._event_of:
            dev, stream = self._where[step.index]
            ev = Event(len(self.plan.events), step.index, dev, stream)
            self.plan.events.append(ev)
            self._event_of[step.index] = ev.id
            step.signals = ev.id
        return self._event_of[step.index]


# Per graph (while its producer index stands): op name -> (names of the ops making its
# inputs, in port order, one entry per input; the weights version it reads). A plan
# attempt adds every op once, and a search adds them once per attempt.
_FACTS: WeakKeyDictionary[Graph, tuple[dict, dict[str, tuple[list[str], str | None]]]] = (
    WeakKeyDictionary()
)


def _facts_of(graph: Graph) -> dict[str, tuple[list[str], str | None]]:
    made = graph.producers()
    cached = _FACTS.get(graph)
    if cached is None or cached[0] is not made:
        cached = (made, {})
        _FACTS[graph] = cached
    return cached[1]


def op_facts(graph: Graph, op: Op) -> tuple[list[str], str | None]:
    made, cache = graph.producers(), _facts_of(graph)
    facts = cache.get(op.name)
    if facts is None or graph.ops.get(op.name) is not op:
        sources = [src.name for v in op.inputs.values() if (src := made.get(v)) is not None]
        facts = (sources, _weights_version(graph, op))
        if graph.ops.get(op.name) is op:
            cache[op.name] = facts
    return facts


def _weights_version(graph: Graph, op: Op) -> str | None:
    """The version of the first weights `op` reads (what `Graph.weights_read` lists first)."""
    for v in op.inputs.values():
        value = graph.values[v]
        if value.kind is ValueKind.WEIGHTS:
            return value.version
    return None
