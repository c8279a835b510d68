"""PlanBuilder: append steps to streams; events appear exactly where a dependency crosses
streams (or device groups). Same-stream order needs no event: a stream runs in order."""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, ValueKind
from rollplex.planner.plan import CoRun, DevicePlan, Event, Plan, Step, StreamPlan


class PlanBuilder:
    def __init__(self, schedule: str, graph: Graph, graph_hash: str) -> None:
        self.graph = graph
        self.plan = Plan(schedule=schedule, graph_hash=graph_hash, devices=[])
        self._steps_of: dict[str, list[Step]] = {}
        self._where: dict[int, tuple[str, int]] = {}
        self._event_of: dict[int, int] = {}

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
        deps: list[Step] = []
        made, steps_of = self.graph.producers(), self._steps_of
        for v in op.inputs.values():
            src = made.get(v)
            if src is None or previous_step:
                continue
            if not steps_of.get(src.name):
                raise RuntimeError(f"step for '{op.name}' issued before its producer '{src.name}'")
            deps += steps_of[src.name]
        deps += after or []
        step = Step(
            index=len(self._where),
            op=op_name or op.name,
            kind=op.kind,
            phase=str(op.phase),
            stream=stream,
            chunk=chunk,
            chunks=chunks,
            solo_s=solo_s,
            rate_class=rate_class,
            corun=corun,
            weights_version=_weights_version(self.graph, op),
            previous_step=previous_step,
            scratch_bytes=int(scratch_bytes),
        )
        here = (dev.name, stream)
        for d in deps:
            if self._where[d.index] != here:
                ev = self._event(d)
                if ev not in step.waits:
                    step.waits.append(ev)
        dev.steps.append(step)
        dev.streams[stream].steps.append(step.index)
        self._where[step.index] = here
        self._steps_of.setdefault(step.op, []).append(step)
        return step

    def _event(self, step: Step) -> int:
        if step.index not in self._event_of:
            dev, stream = self._where[step.index]
            ev = Event(len(self.plan.events), step.index, dev, stream)
            self.plan.events.append(ev)
            self._event_of[step.index] = ev.id
            step.signals = ev.id
        return self._event_of[step.index]


def _weights_version(graph: Graph, op: Op) -> str | None:
    """The version of the first weights `op` reads (what `Graph.weights_read` lists first)."""
    for v in op.inputs.values():
        value = graph.values[v]
        if value.kind is ValueKind.WEIGHTS:
            return value.version
    return None
