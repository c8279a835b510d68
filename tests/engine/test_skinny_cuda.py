"""The skinny GEMMs on CUDA (engine/skinny.py): bf16 kernels within cuBLAS's rounding of
float32 math at tiny and real 7B shapes, and a decode on them equal to one on cuBLAS in
float32 and close in bf16 (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rollplex.engine import skinny
from rollplex.engine.prefix import prefix_forward, vision_encode
from rollplex.engine.session import DecodeEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(skinny.triton is None, reason="Triton is not installed"),
]

# (N, K): ragged tiles, then the 7B shape's down and gate/up projections
SHAPES = [(70, 300), (4608, 3584), (3584, 18944)]


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("rows", [1, 8, 33, 64])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_bf16_kernels_within_cublas_rounding(rows, n, k):
    gen = torch.Generator("cuda").manual_seed(rows)
    x, w, b, u = (
        torch.randn(*s, device="cuda", generator=gen).bfloat16()
        for s in ((rows, k), (n, k), (n,), (n, k))
    )
    want = F.linear(x.float(), w.float(), b.float())
    assert _err(skinny.skinny_linear(x, w, b), want) <= 2 * _err(F.linear(x, w, b), want) + 1e-3
    want = F.silu(F.linear(x.float(), w.float())) * F.linear(x.float(), u.float())
    blas = F.silu(F.linear(x, w)) * F.linear(x, u)
    assert _err(skinny.skinny_gate_up(x, w, u), want) <= 2 * _err(blas, want) + 1e-3


@pytest.mark.parametrize("rows", [1, 8, 33, 64])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("splits", [1, 4, 8])
def test_bf16_split_partials_within_cublas_rounding(rows, n, k, splits):
    gen = torch.Generator("cuda").manual_seed(rows)
    x, w, b = (
        torch.randn(*s, device="cuda", generator=gen).bfloat16() for s in ((rows, k), (n, k), (n,))
    )
    want = F.linear(x.float(), w.float(), b.float())
    got = skinny.split_linear(x, w, b, splits)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    assert _err(got, want) <= 2 * _err(F.linear(x, w, b), want) + 1e-3


FORWARD_ATTR = {"skinny_gemm": "skinny", "split_gemm": "split_gemm"}  # knob -> DecodeStep's


def _decode(model, prefix, on: bool, temperature: float, knob: str = "skinny_gemm"):
    torch.use_deterministic_algorithms(False)
    knobs = {**dict.fromkeys(FORWARD_ATTR, False), knob: on}  # only `knob` differs
    engine = DecodeEngine(model, **knobs, kv_chunk=16)
    assert getattr(engine.forward, FORWARD_ATTR[knob]) is on
    s = engine.start(prefix, 4, 24, temperature, 1.0, torch.Generator("cuda").manual_seed(3), -1)
    s.advance()
    return s.result()


@pytest.mark.parametrize("knob", ["skinny_gemm", "split_gemm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_on_the_kernels_matches_cublas(model, batch, dtype, knob):
    model = model.to("cuda", dtype)
    b = batch.to("cuda")
    with torch.no_grad():
        feats = vision_encode(model, b.pixel_values.to(dtype), b.image_grid_thw)
        prefix = prefix_forward(model, b, feats, grad=False)
    on, off = _decode(model, prefix, True, 0.0, knob), _decode(model, prefix, False, 0.0, knob)
    if dtype == torch.float32:  # ieee dots on both sides: the same greedy path
        assert torch.equal(on[0], off[0])
        torch.testing.assert_close(on[1], off[1], atol=1e-4, rtol=0)
    else:  # bf16: other summation orders; near-ties aside, the same path
        assert (on[0] == off[0]).float().mean() > 0.9
        torch.testing.assert_close(on[1][:, :4], off[1][:, :4], atol=5e-2, rtol=0)
