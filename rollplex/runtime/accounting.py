"""What the executor observes of each step besides its op: memory events of the values it
holds, and the weights versions it read against the plan's promise."""

from __future__ import annotations

from rollplex.graph.ir import version_model
from rollplex.runtime.memory import AllocatorFeed, Env
from rollplex.runtime.record import MeasuredStep
from rollplex.trace.timeline import MemoryEvent


class ExecutionError(RuntimeError):
    """The plan and what the backend holds disagree (a value missing, a stale version)."""


OUTSIDE_STEPS = "(outside plan steps)"  # owner of a peak reached between RL steps


class MemoryLedger:
    """Per device group, the resident bytes last reported for each value, and a stable
    fake address per value for the trace's memory events.

    What a value holds is reported when it changes, across RL steps: what is resident
    before a step (weights, optimizer state) is reported at the step's start under the
    value's own name (`resident`), never charged to the step's first op, and the curve
    never falls back to 0 between steps. The totals are the allocator's (`feed`, CUDA)
    or, on CPU, the sum of what the values hold. Where the allocator peaked above every
    total shown so far in the RL step (workspace, activations no value holds), an op's
    events end with a transient allocation up to that peak and its release, so each
    step's curve peaks at the allocator's `max_memory_allocated` over that step."""

    TRANSIENT = "(transient)"  # name suffix of the peak's allocation inside an op

    def __init__(self, devices: int, feed: AllocatorFeed | None = None) -> None:
        self.attributed: dict[int, dict[str, int]] = {i: {} for i in range(devices)}
        self._addr: dict[str, int] = {}
        self.feed = feed
        self.shown_peak: dict[int, int] = dict.fromkeys(range(devices), 0)

    def resident(self, env: Env, owned: set[str], dev: int, t: float) -> list[MemoryEvent]:
        """At an RL step's start: what the values hold before any op, each event named
        for its value (the plan value that owns the bytes); then a peak the allocator
        reached outside every plan step (loading, a held-out evaluation), named so. Then
        the allocator's window opens on this step: its ops' transients rise to the step's
        own peak, so the curve of any steps shown peaks where the allocator did in them."""
        events = self._changes(env.attribution(owned), dev, t, None)
        events += self._peak(dev, t, OUTSIDE_STEPS)
        if self.feed is not None:
            self.feed.new_window()
            self.shown_peak[dev] = self.feed.allocated()
        return events

    def step_peak(self) -> int | None:
        """The allocator's peak in the current RL step (None without an allocator)."""
        return None if self.feed is None else self.feed.max_allocated()

    def run_peak(self) -> int | None:
        """The allocator's peak since the ledger's first step (None without an allocator)."""
        return None if self.feed is None else self.feed.run_peak()

    def events(self, now: dict[str, int], dev: int, t: float, name: str) -> list[MemoryEvent]:
        """Events (named `name`, the op) for every value whose resident bytes changed
        since the last call (`now`: `Env.attribution`, which the caller also sums), then
        the allocator's peak if it rose above what was shown."""
        return self._changes(now, dev, t, name) + self._peak(dev, t, name)

    def _totals(self, dev: int) -> tuple[int, int]:
        if self.feed is None:
            total = sum(self.attributed[dev].values())
            return total, total
        return self.feed.allocated(), self.feed.reserved()

    def _changes(
        self, now: dict[str, int], dev: int, t: float, name: str | None
    ) -> list[MemoryEvent]:
        attributed = self.attributed[dev]
        changed = []
        for value in dict.fromkeys([*attributed, *now]):
            delta = now.get(value, 0) - attributed.get(value, 0)
            if delta:
                attributed[value] = now.get(value, 0)
                changed.append((value, delta))
        allocated, reserved = self._totals(dev)
        events = []
        for value, delta in changed:
            addr = self._addr.setdefault(value, (len(self._addr) + 1) << 24)
            events.append(
                MemoryEvent(dev, t * 1e6, addr, delta, allocated, reserved, name or value)
            )
        if events:
            self.shown_peak[dev] = max(self.shown_peak[dev], allocated)
        return events

    def _peak(self, dev: int, t: float, name: str) -> list[MemoryEvent]:
        if self.feed is None:
            return []
        peak, shown = self.feed.max_allocated(), self.shown_peak[dev]
        if peak <= shown:
            return []
        allocated, reserved = self._totals(dev)
        self.shown_peak[dev] = peak
        extra = peak - allocated
        addr = self._addr.setdefault(f"{name}{self.TRANSIENT}", (len(self._addr) + 1) << 24)
        return [
            MemoryEvent(dev, t * 1e6, addr, extra, peak, max(reserved, peak), name),
            MemoryEvent(dev, t * 1e6, addr, -extra, allocated, reserved, name),
        ]


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
