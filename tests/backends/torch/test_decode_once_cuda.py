"""decode_once on CUDA: the decode's kept layer outputs give the trainer the logprobs and
gradients of its own response forward, with the engine's CUDA graphs, in float32 (1e-4
relative: other kernels than the trainer's, TF32 off) and in bf16 (3e-2 relative on
logprobs, 3e-1 on gradients: the engine's fused q/k/v GEMM and cache attention round each
product to ~2^-8 differently from the trainer's forward, and a gradient sums many of them;
the bounds of the prefill-once and ride tests). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.backends.torch.test_decode_once import _decode, _train
from tests.backends.torch.test_prefill_once_cuda import _rel
from tests.backends.torch.test_riders import _setup
from tests.backends.torch.test_video import renderer  # noqa: F401

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["image", "mixed"])
def test_kept_decode_trains_as_the_response_forward_on_cuda(spec, renderer, dtype, kind):  # noqa: F811
    torch.use_deterministic_algorithms(False)  # index_put_/cumsum on CUDA
    batch, trainer, feats = _setup(spec, renderer, kind, "cuda", dtype)
    trainer.micro_batches = 2
    responses, kept = _decode(trainer, batch, feats, keep=True)
    once = _train(trainer, batch, feats, responses, kept)
    plain = _train(trainer, batch, feats, responses)
    assert once[3] == 0 and plain[3] > 0  # the replay ran no response forward; the plain one did
    bound = 1e-4 if dtype == torch.float32 else 3e-2
    assert _rel(once[0], plain[0]) < bound
    assert once[2].keys() == plain[2].keys()
    worst = max(_rel(once[2][n], g) for n, g in plain[2].items())
    assert worst < bound * 10, worst
