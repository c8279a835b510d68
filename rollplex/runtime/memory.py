"""The executor's environment and its accounting of resident bytes.

Values live in `device` (resident) or `host` (offloaded, or not yet loaded); chunked ops park
partials in a resident carry. Resident bytes are the distinct storages reachable from the
device side, each counted whole and attributed to its first holder, so per-value counts sum
to the total. `AllocatorFeed` is the allocator's own view (CUDA), reported beside it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Protocol

import torch


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor a value holds: via its `tensors()` if it has one, else its dataclass
    fields, containers, or a transformers cache's per-layer keys and values."""
    if obj is None:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    own = getattr(obj, "tensors", None)
    if callable(own):
        yield from own()
    elif isinstance(obj, dict | list | tuple):
        for v in obj.values() if isinstance(obj, dict) else obj:
            if isinstance(v, torch.Tensor):  # the common leaf, without a nested generator
                yield v
            else:
                yield from iter_tensors(v)
    elif is_dataclass(obj):
        for f in fields(obj):
            yield from iter_tensors(getattr(obj, f.name))
    elif hasattr(obj, "layers"):  # DynamicCache and friends
        for layer in obj.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if isinstance(t, torch.Tensor):
                    yield t


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # skip the DTensor probe for these


def _storages(obj: Any) -> Iterator[tuple[tuple[int, int], int]]:
    """(device index, storage address) and bytes of each storage `obj` reaches. The executor
    walks every resident value after every plan step (thousands of weight and optimizer
    tensors), so the key avoids building a device string per tensor."""
    for t in iter_tensors(obj):
        if type(t) not in _PLAIN and hasattr(t, "to_local"):  # a DTensor (FSDP2): this
            t = t.to_local()  # rank holds its local shard
        st = t.untyped_storage()
        ptr, nbytes = st.data_ptr(), st.nbytes()
        if ptr and nbytes:
            yield (t.get_device(), ptr), nbytes


@dataclass(slots=True)
class Env:
    device: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    carry: dict[str, dict[str, Any]] = field(default_factory=dict)  # op -> partial results
    # Weights and optimizer state the plan freed: the step needs them no more, but the
    # backend's model and optimizer still hold them, so they stay resident in truth.
    kept: dict[str, Any] = field(default_factory=dict)
    # The plan's copies that move only part of a value (optimizer state): name -> the
    # share on host while it is in `host`. The rest stays resident, and is counted so.
    shares: dict[str, float] = field(default_factory=dict)
    # What `host` held when its storages were last walked (name, value), and their keys
    # and bytes, per value: offloaded weights and AdamW state are thousands of tensors, and
    # `host` changes only at copies and loads, while accounting reads it after every step.
    _host_seen: tuple[tuple[str, Any], ...] = field(default=(), init=False, repr=False)
    _host_keys: frozenset[tuple[int, int]] = field(default=frozenset(), init=False, repr=False)
    _host_total: int = field(default=0, init=False, repr=False)
    _partly_resident: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def _host_storages(self) -> tuple[frozenset[tuple[int, int]], int]:
        items = tuple(self.host.items())
        seen = self._host_seen
        if len(items) != len(seen) or any(
            a != c or b is not d for (a, b), (c, d) in zip(items, seen, strict=True)
        ):
            storages: dict[tuple[int, int], int] = {}
            self._partly_resident = {}
            for name, value in items:
                own = dict(_storages(value))
                storages.update(own)
                share = self.shares.get(name, 1.0)
                if share < 1:  # moved in part: the rest of its bytes are still resident
                    self._partly_resident[name] = round((1 - share) * sum(own.values()))
            stays = sum(self._partly_resident.values())
            self._host_seen = items
            self._host_keys, self._host_total = frozenset(storages), sum(storages.values()) - stays
        return self._host_keys, self._host_total

    def resident(self) -> Iterable[tuple[str, Any]]:
        yield from self.device.items()
        for op, c in self.carry.items():
            yield f"{op}#carry", c
        yield from ((k, v) for k, v in self.kept.items() if k not in self.device)

    def attribution(self, owned: set[str] | None = None) -> dict[str, int]:
        """Resident bytes per value name (first holder wins); `owned` keeps only those
        names (carries count when their op's name is owned)."""
        host, _ = self._host_storages()
        seen: set[tuple[int, int]] = set()
        out: dict[str, int] = {}
        for name, value in self.resident():
            if owned is not None and name.split("#carry")[0] not in owned:
                continue
            total = 0
            for key, nbytes in _storages(value):
                if key in seen or key in host:
                    continue
                seen.add(key)
                total += nbytes
            out[name] = out.get(name, 0) + total
        for name, stays in self._partly_resident.items():
            if owned is None or name in owned:
                out[name] = out.get(name, 0) + stays
        return out

    def resident_bytes(self, owned: set[str] | None = None) -> int:
        return sum(self.attribution(owned).values())

    def host_bytes(self) -> int:
        return self._host_storages()[1]


class AllocatorFeed(Protocol):
    """What a device's allocator says: bytes allocated and reserved now, and the most
    allocated in the current window. The executor opens a window at each RL step's start
    (`new_window`), so `max_allocated` is that step's own peak, and `run_peak` keeps the
    most allocated since the feed was made. The measured memory curve takes its totals
    from here; the per-value deltas come from `Env.attribution`. Tests pass a fake."""

    def allocated(self) -> int: ...

    def reserved(self) -> int: ...

    def max_allocated(self) -> int: ...

    def new_window(self) -> None: ...

    def run_peak(self) -> int: ...


class CudaAllocator:
    """`AllocatorFeed` of torch's CUDA caching allocator on one device. A window is
    torch's peak statistic reset; the peaks of the windows closed fold into `run_peak`."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self._closed_peak = 0  # the most allocated in the windows before the current one

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def reserved(self) -> int:
        return int(torch.cuda.memory_reserved(self.device))

    def max_allocated(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))

    def new_window(self) -> None:
        self._closed_peak = self.run_peak()
        torch.cuda.reset_peak_memory_stats(self.device)

    def run_peak(self) -> int:
        return max(self._closed_peak, self.max_allocated())


def allocator_feed(device: str | torch.device) -> AllocatorFeed | None:
    """The CUDA allocator of `device`; None on CPU, where no caching allocator stands
    between tensors and memory: there the executor's own count of the resident storages
    is the allocated figure (and the reserved one, nothing being cached)."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return CudaAllocator(dev)
    return None
