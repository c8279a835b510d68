"""Issuing plan steps on CUDA streams with CUDA events, and timing them.

One `torch.cuda.Stream` per (device group, plan stream), one event per plan event; tensors a
step reads get `record_stream` so the allocator keeps them while it may still read them. A
stream on an SM partition runs on a green context, or plainly with a reason (`unpartitioned`).
The host blocks only for host reads of device values; times resolve once per RL step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from rollplex.engine.green_contexts import (
    GreenContexts,
    GreenStream,
    check_fractions,
    make_green_streams,
)
from rollplex.planner.plan import Plan, Step
from rollplex.runtime.plan_effects import partition_notes, unpartitioned_streams


class CudaStreams:
    def __init__(self, plan: Plan, device: torch.device) -> None:
        self.device = device
        self.green: dict[str, GreenStream] = {}  # "<group>:<stream>" -> its green stream
        self.unpartitioned: dict[str, str] = {}  # a partitioned stream run plain -> why
        self._contexts: list[GreenContexts] = []
        self._partition(plan)
        self._green_at: dict[tuple[int, int], GreenStream] = {}
        self.streams: dict[tuple[int, int], torch.cuda.Stream] = {}
        for i, d in enumerate(plan.devices):
            for st in d.streams:
                green = self.green.get(f"{d.name}:{st.name}")
                if green is not None:
                    self._green_at[(i, st.stream)] = green
                s = torch.cuda.Stream(device=device) if green is None else green.stream
                self.streams[(i, st.stream)] = s
        self.events = {e.id: torch.cuda.Event() for e in plan.events}
        self._timing: dict[int, tuple[torch.cuda.Event, torch.cuda.Event]] = {}
        self._origin: torch.cuda.Event | None = None
        self._origin_s = 0.0

    def _partition(self, plan: Plan) -> None:
        wanted = [
            {f"{d.name}:{st.name}": st.partition for st in d.streams if st.partition is not None}
            for d in plan.devices
        ]
        for fractions in wanted:
            check_fractions(fractions)  # a plan defect raises before anything runs
        splitting = ""  # the device group whose partitions this process's device holds
        for d, fractions in zip(plan.devices, wanted, strict=True):
            if not fractions:
                continue
            made = (
                f"device group '{splitting}' already splits {self.device} in this process"
                if splitting
                else make_green_streams(self.device, fractions)
            )
            if isinstance(made, str):
                self.unpartitioned.update(dict.fromkeys(fractions, made))
                continue
            splitting = d.name
            self._contexts.append(made)
            self.green.update(made.streams)

    def partition_reports(
        self, plan: Plan, pos: dict[int, int]
    ) -> tuple[list[tuple[int, str]], dict[int, str]]:
        """(deviations: each partitioned stream run plain, at its first issue position and
        why; notes: issue position -> what a green stream got, its SMs)."""
        got = {name: g.describe() for name, g in self.green.items()}
        return unpartitioned_streams(plan, pos, self.unpartitioned), partition_notes(plan, pos, got)

    def take_notes(self, device: int, step: Step) -> list[str]:
        """What ran unconfined on `step`'s green stream since the last call (graphs captured
        elsewhere and replayed there)."""
        green = self._green_at.get((device, step.stream))
        return [] if green is None else green.take_notes()

    def close(self) -> None:
        """Destroy the green contexts (after their work); the plain streams need nothing."""
        for c in self._contexts:
            c.close()
        self._contexts, self.green, self._green_at = [], {}, {}

    def begin(self, origin_s: float) -> None:
        """Mark the RL step's start; times are reported relative to it (+ origin_s)."""
        self._timing.clear()
        self._origin = torch.cuda.Event(enable_timing=True)
        self._origin.record(torch.cuda.current_stream(self.device))
        self._origin_s = origin_s
        # Work issued before this step (previous step, data loading) must be visible.
        for s in self.streams.values():
            s.wait_stream(torch.cuda.current_stream(self.device))

    @contextmanager
    def issue(self, device: int, step: Step, reads: Iterable[torch.Tensor]) -> Iterator[None]:
        s = self.streams[(device, step.stream)]
        for e in step.waits:
            s.wait_event(self.events[e])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            for t in reads:
                if hasattr(t, "to_local"):  # a DTensor (FSDP2): its op dispatch has no
                    t = t.to_local()  # record_stream rule; the local shard is the memory
                if t.is_cuda:
                    t.record_stream(s)
            start.record(s)
            yield
            end.record(s)
        if step.signals is not None:
            self.events[step.signals].record(s)
        self._timing[step.index] = (start, end)

    def finish(self) -> dict[int, tuple[float, float]]:
        """Wait for the step's work; (start_s, end_s) per plan step index."""
        current = torch.cuda.current_stream(self.device)
        for s in self.streams.values():
            current.wait_stream(s)
        torch.cuda.synchronize(self.device)
        assert self._origin is not None
        o = self._origin
        return {
            i: (self._origin_s + o.elapsed_time(a) / 1e3, self._origin_s + o.elapsed_time(b) / 1e3)
            for i, (a, b) in self._timing.items()
        }
