"""The decode engine's Triton kernels agree with torch's math under Triton's CPU
interpreter (float32): the split-attention kernels (split_kernel_interpret.py) and the
skinny GEMMs (skinny_interpret.py), each alone and in a decode. Both checks run in one
child process: each process pays ~4 CPU-s of imports before it interprets anything."""

from __future__ import annotations

import pytest

from rollplex.engine import skinny, split_kernel
from tests.engine.interpreted import run_interpreted


@pytest.mark.slow  # ~50 s: every kernel case and five decodes under the interpreter
@pytest.mark.skipif(
    split_kernel.triton is None or skinny.triton is None,
    reason="Triton is not installed (pip install -e .[dev])",
)
def test_kernels_and_decodes_agree_under_the_interpreter():
    run_interpreted(
        {
            "tests.engine.split_kernel_interpret": "split kernels agree",
            "tests.engine.skinny_interpret": "skinny kernels agree",
        }
    )
