"""The decode engine's skinny GEMMs (engine/skinny.py): the kernels and a decode on them
agree with torch's math under Triton's CPU interpreter (float32); the engine uses them on
CUDA only unless asked, and refuses them by name where they cannot run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollplex.backends.torch.engine import skinny
from rollplex.backends.torch.engine.session import DecodeEngine

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(skinny.triton is None, reason="Triton is not installed (pip install -e .[dev])")
def test_kernels_and_a_decode_agree_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.backends.torch.skinny_interpret"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skinny kernels agree" in done.stdout


def test_off_by_default_on_cpu_and_refused_when_asked(model):
    assert DecodeEngine(model).forward.skinny is False
    with pytest.raises(ValueError, match="skinny_gemm needs CUDA and Triton"):
        DecodeEngine(model, skinny_gemm=True)
