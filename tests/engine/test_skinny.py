"""The decode engine's skinny GEMMs (engine/skinny.py): the engine uses them on CUDA only
unless asked, and refuses them by name where they cannot run. That the kernels and a decode
on them agree with torch's math under Triton's CPU interpreter: test_interpreted_kernels.py."""

from __future__ import annotations

import pytest

from rollplex.engine.session import DecodeEngine


@pytest.mark.parametrize(
    ("knob", "attr"), [("skinny_gemm", "skinny"), ("split_gemm", "split_gemm")]
)
def test_off_by_default_on_cpu_and_refused_when_asked(model, knob, attr):
    assert getattr(DecodeEngine(model).forward, attr) is False
    with pytest.raises(ValueError, match=f"{knob} needs CUDA and Triton"):
        DecodeEngine(model, **{knob: True})
