"""Host copies for the plan's offloads and onloads: pinned, asynchronous, reused.

A pageable GPU-to-host copy blocks the issuing thread, so each tensor that moves every step
gets one registered pinned buffer of its exact size, copied into without blocking on the
plan's copy stream. An offload whose buffer already holds the same weights version copies
nothing: the drop is the whole offload. Why: docs/architecture.md (Training).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterable

import torch

from rollplex.backends.torch.by_identity import ByIdentity

# owner -> slot -> (its buffer, the tag of the values it holds: None when untagged)
_BUFFERS: ByIdentity[dict[str, tuple[torch.Tensor, Hashable]]] = ByIdentity()


def move(
    t: torch.Tensor,
    device: torch.device | str,
    owner: torch.Tensor | None = None,
    slot: str = "",
    tag: Hashable = None,
) -> torch.Tensor:
    """`t` on `device`: `to_host` for the host, else `to_device`."""
    if torch.device(device).type == "cpu":
        return to_host(t, owner, slot, tag)
    return to_device(t, device)


def to_host(
    t: torch.Tensor, owner: torch.Tensor | None = None, slot: str = "", tag: Hashable = None
) -> torch.Tensor:
    """`t`'s values in host memory: pinned and copied asynchronously when `t` is on CUDA,
    into the buffer kept for (`owner`, `slot`) when an owner is given. With a `tag` the
    buffer already holds, nothing is copied: the caller vouches that values of one tag are
    equal (a version counter that every in-place update bumps)."""
    if owner is None:
        if t.is_cuda:
            return t.to("cpu", non_blocking=True)  # torch's pinned allocator
        return t.to("cpu", copy=True)
    slots = _BUFFERS.get_or_make(owner, dict)
    buf, held = slots.get(slot, (None, None))
    if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
        buf, held = _registered(t.shape, t.dtype, t.is_cuda), None
    elif tag is not None and held == tag:
        return buf  # current already: the offload is the device copy's drop
    buf.copy_(t, non_blocking=t.is_cuda)
    slots[slot] = (buf, tag)
    return buf


def forget_tags(owners: Iterable[torch.Tensor]) -> None:
    """The host copies of `owners` no longer vouch for their values: whoever writes the
    device values without bumping their version (a checkpoint load) calls this, and the
    next offload copies."""
    for owner in owners:
        slots = _BUFFERS.find(owner)
        if slots is not None:
            slots.update({slot: (buf, None) for slot, (buf, _) in slots.items()})


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A copy of `t` on `device`, issued without blocking when `t` is pinned."""
    return t.to(device, copy=True, non_blocking=t.is_pinned())


def _registered(shape: torch.Size, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    buf = torch.empty(shape, dtype=dtype)
    if not pin or buf.numel() == 0:
        return buf
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(buf.data_ptr(), buf.numel() * buf.element_size(), 0)
    if int(err) != 0:  # not pinned: copies still work, synchronously
        return buf
    weakref.finalize(buf, cudart.cudaHostUnregister, buf.data_ptr())
    return buf
