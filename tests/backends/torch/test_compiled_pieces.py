"""Compiled decoder-layer pieces (backends/torch/compiled_pieces.py): with the norms, MLPs
and attention merge compiled, the response forward and the decode-once replay give the eager
logprobs, entropy and every gradient (fp32, traced by dynamo and AOTAutograd, rows of
unequal length); a deep copy's pieces run its own weights; under another torch.compile a
piece traces its class's forward; one compilation per piece serves every layer and width;
and `eager_text_pieces` undoes it all."""

from __future__ import annotations

import copy

import pytest
import torch

from rollplex.backends.torch.compiled_pieces import (
    COMPILED_MERGE,
    _compiled,
    compile_text_pieces,
    compiled_merge,
    eager_text_pieces,
    merge_parts,
)
from tests.backends.torch.test_decode_once import _decode
from tests.backends.torch.test_packed_rows import _run
from tests.backends.torch.test_riders import _setup
from tests.backends.torch.test_video import renderer  # noqa: F401

# fp32: a compiled graph may fuse the same per-token math and reorder its reductions
TOL = {"atol": 1e-5, "rtol": 1e-4}


@pytest.fixture(autouse=True, scope="module")
def traced_without_inductor():
    """Dynamo and AOTAutograd as on the GPU, without Inductor's C++ build on the CPU (40 s
    cold); Inductor's kernels are the CUDA file's (test_compiled_pieces_cuda.py)."""
    from rollplex.backends.torch import compiled_pieces

    before = compiled_pieces.BACKEND
    compiled_pieces.BACKEND = "aot_eager"
    compiled_pieces._compiled.cache_clear()
    compiled_pieces.compiled_merge.cache_clear()
    yield
    compiled_pieces.BACKEND = before
    compiled_pieces._compiled.cache_clear()
    compiled_pieces.compiled_merge.cache_clear()


def _own_forwards(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if "forward" in vars(m)]


@pytest.mark.parametrize("source", ["forward", "decode once"])
def test_compiled_pieces_give_the_eager_logprobs_and_gradients(spec, renderer, source):  # noqa: F811
    batch, trainer, feats = _setup(spec, renderer, "mixed")
    responses, kept = _decode(trainer, batch, feats, keep=source == "decode once")
    model = trainer.model
    lp, ent, grads, _ = _run(trainer, batch, feats, responses, kept, packed=True)
    compile_text_pieces(model)
    try:
        lm = model.model.language_model
        assert all(getattr(layer.self_attn, COMPILED_MERGE) for layer in lm.layers)
        assert len(_own_forwards(model)) == 1 + 3 * len(lm.layers)  # final norm, 2 norms + MLP
        lp_c, ent_c, grads_c, _ = _run(trainer, batch, feats, responses, kept, packed=True)
        # the compiled functions ran (each one's first call is a logged phase)
        assert _compiled(type(lm.norm)).done and _compiled(type(lm.layers[0].mlp)).done
        assert compiled_merge().done
    finally:
        eager_text_pieces(model)
    assert not _own_forwards(model)
    assert not any(hasattr(m, COMPILED_MERGE) for m in model.modules())
    torch.testing.assert_close(lp_c, lp, **TOL)
    torch.testing.assert_close(ent_c, ent, **TOL)
    assert grads_c.keys() == grads.keys() and len(grads) > 10
    for name, g in grads.items():
        torch.testing.assert_close(grads_c[name], g, **TOL, msg=name)


def test_a_deep_copy_runs_its_own_weights_and_other_compiles_trace_the_class(spec, renderer):  # noqa: F811
    _, trainer, _ = _setup(spec, renderer, "mixed")
    model = compile_text_pieces(trainer.model)
    twin = copy.deepcopy(model)
    norm, twin_norm = model.model.language_model.norm, twin.model.language_model.norm
    assert twin_norm.forward.__self__ is twin_norm
    with torch.no_grad():
        twin_norm.weight.mul_(2.0)
    x = torch.randn(2, 3, norm.weight.shape[0])
    torch.testing.assert_close(twin_norm(x), 2.0 * norm(x), **TOL)
    # the decode engine compiles its own step around these modules: there they run eagerly
    outer = torch.compile(lambda h: norm(h) + 1.0, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(outer(x), type(norm).forward(norm, x) + 1.0, **TOL)


def test_the_compiled_merge_equals_the_eager_one():
    gen = torch.Generator().manual_seed(0)
    b, g, heads, r, d = 2, 3, 4, 5, 8
    out_a = torch.randn(b, heads, g * r, d, generator=gen)
    lse_a = torch.randn(b, heads, g * r, generator=gen)
    out_b = torch.randn(b * g, heads, r, d, generator=gen)
    lse_b = torch.randn(b * g, heads, r, generator=gen)
    args = (out_a, lse_a, out_b, lse_b, g, torch.float32)
    eager = merge_parts(*args)
    assert eager.shape == (b * g, r, heads, d)
    # the exact merge: weights exp(lse_part - lse) of the two parts sum to one
    w_a = (
        (
            lse_a.view(b, heads, g, r).transpose(1, 2)
            - torch.logaddexp(
                lse_a.view(b, heads, g, r).transpose(1, 2).reshape(b * g, heads, r), lse_b
            ).view(b, g, heads, r)
        )
        .exp()
        .reshape(b * g, heads, r)
    )
    row = out_a.view(b, heads, g, r, d).transpose(1, 2).reshape(b * g, heads, r, d)
    expect = row * w_a[..., None] + out_b * (1 - w_a)[..., None]
    torch.testing.assert_close(eager, expect.transpose(1, 2), **TOL)
    torch.testing.assert_close(compiled_merge()(*args), eager, **TOL)


def test_one_compilation_serves_every_layer_and_width(spec):
    from torch._dynamo.utils import counters

    from rollplex.backends.torch.model import build_model

    model = compile_text_pieces(
        build_model(spec.model_copy(update={"num_layers": 3}), seed=0, dtype=torch.float32)
    )
    lm = model.model.language_model

    def run(width: int, layers: list) -> None:
        h = torch.randn(1, width, lm.norm.weight.shape[0], requires_grad=True)
        for layer in layers:
            h = layer.mlp(layer.post_attention_layernorm(layer.input_layernorm(h)))
        lm.norm(h).sum().backward()

    run(5, lm.layers[:1])  # the first layer's pieces compile (or are found compiled)
    graphs = counters["stats"]["unique_graphs"]
    for width in (5, 9, 17):  # the other layers' weights, and other widths
        run(width, list(lm.layers))
    assert counters["stats"]["unique_graphs"] == graphs  # no recompile per layer or width
