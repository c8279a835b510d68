"""The decode engine's skinny GEMMs (engine/skinny.py): the kernels and a decode on them
agree with torch's math under Triton's CPU interpreter (float32); the engine uses them on
CUDA only unless asked, and refuses them by name where they cannot run."""

from __future__ import annotations

import pytest

from rollplex.engine import skinny
from rollplex.engine.session import DecodeEngine
from tests.engine.interpreted import run_interpreted


@pytest.mark.slow  # ~25 s under the interpreter
@pytest.mark.skipif(skinny.triton is None, reason="Triton is not installed (pip install -e .[dev])")
def test_kernels_and_a_decode_agree_under_the_interpreter():
    run_interpreted("tests.engine.skinny_interpret", "skinny kernels agree")


@pytest.mark.parametrize(
    ("knob", "attr"), [("skinny_gemm", "skinny"), ("split_gemm", "split_gemm")]
)
def test_off_by_default_on_cpu_and_refused_when_asked(model, knob, attr):
    assert getattr(DecodeEngine(model).forward, attr) is False
    with pytest.raises(ValueError, match=f"{knob} needs CUDA and Triton"):
        DecodeEngine(model, **{knob: True})
