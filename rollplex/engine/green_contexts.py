"""SM partitions as torch streams: CUDA green contexts, through cuda.bindings (imported only
here, lazily). `make_green_streams` gives each of a plan's partitions its own SMs or says why
it cannot; `PartitionGraph` notes a CUDA graph replayed off the partition it was captured on."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)
_FULL = 1e-6  # fractions summing to 1 within this: the last stream takes the leftover SMs


class PartitionError(ValueError):
    """SM fractions of one device group that no split can honour."""


def check_fractions(fractions: Mapping[str, float]) -> None:
    """Each fraction in (0, 1], together at most 1; the error names the stream(s)."""
    for name, f in fractions.items():
        if not isinstance(f, int | float) or not 0 < f <= 1:  # NaN fails too
            raise PartitionError(
                f"stream '{name}': SM partition {f!r} is not a fraction of the SMs in (0, 1]"
            )
    total = sum(fractions.values())
    if total > 1 + _FULL:
        parts = ", ".join(f"'{n}' {f:.0%}" for n, f in fractions.items())
        raise PartitionError(
            f"SM partitions of one device group sum to {total:.0%} > 100%: {parts}"
        )


def sm_counts(fractions: Mapping[str, float], total: int, granularity: int) -> dict[str, int]:
    """SMs per stream (in `fractions`' order) for a device of `total` SMs split in groups of
    `granularity`: each a multiple of it, rounded to nearest and at least one group, all
    together within the device; with fractions summing to 1 the last one takes the rest
    (50/50 on 132 SMs in groups of 8 is 64 + 68)."""
    check_fractions(fractions)
    if granularity < 1 or total < 1:
        raise PartitionError(
            f"need total >= 1 and granularity >= 1 SMs, got {total}, {granularity}"
        )
    groups, names = total // granularity, list(fractions)
    if len(names) > groups:
        raise PartitionError(
            f"{len(names)} SM partitions ({', '.join(names)}) need {len(names)} groups of "
            f"{granularity} SMs; the device has {total} SMs"
        )
    want = {n: fractions[n] * total / granularity for n in names}
    count = {n: max(1, math.floor(want[n] + 0.5)) for n in names}
    while sum(count.values()) > groups:  # give back a group where rounding added the most
        n = max(
            (k for k in names if count[k] > 1),
            key=lambda k: (count[k] - want[k], names.index(k)),  # ties: the later stream
        )
        count[n] -= 1
    sms = {n: c * granularity for n, c in count.items()}
    if abs(sum(fractions.values()) - 1) <= _FULL:
        sms[names[-1]] = total - sum(sms[n] for n in names[:-1])
    return sms


def default_granularity(major: int) -> int:
    """cuDevSmResourceSplitByCount's documented minimum group: 8 SMs from compute
    capability 9.0, 2 before. Used when the SM resource does not say (cuda-bindings < 13)."""
    return 8 if major >= 9 else 2


@dataclass(slots=True, eq=False)
class GreenStream:
    name: str  # "<device group>:<plan stream>"
    stream: torch.cuda.ExternalStream
    sms: int  # SMs of its green context, as the driver reports them
    total: int  # SMs of the device
    planned: float  # the plan's fraction
    unconfined: list[str] = field(default_factory=list)  # graph replays not confined here
    closed: bool = False  # its executor was closed: graphs captured on it are void

    def describe(self) -> str:
        return (
            f"stream '{self.name}' runs on a green context of {self.sms} of {self.total} SMs "
            f"(planned {self.planned:.0%})"
        )

    def take_notes(self) -> list[str]:
        notes, self.unconfined = self.unconfined, []
        return notes


# cuda_stream handle -> the green stream: what `green_stream` looks up (cheap when empty)
_REGISTRY: dict[int, GreenStream] = {}


def green_stream(stream: torch.cuda.Stream | None = None) -> GreenStream | None:
    """The green stream `stream` (default: the current one) is, or None."""
    if not _REGISTRY:
        return None
    s = torch.cuda.current_stream() if stream is None else stream
    return _REGISTRY.get(s.cuda_stream)


class PartitionGraph(torch.cuda.CUDAGraph):
    """A CUDA graph that knows the green stream it was captured on (None: none), and notes
    a replay on a green stream it was not captured on: its kernels are not confined there
    (they run on the whole GPU), which the executor reports as a deviation. A graph
    captured on a green stream is void once its executor is closed: replaying it raises."""

    captured_on: GreenStream | None = None

    def replay(self) -> None:
        if self.captured_on is not None and self.captured_on.closed:
            raise RuntimeError(
                f"this CUDA graph was captured on stream '{self.captured_on.name}', whose green "
                "context was retired (its executor was closed): capture it again"
            )
        if _REGISTRY:
            here = green_stream()
            if here is not None and here is not self.captured_on:
                where = "outside any green context" if self.captured_on is None else (
                    f"on stream '{self.captured_on.name}'"
                )  # fmt: skip
                msg = (
                    f"a CUDA graph replayed on stream '{here.name}' was captured {where}: "
                    f"its kernels are not confined to the stream's {here.sms} SMs"
                )
                if msg not in here.unconfined:
                    here.unconfined.append(msg)
        super().replay()


class _Refused(Exception):
    """Why green contexts cannot be made here (becomes the deviation's reason)."""


_RETIRED: list[Any] = []  # closed contexts' driver objects: alive until the process exits


class GreenContexts:
    """One device group's green contexts and their streams, alive until `close`."""

    def __init__(self, driver: Any, device: torch.device) -> None:
        self.driver, self.device = driver, device
        self.streams: dict[str, GreenStream] = {}
        self._handles: list[Any] = []  # CUstream
        self._greens: list[Any] = []  # CUgreenCtx

    def close(self) -> None:
        """Wait for their work and retire the streams: graphs captured on them refuse to
        replay from now on. The driver objects are not destroyed but kept until the process
        exits: tensors used on a green stream may outlive the executor, and the caching
        allocator records an event on each stream a block was used on when the block is
        freed; on a destroyed stream that aborts the process (cudaErrorInvalidResourceHandle,
        seen on the H200 at interpreter exit after a close)."""
        for s in self.streams.values():
            _REGISTRY.pop(s.stream.cuda_stream, None)
            s.stream.synchronize()  # a device sync covers the primary context only
            s.closed = True
        _RETIRED.extend([*self._handles, *self._greens, *self.streams.values()])
        self._handles, self._greens, self.streams = [], [], {}


def _call(driver: Any, name: str, *args: Any) -> Any:
    fn = getattr(driver, name, None)
    if fn is None:
        raise _Refused(f"cuda.bindings has no {name} (green contexts need CUDA 12.4+)")
    err, *out = fn(*args)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, text = driver.cuGetErrorName(err)
        raise _Refused(f"{name} failed: {text.decode() if isinstance(text, bytes) else err}")
    return out[0] if len(out) == 1 else out


def _granularity(sm: Any, major: int) -> int:
    sizes = [int(getattr(sm, a, 0) or 0) for a in ("minSmPartitionSize", "smCoscheduledAlignment")]
    sizes = [s for s in sizes if s > 0]
    return math.lcm(*sizes) if sizes else default_granularity(major)


def make_green_streams(device: torch.device, fractions: Mapping[str, float]) -> GreenContexts | str:
    """Green streams for one device group's partitions (`fractions`: stream name ->
    fraction), or the reason they cannot be made (no cuda.bindings, a driver without green
    contexts, a split or a context refused: the runtime then runs plain streams and reports
    it). Invalid fractions raise.

    The device's SMs are split once (`cuDevSmResourceSplitByCount`, groups of the
    granularity) and each partition gets a union of those groups, so no two partitions share
    an SM (splitting again per partition would let them overlap); each gets a green context
    (`cuDevResourceGenerateDesc` -> `cuGreenCtxCreate`) and a stream in it
    (`cuGreenCtxStreamCreate`), wrapped as `torch.cuda.ExternalStream`."""
    check_fractions(fractions)  # a plan defect; everything after is this machine's answer
    try:
        from cuda.bindings import driver
    except ImportError as e:
        return f"cuda.bindings is not importable ({e})"
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    made = GreenContexts(driver, torch.device("cuda", index))
    try:
        _make(driver, made, index, fractions)
    except _Refused as e:
        made.close()
        return str(e)
    except Exception as e:  # torch on a green stream, or bindings not shaped as expected:
        made.close()  # the run goes on with plain streams, and says why
        return f"setting up green contexts failed: {type(e).__name__}: {e}"
    for s in made.streams.values():
        _REGISTRY[s.stream.cuda_stream] = s
        log.debug("green contexts: %s", s.describe())  # the executor reports it at info
    return made


def _make(driver: Any, made: GreenContexts, index: int, fractions: Mapping[str, float]) -> None:
    torch.cuda.init()  # the primary context exists first, as cuGreenCtxCreate advises
    _call(driver, "cuInit", 0)
    dev = _call(driver, "cuDeviceGet", index)
    sm_type = driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
    whole = _call(driver, "cuDeviceGetDevResource", dev, sm_type)
    total = int(whole.sm.smCount)
    size = _granularity(whole.sm, torch.cuda.get_device_capability(index)[0])
    groups, n, rest = _call(driver, "cuDevSmResourceSplitByCount", total // size, whole, 0, size)
    groups, n = list(groups)[: int(n)], int(n)
    if n == 0:
        raise _Refused(f"cuDevSmResourceSplitByCount made no group of {size} of {total} SMs")
    size = int(groups[0].sm.smCount)  # the driver may round the group up
    try:
        want = sm_counts(fractions, total, size)
    except PartitionError as e:
        raise _Refused(str(e)) from e
    names, at = list(fractions), 0
    full = abs(sum(fractions.values()) - 1) <= _FULL
    need = {k: c // size for k, c in want.items()}
    if full:  # the last takes whatever is left: the driver may make fewer, larger-rest groups
        need[names[-1]] = 1
    if sum(need.values()) > n:
        raise _Refused(f"the split made {n} groups of {size} SMs; the partitions need {need}")
    for i, name in enumerate(names):
        parts, at = groups[at : at + need[name]], at + need[name]
        if full and i == len(names) - 1:  # the groups nobody took, and what fills no group
            parts, at = parts + groups[at:], n
            parts += [rest] if int(rest.sm.smCount) > 0 else []
        desc = _call(driver, "cuDevResourceGenerateDesc", parts, len(parts))
        flags = driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        green = _call(driver, "cuGreenCtxCreate", desc, dev, flags)
        made._greens.append(green)
        sms = int(_call(driver, "cuGreenCtxGetDevResource", green, sm_type).sm.smCount)
        handle = _call(
            driver, "cuGreenCtxStreamCreate", green, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0
        )
        made._handles.append(handle)
        stream = torch.cuda.ExternalStream(int(handle), device=made.device)
        made.streams[name] = GreenStream(name, stream, sms, total, fractions[name])
        _probe(stream, made.device)


def _probe(stream: torch.cuda.Stream, device: torch.device) -> None:
    """A kernel on the green stream and events across it and the current stream, which the
    executor's waits and timings need: a failure here falls back to plain streams."""
    current = torch.cuda.current_stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        x = torch.ones(8, device=device)
        x.add_(1)
    current.wait_stream(stream)
    if x.sum().item() != 16:
        raise _Refused("a kernel on a green context stream computed a wrong result")
