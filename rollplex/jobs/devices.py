"""The torch device a job asked for, checked before any data or model loads.

`train.device=tpu` used to end in a traceback from deep inside the first tensor move, and
`train.device=cuda` on a CPU-only torch build in "Torch not compiled with CUDA" after the
data and model had loaded. Both are refused here, in one line naming the field.
"""

from __future__ import annotations


def check_device(field: str, device: str) -> None:
    """Raise ValueError naming `field` unless this torch can run on `device`."""
    import torch

    try:
        kind = torch.device(device).type
        index = torch.device(device).index
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{field}={device}: not a device rollplex runs on (cpu or cuda)") from None
    if kind == "cpu":
        return
    if kind != "cuda":
        raise ValueError(f"{field}={device}: rollplex runs on cpu or cuda, not {kind}")
    if not torch.backends.cuda.is_built():
        raise ValueError(
            f"{field}={device}: this torch ({torch.__version__}) is a CPU-only build; "
            f"use {field}=cpu, or install a CUDA build of torch"
        )
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError(f"{field}={device}: no CUDA device is visible to torch")
    if index is not None and index >= count:
        raise ValueError(f"{field}={device}: only {count} CUDA device(s) are visible")
