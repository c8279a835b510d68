"""What the executor observes of each step besides its op: memory events of the values it
holds, and the weights versions it read against the plan's promise."""

from __future__ import annotations

from rollplex.graph.ir import version_model
from rollplex.runtime.memory import Env
from rollplex.runtime.record import MeasuredStep
from rollplex.trace.timeline import MemoryEvent


class ExecutionError(RuntimeError):
    """The plan and what the backend holds disagree (a value missing, a stale version)."""


class MemoryLedger:
    """Per device group, the resident bytes last reported for each value, and a stable
    fake address per value for the trace's memory events."""

    def __init__(self, devices: int) -> None:
        self.attributed: dict[int, dict[str, int]] = {i: {} for i in range(devices)}
        self._addr: dict[str, int] = {}

    def reset(self) -> None:
        """A new RL step: every value is reported again from zero."""
        for held in self.attributed.values():
            held.clear()

    def events(self, env: Env, owned: set[str], dev: int, t: float, name: str) -> list[MemoryEvent]:
        """Events for every value whose resident bytes changed since the last call."""
        attributed, now = self.attributed[dev], env.attribution(owned)
        events = []
        for value in dict.fromkeys([*attributed, *now]):
            delta = now.get(value, 0) - attributed.get(value, 0)
            if not delta:
                continue
            attributed[value] = now.get(value, 0)
            addr = self._addr.setdefault(value, (len(self._addr) + 1) << 24)
            total = sum(attributed.values())
            events.append(MemoryEvent(dev, t * 1e6, addr, delta, total, total, name))
        return events


def check_versions(m: MeasuredStep, offsets: dict[str, int]) -> None:
    """The plan's version for a step is relative to the RL step (`policy@0`); what the
    backend read is absolute. Within one RL step the difference must be the same for
    every step reading a model, or some step read weights the plan did not promise. A
    `previous_step` step's version is relative to the previous RL step (the
    disaggregated sync ships its update), so it is one less relative to this one."""
    planned = m.step.weights_version
    if planned is None:
        return
    model, rel = version_model(planned), int(planned.split("@")[1]) - m.step.previous_step
    for read in m.reads.values():
        if version_model(read) != model:
            continue
        off = int(read.split("@")[1]) - rel
        if offsets.setdefault(model, off) != off:
            raise ExecutionError(
                f"'{m.step.name}' read {read} where the plan says {planned} "
                f"(offset {off}, other steps {offsets[model]})"
            )
