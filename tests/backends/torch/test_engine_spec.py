"""`backend.torch_engine` reaches the torch rollout's decode engine, and bad values are
refused by name before anything is built."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from rollplex.backends.base import Sampling
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.backend import build_rollout
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.specs import AlgoSpec
from rollplex.specs.backend import BackendSpec

G, R = 3, 5


def _rollout(model, spec, **engine):
    trainer = TorchTrainer(model, spec, AlgoSpec())
    backend = BackendSpec(torch_engine=engine)
    return build_rollout(StepConfig(spec, AlgoSpec(), 0, R), trainer, spec=backend)


@pytest.mark.parametrize(
    ("engine", "attention", "fused"),
    [({}, "sdpa", True), ({"attention": "split", "fused_qkv": False}, "split", False)],
)
def test_the_spec_reaches_the_engine(model, spec, prefix, engine, attention, fused):
    rollout = _rollout(model, spec, **engine)
    sampling = Sampling(max_new_tokens=R, temperature=1.0, top_p=1.0, eos_id=-1, pad_id=0)
    decode = rollout.start_decode(prefix, G, sampling, torch.Generator().manual_seed(0))
    assert decode.session.ws.shape.attention == attention  # auto is SDPA on CPU
    assert (rollout._engine.forward.fused is not None) is fused
    decode.advance()
    responses, _ = decode.result()
    assert responses.tokens.shape == (prefix.rows * G, R)


@pytest.mark.parametrize(
    ("field", "value"), [("attention", "flash"), ("fused_qkv", "maybe"), ("bogus", 1)]
)
def test_bad_values_are_named(field, value):
    with pytest.raises(ValidationError, match=f"torch_engine.{field}"):
        BackendSpec(torch_engine={field: value})


@pytest.mark.parametrize(
    ("knob", "attr"),
    [("skinny_gemm", "skinny"), ("split_kernel", "split_kernel"), ("split_gemm", "split_gemm")],
)
def test_triton_knobs_reach_the_engine_and_cpu_refuses_them_by_name(
    model, spec, prefix, knob, attr
):
    sampling = Sampling(max_new_tokens=R, temperature=1.0, top_p=1.0, eos_id=-1, pad_id=0)
    off = _rollout(model, spec, **{knob: False})
    off.start_decode(prefix, G, sampling, torch.Generator().manual_seed(0))
    assert getattr(off._engine.forward, attr) is False
    with pytest.raises(ValueError, match=f"{knob} needs CUDA"):
        _rollout(model, spec, **{knob: True}).start_decode(prefix, G, sampling, None)
