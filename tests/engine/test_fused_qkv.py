"""The decode engine's stacked q/k/v projections (engine/step.py FusedQKV): decoding with
them equals decoding with the three modules, the copy follows in-place weight updates
from one decode to the next, its bytes are what the planner prices, and the engine's
graphs are keyed on its addresses."""

from __future__ import annotations

import torch

from rollplex.engine.session import DecodeEngine
from rollplex.ops.formulas import torch_engine_fused_qkv

G, R = 3, 7


def _decode(engine: DecodeEngine, prefix, seed: int) -> tuple[torch.Tensor, ...]:
    session = engine.start(prefix, G, R, 1.0, 1.0, torch.Generator().manual_seed(seed), -1)
    session.advance()
    return session.result()


def _same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=0)


def test_fused_equals_separate_projections(model, prefix):
    fused, separate = DecodeEngine(model), DecodeEngine(model, fused_qkv=False)
    assert fused.forward.fused is not None and separate.forward.fused is None
    for seed in (0, 1):
        _same(_decode(fused, prefix, seed), _decode(separate, prefix, seed))


def test_copy_follows_in_place_updates_between_decodes(model, prefix):
    engine = DecodeEngine(model, keep_workspace=True)
    before = _decode(engine, prefix, 5)
    stacked = engine.forward.fused.addresses()
    with torch.no_grad():  # what an optimizer step does: in place, same storage
        for layer in model.model.language_model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.weight.mul_(-1.5)
                proj.bias.add_(0.25)
    after = _decode(engine, prefix, 5)
    assert engine.forward.fused.addresses() == stacked  # refreshed in place, graphs stay valid
    _same(after, _decode(DecodeEngine(model, fused_qkv=False), prefix, 5))
    assert not torch.equal(after[1], before[1])  # the update reached the decode


def test_dtype_change_reallocates_the_copy(model, prefix):
    engine = DecodeEngine(model, keep_workspace=True)
    _decode(engine, prefix, 2)
    old = engine.forward.fused.addresses()
    model.double()  # module.to rebinds every parameter: new storage, new dtype
    again = _decode(engine, prefix, 2)
    assert engine.forward.fused.weights[0].dtype == torch.float64
    assert engine.forward.fused.addresses() != old
    _same(again, _decode(DecodeEngine(model, fused_qkv=False), prefix, 2))


def test_planner_prices_the_copy(model, prefix, spec):
    engine = DecodeEngine(model)
    session = engine.start(prefix, G, R, 0.0, 1.0, None, -1)
    stacked = engine.forward.fused.tensors()
    assert sum(t.numel() * t.element_size() for t in stacked) == torch_engine_fused_qkv(spec)
    held = {t.data_ptr() for t in session.tensors()}
    assert {t.data_ptr() for t in stacked} <= held  # the rollout reports it as held
