"""The split-attention kernels on CUDA (engine/split_kernel.py; skipped without it): in
float32 they equal the compiled torch version, in bf16 they are as close to float32 math as
it is, at the 7B's head shape with one and 32 prompts, and a graphed split decode on them
draws what one on the torch version draws, with the step's K/V written by the kernels or
by the cache."""

from __future__ import annotations

import pytest
import torch

from rollplex.engine import split_kernel
from rollplex.engine.attention import split_attention, split_call
from tests.engine.test_engine_cuda import _run as run_engine
from tests.engine.test_engine_cuda import cuda_prefix  # noqa: F401

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(split_kernel.triton is None, reason="Triton is not installed"),
]


def _inputs(prompts: int, dtype: torch.dtype, n: int = 256):
    """The 7B's heads (4 K/V heads x 7 query heads, dim 128), G = 8, a 600-ish prefix."""
    gen = torch.Generator("cuda").manual_seed(prompts)
    kv, rep, g, cap, d = 4, 7, 8, 640, 128
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen).to(dtype)  # noqa: E731
    q = r(prompts, g, kv * rep, d).transpose(1, 2)
    lengths = torch.randint(1, cap + 1, (prompts,), device="cuda", generator=gen)
    own = [r(prompts, kv, g, n + 64, d)[:, :, :, :n] for _ in range(2)]
    return q, r(prompts, kv, cap, d), r(prompts, kv, cap, d), lengths, *own, d**-0.5


@pytest.mark.parametrize("prompts", [1, 32])
@pytest.mark.parametrize("step", [0, 255])
def test_float32_equals_the_torch_version(prompts, step):
    q, pk, pv, lengths, ok, ov, scale = _inputs(prompts, torch.float32)
    at = torch.tensor(step, device="cuda")
    with torch.no_grad():
        want = split_attention(q, pk, pv, lengths, ok, ov, at, scale)
        got = split_kernel.split_attention_kernel(q, pk, pv, lengths, ok, ov, at, scale)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prompts", [1, 32])
def test_bf16_as_close_to_float32_as_the_compiled_version(prompts):
    q, pk, pv, lengths, ok, ov, scale = _inputs(prompts, torch.bfloat16)
    at = torch.tensor(200, device="cuda")
    exact = split_attention(
        *(t.float() for t in (q, pk, pv)), lengths, ok.float(), ov.float(), at, scale
    )
    with torch.no_grad():
        got = split_kernel.split_attention_kernel(q, pk, pv, lengths, ok, ov, at, scale)
        torch_version = split_call()(q, pk, pv, lengths, ok, ov, at, scale)
    err = (got.float() - exact).abs().mean()
    assert torch.isfinite(got).all()
    assert err <= 1.5 * (torch_version.float() - exact).abs().mean() + 1e-4


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphed_decode_on_the_kernels_draws_what_the_torch_version_draws(
    cuda_prefix,  # noqa: F811
    temperature,
):
    """fp32 model (ieee dots in the kernels, TF32 off in torch): the same tokens, logprobs
    within reduction-order noise."""
    model, prefix = cuda_prefix
    runs = [
        run_engine(model, prefix, True, temperature, 7, "split", group=4, new=40, split_kernel=on)
        for on in (True, False)
    ]
    (t1, lp1, n1), (t2, lp2, n2) = runs
    assert (t1 == t2).float().mean() > 0.95 and torch.equal(n1, n2)
    torch.testing.assert_close(lp1[:, :8], lp2[:, :8], atol=1e-4, rtol=0)


def test_graphed_decode_with_the_kernels_writing_kv_draws_the_same(cuda_prefix):  # noqa: F811
    """kernel_writes_kv: the step's K/V written inside the kernel (one block a row and
    head, before its reads) instead of by the cache's index copies: the same draws. Written
    after stop 23's device time ran out; not yet run on a GPU."""
    model, prefix = cuda_prefix
    kw = {"group": 4, "new": 40, "split_kernel": True}
    runs = [
        run_engine(model, prefix, True, 1.0, 7, "split", kernel_writes_kv=on, **kw)
        for on in (True, False)
    ]
    (t1, lp1, n1), (t2, lp2, n2) = runs
    assert torch.equal(t1, t2) and torch.equal(n1, n2)
    torch.testing.assert_close(lp1, lp2, atol=1e-5, rtol=0)
