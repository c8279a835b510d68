"""The executor's environment and its accounting of resident bytes.

Values live in one of two stores: `device` (resident: what the plan's slots hold) and
`host` (offloaded, or host data not yet loaded). Chunked ops park partial results in a
per-op carry, which is resident too.

Resident bytes are the sum of the distinct storages reachable from the device store and
the carries, minus storages that a host-store value holds (an alias of offloaded weights
is not resident). A storage counts whole even when only a view of it is held, because
that is what stays allocated. Each storage is attributed to the first value that holds it
(store order), which gives per-value byte counts for the memory trace that sum to the
total.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

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
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from iter_tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
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


def _storages(obj: Any) -> Iterator[tuple[tuple[str, int], int]]:
    for t in iter_tensors(obj):
        if hasattr(t, "to_local"):  # a DTensor (FSDP2): this rank holds its local shard
            t = t.to_local()
        st = t.untyped_storage()
        if st.nbytes() and st.data_ptr():
            yield (str(t.device), st.data_ptr()), st.nbytes()


@dataclass(slots=True)
class Env:
    device: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    carry: dict[str, dict[str, Any]] = field(default_factory=dict)  # op -> partial results

    def resident(self) -> Iterable[tuple[str, Any]]:
        yield from self.device.items()
        for op, c in self.carry.items():
            yield f"{op}#carry", c

    def attribution(self, owned: set[str] | None = None) -> dict[str, int]:
        """Resident bytes per value name (first holder wins); `owned` keeps only those
        names (carries count when their op's name is owned)."""
        host = {key for _, v in self.host.items() for key, _ in _storages(v)}
        seen: set[tuple[str, int]] = set()
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
            out[name] = total
        return out

    def resident_bytes(self, owned: set[str] | None = None) -> int:
        return sum(self.attribution(owned).values())

    def host_bytes(self) -> int:
        return sum(dict(s for v in self.host.values() for s in _storages(v)).values())
