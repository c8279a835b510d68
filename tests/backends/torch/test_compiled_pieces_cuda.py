"""Compiled decoder-layer pieces on CUDA (Triton kernels, flex attention's merge compiled):
the eager path's logprobs and gradients, in float32 (1e-4 relative, TF32 off) and bf16
(3e-2 on logprobs, 3e-1 on gradients, the bounds of the other CUDA reuse tests); and the
decode engine, which compiles and CUDA-graph-captures its own step around the same modules,
draws the same tokens with the pieces compiled. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.compiled_pieces import compile_text_pieces, eager_text_pieces
from tests.backends.torch.test_decode_once import _decode
from tests.backends.torch.test_packed_rows import _run
from tests.backends.torch.test_prefill_once_cuda import _rel
from tests.backends.torch.test_riders import _setup
from tests.backends.torch.test_video import renderer  # noqa: F401

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("source", ["forward", "decode once"])
def test_compiled_pieces_train_as_eager_ones_on_cuda(spec, renderer, dtype, source):  # noqa: F811
    torch.use_deterministic_algorithms(False)  # index_put_/cumsum on CUDA
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    batch, trainer, feats = _setup(spec, renderer, "mixed", "cuda", dtype)
    try:
        responses, kept = _decode(trainer, batch, feats, keep=source == "decode once")
        eager = _run(trainer, batch, feats, responses, kept, packed=True)
        compile_text_pieces(trainer.model)
        compiled = _run(trainer, batch, feats, responses, kept, packed=True)
    finally:
        eager_text_pieces(trainer.model)
        torch.backends.cuda.matmul.allow_tf32 = old
    bound = 1e-4 if dtype == torch.float32 else 3e-2
    assert _rel(compiled[0], eager[0]) < bound
    assert compiled[2].keys() == eager[2].keys()
    worst = max(_rel(compiled[2][n], g) for n, g in eager[2].items())
    assert worst < bound * 10, worst


def test_the_decode_engine_draws_the_same_tokens_with_compiled_pieces(spec, renderer):  # noqa: F811
    torch.use_deterministic_algorithms(False)
    batch, trainer, feats = _setup(spec, renderer, "mixed", "cuda", torch.float32)
    eager, kept = _decode(trainer, batch, feats, keep=True)
    kept = kept.layers().clone()  # the next decode reuses the engine's workspace
    compile_text_pieces(trainer.model)
    try:
        compiled, kept_c = _decode(trainer, batch, feats, keep=True)
    finally:
        eager_text_pieces(trainer.model)
    assert torch.equal(compiled.lengths, eager.lengths)
    assert torch.equal(compiled.tokens, eager.tokens)
    assert _rel(kept_c.layers(), kept) < 1e-4
