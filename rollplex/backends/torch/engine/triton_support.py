"""Where the engine's Triton kernels (skinny.py, split_kernel.py) can run: Triton must be
installed (CPU-only torch builds ship none), and the device CUDA, or the process under
Triton's CPU interpreter (TRITON_INTERPRET=1, set before the kernels are defined: what the
CPU tests run them under)."""

from __future__ import annotations

import os

import torch

try:
    import triton
except ImportError:
    triton = None


def usable(device: torch.device) -> bool:
    """Whether the kernels run on `device`."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def resolve(asked: bool | None, knob: str, device: torch.device) -> bool:
    """An engine knob that runs Triton kernels: unset, on exactly on CUDA with Triton; asked
    for where the kernels cannot run, refused by name."""
    if asked is None:
        return device.type == "cuda" and usable(device)
    if asked and not usable(device):
        raise ValueError(f"{knob} needs CUDA and Triton (backends/torch/engine/)")
    return asked
