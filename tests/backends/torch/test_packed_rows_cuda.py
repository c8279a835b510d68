"""Packed response rows on CUDA (flex attention on the unpacked layout for the shared-prefix
forward and the decode-once replay, SDPA's causal kernel for verl's per-sample forward):
the padded path's logprobs and gradients, in float32 (1e-4 relative: other kernels and
GEMM row counts, TF32 off) and bf16 (3e-2 on logprobs, 3e-1 on gradients, the bounds of
the other CUDA reuse tests). Skipped without CUDA; the CPU file holds fp32 to 1e-6."""

from __future__ import annotations

import pytest
import torch

from tests.backends.torch.test_decode_once import _decode
from tests.backends.torch.test_packed_rows import _full, _run
from tests.backends.torch.test_prefill_once_cuda import _rel
from tests.backends.torch.test_riders import _setup
from tests.backends.torch.test_video import renderer  # noqa: F401

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("source", ["forward", "decode once", "full"])
def test_packed_rows_train_as_padded_rows_on_cuda(spec, renderer, dtype, source):  # noqa: F811
    torch.use_deterministic_algorithms(False)  # index_put_/cumsum on CUDA
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        batch, trainer, feats = _setup(spec, renderer, "mixed", "cuda", dtype)
        responses, kept = _decode(trainer, batch, feats, keep=source == "decode once")
        if source == "full":
            trainer.micro_batches = 2
            packed = _full(trainer, batch, feats, responses, True)
            padded = _full(trainer, batch, feats, responses, False)
            grads = 1
        else:
            packed = _run(trainer, batch, feats, responses, kept, packed=True)
            padded = _run(trainer, batch, feats, responses, kept, packed=False)
            grads = 2
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    bound = 1e-4 if dtype == torch.float32 else 3e-2
    assert _rel(packed[0], padded[0]) < bound
    assert packed[grads].keys() == padded[grads].keys()
    worst = max(_rel(packed[grads][n], g) for n, g in padded[grads].items())
    assert worst < bound * 10, worst
