"""Values kept per live object, keyed by its identity.

Tensors compare elementwise, so neither a dict nor a WeakKeyDictionary can key them: entries
are keyed by `id` and hold a weak reference, and an object's death drops its entry. Used for
pinned offload buffers (host_memory.py) and a vision forward's longest window.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class ByIdentity(dict[int, tuple[weakref.ref, V]], Generic[V]):
    """id(obj) -> (a weak reference to obj, its value)."""

    def find(self, obj: Any) -> V | None:
        """`obj`'s value, or None if it has none (a dead object's reused id has none)."""
        hit = self.get(id(obj))
        return hit[1] if hit is not None and hit[0]() is obj else None

    def get_or_make(self, obj: Any, make: Callable[[], V]) -> V:
        key = id(obj)
        hit = self.get(key)
        if hit is None or hit[0]() is not obj:  # new, or a dead object's id reused
            gone = lambda _ref, key=key: self.pop(key, None)  # noqa: E731
            hit = self[key] = (weakref.ref(obj, gone), make())
        return hit[1]
