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
boundary) use torch's pinned allocator. Off CUDA these are plain copies.
"""

from __future__ import annotations

import weakref

import torch

# owner -> slot -> its pinned buffer; an owner that is garbage collected takes its buffers
_BUFFERS: weakref.WeakKeyDictionary[torch.Tensor, dict[str, torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)


def to_host(t: torch.Tensor, owner: torch.Tensor | None = None, slot: str = "") -> torch.Tensor:
    """`t`'s values in host memory: pinned and copied asynchronously when `t` is on CUDA,
    into the buffer kept for (`owner`, `slot`) when an owner is given."""
    if not t.is_cuda:
        return t.to("cpu", copy=True)
    if owner is None:
        return t.to("cpu", non_blocking=True)  # torch's pinned allocator
    slots = _BUFFERS.setdefault(owner, {})
    buf = slots.get(slot)
    if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
        buf = slots[slot] = _registered(t.shape, t.dtype)
    buf.copy_(t, non_blocking=True)
    return buf


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A copy of `t` on `device`, issued without blocking when `t` is pinned."""
    return t.to(device, copy=True, non_blocking=t.is_pinned())


def _registered(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    buf = torch.empty(shape, dtype=dtype)
    if buf.numel() == 0:
        return buf
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(buf.data_ptr(), buf.numel() * buf.element_size(), 0)
    if int(err) != 0:  # not pinned: copies still work, synchronously
        return buf
    weakref.finalize(buf, cudart.cudaHostUnregister, buf.data_ptr())
    return buf
