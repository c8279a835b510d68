"""Where the engine's Triton kernels (engine/skinny.py, engine/split_kernel.py) can run:
Triton must be installed (CPU-only torch builds ship none), and the device CUDA, or the
process under Triton's CPU interpreter (TRITON_INTERPRET=1, set before the kernels are
defined: what the CPU tests run them under).

Outside the engine package and free of torch, so the CLI refuses a knob by name before it
imports the model code (that import alone costs seconds)."""

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
