"""release_cuda_stream_caches (jobs/devices.py), which run_job calls when a job ends: the
cuBLAS workspaces of the streams a job used go back, so the next job of the process starts
where the first did (bench/results/gpu_profile/job_residue.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rollplex.jobs.devices import release_cuda_stream_caches


@pytest.mark.gpu
def test_the_workspaces_of_a_jobs_streams_are_freed():
    torch.cuda.init()
    a = torch.randn(256, 256, device="cuda")
    release_cuda_stream_caches()
    start = torch.cuda.memory_allocated()
    for _ in range(3):  # new streams, as each job's executor and graph captures take
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            (a @ a).sum().item()
    assert torch.cuda.memory_allocated() > start  # each stream's GEMM kept a workspace
    release_cuda_stream_caches()
    assert torch.cuda.memory_allocated() == start


def test_without_cuda_in_the_process_nothing_is_imported_or_touched():
    code = (
        "import sys; from rollplex.jobs.devices import release_cuda_stream_caches; "
        "release_cuda_stream_caches(); assert 'torch' not in sys.modules"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
