"""Where the engine's Triton kernels (skinny.py, split_kernel.py) can run: Triton installed
and the device CUDA, or Triton's CPU interpreter (TRITON_INTERPRET=1, as the CPU tests run
them). Free of torch, so the train job refuses a knob by name before any model code loads."""

from __future__ import annotations

import os

try:
    import triton
except ImportError:
    triton = None


def usable(device_type: str) -> bool:
    """Whether the kernels run on a device of this type ('cuda', 'cpu', ...)."""
    if triton is None:
        return False
    return device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def resolve(asked: bool | None, knob: str, device_type: str) -> bool:
    """An engine knob that runs Triton kernels: unset, on exactly on CUDA with Triton; asked
    for where the kernels cannot run, refused by name."""
    if asked is None:
        return device_type == "cuda" and usable(device_type)
    if asked and not usable(device_type):
        raise ValueError(f"{knob} needs CUDA and Triton (rollplex/engine/)")
    return asked
