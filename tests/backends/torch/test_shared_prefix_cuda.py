"""The shared-prefix attention's CUDA path (compiled FlexAttention parts with their lse):
equal to dense attention and to the math path in values and gradients, and end to end the
micro-batched, checkpointed training forward and backward equal the old expand path
(float32, skipped without CUDA; the CPU file checks the math path at 1e-5)."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.activations import SavedActivations
from rollplex.backends.torch.checkpointing import checkpointed_layers
from rollplex.backends.torch.micro import response_micro_batches
from rollplex.backends.torch.micro_loss import backward_micro_batches
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import capture_saved
from rollplex.backends.torch.shared_prefix_attention import SharedPrefix, shared_prefix_attention
from rollplex.backends.torch.values import Responses
from rollplex.engine.prefix import prefix_forward, vision_encode
from tests.backends.torch.test_shared_prefix import (
    _Attn,
    _dense,
    _responses,
    expand_logprobs,
    prompts,  # noqa: F401  (the fixture)
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOL = 1e-4  # float32 kernels in other summation orders (flex's tiles vs one matmul)


@pytest.fixture(autouse=True)
def _no_tf32():
    torch.use_deterministic_algorithms(False)
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _parts_against_dense(dev: torch.device, dtype: torch.dtype, names: tuple[str, ...]):
    """Values and gradients (q, k, v, prefix k, prefix v) of each path and of dense
    float32 attention over each row's [prefix ; response]."""
    gen = torch.Generator().manual_seed(0)
    b, g, heads, kv_heads, p, r, d = 2, 3, 8, 2, 150, 70, 64

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dev, dtype).requires_grad_()

    q, k, v = rand(b * g, heads, r, d), rand(b * g, kv_heads, r, d), rand(b * g, kv_heads, r, d)
    pk, pv = rand(b, kv_heads, p, d), rand(b, kv_heads, p, d)
    prefix_valid = (torch.arange(p)[None, :] < torch.tensor([[p], [37]])).to(dev)
    lengths = torch.tensor([70, 1, 33, 70, 2, 64])
    response_valid = (torch.arange(r)[None, :] < lengths[:, None]).to(dev)
    w = torch.randn(b * g, r, heads, d, generator=gen).to(dev)
    results = {}
    for name in (*names, "dense"):
        if name == "dense":
            f32 = [x.float() for x in (q, pk, pv, k, v)]
            out = _dense(*f32, prefix_valid, response_valid, g)
        else:
            flex = name == "flex"
            shared = SharedPrefix.build([(pk, pv)], prefix_valid, response_valid, g, flex=flex)
            assert (shared.flex is not None) == flex
            out, _ = shared_prefix_attention(_Attn(), q, k, v, shared, scaling=d**-0.5)
        grads = torch.autograd.grad((out.float() * w).sum(), (q, k, v, pk, pv))
        results[name] = [out.detach().float(), *(x.float() for x in grads)]
    return results


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_parts_equal_dense_and_math(dtype):
    results = _parts_against_dense(torch.device("cuda"), dtype, ("flex", "math"))
    what = ["out", "dq", "dk", "dv", "dpk", "dpv"]
    for name in ("flex", "math"):
        for got, want, w in zip(results[name], results["dense"], what, strict=True):
            if dtype == torch.float32:
                torch.testing.assert_close(got, want, rtol=TOL, atol=TOL, msg=f"{name} {w}")
            else:  # bf16 inputs and output against a float32 reference
                assert _relative(got, want) < 2e-2, (name, w, _relative(got, want))


def _train(spec, batch, responses, g: int, count: int, expand: bool):
    model = build_model(spec, seed=0).cuda()
    feats = vision_encode(model, batch.pixel_values, batch.image_grid_thw)
    saved = SavedActivations()
    with capture_saved(saved), checkpointed_layers(model, saved):
        prefix = prefix_forward(model, batch.text_only(), feats, grad=True)

    def score(state, tokens, lengths, _rows):
        if expand:
            return expand_logprobs(model, state, Responses(tokens, lengths), g)
        from rollplex.backends.torch.logprob import response_logprobs

        return response_logprobs(model, state, tokens, lengths)

    out, _ = response_micro_batches(model, prefix, responses, g, count, score)
    w = torch.randn(out.values.shape, generator=torch.Generator().manual_seed(1)).cuda()
    micro = out.micro
    terms = [(x * w[lo:hi]).sum() for (lo, hi), x in zip(micro.rows, micro.logprobs, strict=True)]
    backward_micro_batches(terms, micro)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.values, grads


@pytest.mark.parametrize(("g", "count"), [(4, 1), (2, 3)])
def test_micro_batched_training_on_cuda_equals_expand(spec, prompts, g, count):  # noqa: F811
    batch = prompts.to("cuda")
    cpu = _responses(spec, prompts.size * g, seed=7)
    responses = Responses(cpu.tokens.cuda(), cpu.lengths.cuda())
    lp, grads = _train(spec, batch, responses, g, count, expand=False)
    old_lp, old_grads = _train(spec, batch, responses, g, count, expand=True)
    torch.testing.assert_close(lp, old_lp, rtol=TOL, atol=TOL)
    assert grads.keys() == old_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], old_grads[name], rtol=TOL, atol=TOL, msg=name)
