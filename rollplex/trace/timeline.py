"""Backend-neutral timeline: what ran (or is planned to run) where and when, plus memory.

The planner's predictions and the runtime's measurements are both expressed as a `Timeline`,
so every exporter and the planned-vs-measured diff take one type. Times are microseconds on
an arbitrary but shared origin (planned timelines usually start at 0). No torch here: the
planner and the simulator build timelines on machines without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(slots=True)
class Span:
    """One op on one stream of one device.

    `cat` is the trace category: "kernel", "gpu_memcpy" or "gpu_memset" for device work;
    anything else (e.g. "cpu_op") is host-only work drawn on the stream's host lane.
    """

    device: int
    stream: int
    name: str
    start_us: float
    dur_us: float
    cat: str = "kernel"
    phase: str = ""  # rollout / reference / train …; shown in the event's args
    args: dict = field(default_factory=dict)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(slots=True)
class MemoryEvent:
    """One allocation (delta_bytes > 0) or free (< 0) on a device, with the totals after it."""

    device: int
    t_us: float
    addr: int
    delta_bytes: int
    total_allocated: int
    total_reserved: int
    name: str = ""  # the op that allocated; links the event to that op in the Memory view


@dataclass(slots=True)
class Mark:
    """An instant on a stream: something worth seeing at that point, e.g. where the runtime
    did not follow the plan, and why (`text`)."""

    device: int
    stream: int
    t_us: float
    name: str
    text: str = ""


@dataclass(slots=True)
class Timeline:
    """Spans, memory events and step boundaries of one planned or measured run."""

    label: str
    spans: list[Span]
    memory: list[MemoryEvent]
    steps: list[tuple[float, float]]  # (start_us, end_us) per RL step
    stream_names: dict[tuple[int, int], str]  # (device, stream) -> "decode", "prefix", …
    device_name: str = ""
    device_memory_bytes: int = 0
    marks: list[Mark] = field(default_factory=list)
    on_cpu: bool = False  # measured on the host: lanes and memory say CPU, not GPU
    first_step: int = 0  # number of the first RL step: ProfilerStep#<first_step + k>

    def devices(self) -> list[int]:
        """Devices that have any span or memory event, ascending."""
        return sorted({s.device for s in self.spans} | {m.device for m in self.memory})

    def end_us(self) -> float:
        """Latest time of any span end, memory event or step end (0.0 when empty)."""
        ends = [s.end_us for s in self.spans]
        ends += [m.t_us for m in self.memory]
        ends += [end for _, end in self.steps]
        ends += [m.t_us for m in self.marks]
        return max(ends, default=0.0)

    def shifted(self, dt: float) -> Timeline:
        """A copy with every time moved by `dt` microseconds (e.g. to align two timelines)."""
        return replace(
            self,
            spans=[replace(s, start_us=s.start_us + dt, args=dict(s.args)) for s in self.spans],
            memory=[replace(m, t_us=m.t_us + dt) for m in self.memory],
            steps=[(a + dt, b + dt) for a, b in self.steps],
            stream_names=dict(self.stream_names),
            marks=[replace(m, t_us=m.t_us + dt) for m in self.marks],
        )
