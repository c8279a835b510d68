"""The torch device a job asked for, checked before any data or model loads.

`train.device=tpu` used to end in a traceback from deep inside the first tensor move, and
`train.device=cuda` on a CPU-only torch build in "Torch not compiled with CUDA" after the
data and model had loaded. Both are refused here, in one line naming the field.
"""

from __future__ import annotations


def check_device(field: str, device: str) -> None:
    """Raise ValueError naming `field` unless this torch can run on `device`."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    why = device_refusal(field, device, torch.backends.cuda.is_built(), count, torch.__version__)
    if why is not None:
        raise ValueError(why)


def device_refusal(
    field: str, device: str, cuda_built: bool, cuda_devices: int, torch_version: str
) -> str | None:
    """Why `device` cannot run on a torch with these facts (None: it can), naming `field`."""
    import torch

    try:
        kind = torch.device(device).type
        index = torch.device(device).index
    except (RuntimeError, TypeError, ValueError):
        return f"{field}={device}: not a device rollplex runs on (cpu or cuda)"
    if kind == "cpu":
        return None
    if kind != "cuda":
        return f"{field}={device}: rollplex runs on cpu or cuda, not {kind}"
    if not cuda_built:
        return (
            f"{field}={device}: this torch ({torch_version}) is a CPU-only build; "
            f"use {field}=cpu, or install a CUDA build of torch"
        )
    if cuda_devices == 0:
        return f"{field}={device}: no CUDA device is visible to torch"
    if index is not None and index >= cuda_devices:
        return f"{field}={device}: only {cuda_devices} CUDA device(s) are visible"
    return None


def release_cuda_stream_caches() -> None:
    """Free the cuBLAS workspaces a finished job's streams left: cuBLAS keeps one per (handle,
    stream) a GEMM ran on, from the caching allocator, for the life of the process, and each
    job takes new streams (the executor's, each decode-graph capture's warm-up). A later job
    of the process (a multirun sweep, a bench) counted them in its own peak: ~0.2 GiB more
    per job on an H100 (bench/results/gpu_profile/job_residue.md). No-op without CUDA."""
    import sys

    torch = sys.modules.get("torch")  # a plan job never imports torch: nothing to free
    if torch is None or not torch.cuda.is_initialized():
        return
    torch.cuda.synchronize()  # no kernel may still use a workspace being freed
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # as Inductor's graphs do
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
