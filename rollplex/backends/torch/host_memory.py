"""Host copies for the plan's offloads and onloads: pinned, asynchronous, reused.

A copy from the GPU into pageable memory blocks the issuing thread for the whole transfer
and runs at a few GB/s. The executor issues every stream from one thread, so such an
offload stalls the compute stream behind it: on an H200 the 7B reference model's offload
took 10.2 s against 0.28 s planned (bench/results/gpu_step/README.md, 7B run 1).

Here a tensor that moves every step (weights, optimizer state, gradients: `owner` names
it) gets one pinned host buffer of exactly its size, registered with the driver once
(`cudaHostRegister`; torch's pinned allocator rounds each block up to a power of two,
up to 2x the host memory for AdamW's state) and reused by every later offload. Copies are
issued without blocking on the current stream, which the executor makes the plan's copy
stream: the offload's device memory stays allocated until that stream is done (the
executor's `record_stream` on the step's reads), and an onload reads its buffer before
the next offload on the same stream overwrites it. Tensors that move once (a prefix
boundary) use torch's pinned allocator. Off CUDA the buffers are kept all the same (not
pinned), so the CPU tests run the reuse.
"""

from __future__ import annotations

import weakref

import torch

from rollplex.backends.torch.by_identity import ByIdentity

_BUFFERS: ByIdentity[dict[str, torch.Tensor]] = ByIdentity()  # owner -> slot -> its buffer


def move(
    t: torch.Tensor, device: torch.device | str, owner: torch.Tensor | None = None, slot: str = ""
) -> torch.Tensor:
    """`t` on `device`: `to_host` for the host, else `to_device`."""
    if torch.device(device).type == "cpu":
        return to_host(t, owner, slot)
    return to_device(t, device)


def to_host(t: torch.Tensor, owner: torch.Tensor | None = None, slot: str = "") -> torch.Tensor:
    """`t`'s values in host memory: pinned and copied asynchronously when `t` is on CUDA,
    into the buffer kept for (`owner`, `slot`) when an owner is given."""
    if owner is None:
        if t.is_cuda:
            return t.to("cpu", non_blocking=True)  # torch's pinned allocator
        return t.to("cpu", copy=True)
    slots = _BUFFERS.get_or_make(owner, dict)
    buf = slots.get(slot)
    if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
        buf = slots[slot] = _registered(t.shape, t.dtype, t.is_cuda)
    buf.copy_(t, non_blocking=t.is_cuda)
    return buf


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
