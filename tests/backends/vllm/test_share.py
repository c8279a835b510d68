"""backend.vllm.weights=share without an engine: the algebra's alias plan at TP 1, and the
trainer's parameters turned into views of vLLM-layout tensors (built here the way vLLM's
loader fuses them), updated in place, re-aliased when moved, refused when scrambled."""

from __future__ import annotations

import itertools

import pytest
import torch

from rollplex.backends.base import BackendError
from rollplex.backends.torch.model import build_model
from rollplex.backends.vllm.share import SharedStorage, alias_plan
from rollplex.specs.model import MODEL_PRESETS
from rollplex.specs.vllm import VllmSpec
from rollplex.weights.layouts import rollout_blocks
from rollplex.weights.params import param_table, rollout_tensors

SPEC = MODEL_PRESETS["tiny"]


@pytest.mark.parametrize("preset", ["tiny", "qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen2_5_vl_32b"])
def test_every_parameter_is_one_view_at_tp1(preset):
    spec = MODEL_PRESETS[preset]
    plan = alias_plan(spec)
    table = {p.name: p for p in param_table(spec)}
    homes = [a.param for a in plan.aliases]
    assert sorted(homes) == sorted(table) and len(set(homes)) == len(homes)
    assert plan.rebuilt == () and plan.rebuilt_params == ()
    # within a tensor the views do not overlap and fit its (possibly vocab-padded) rows
    by_tensor: dict[str, list] = {}
    for a in plan.aliases:
        assert a.rows == table[a.param].rows
        by_tensor.setdefault(a.tensor, []).append((a.row0, a.row0 + a.rows))
    tensors = {t.name: t for t in rollout_tensors(spec, vision_tp=True)}
    for name, spans in by_tensor.items():
        spans.sort()
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans)), name
        rows = sum(b.r1 - b.r0 for b in rollout_blocks(tensors[name], 0, 1, name))
        assert spans[-1][1] <= rows


class FakeEngine(torch.nn.Module):
    """vLLM-named tensors assembled from `model` as vLLM's loader fuses them (TP 1)."""

    def __init__(self, model: torch.nn.Module, spec=SPEC, swap_qk: bool = False) -> None:
        super().__init__()
        params = dict(model.named_parameters())
        self.names: dict[str, str] = {}
        for t in rollout_tensors(spec, vision_tp=True):
            rows = []
            for b in rollout_blocks(t, 0, 1, t.name):
                if b.param is None:
                    rows.append(torch.zeros(b.r1 - b.r0, t.cols))
                else:
                    p = params[b.param].detach()
                    rows.append(p.reshape(p.shape[0], -1)[b.r0 : b.r1].clone())
            if swap_qk and ".qkv_proj.weight" in t.name:
                rows[0], rows[1] = rows[1], rows[0]
            full = torch.cat(rows).reshape(-1, *t.tail) if t.tail else torch.cat(rows).flatten()
            key = t.name.replace(".", "__")
            self.names[t.name] = key
            self.register_parameter(key, torch.nn.Parameter(full, requires_grad=False))

    def named_parameters(self, *a, **k):
        inverse = {v: n for n, v in self.names.items()}
        return ((inverse[n], p) for n, p in super().named_parameters(*a, **k))


def _inside(p: torch.Tensor, t: torch.Tensor) -> bool:
    lo, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
    return lo <= p.data_ptr() and p.data_ptr() + p.numel() * p.element_size() <= lo + size


def test_the_trainer_updates_the_engines_tensors_in_place():
    model = build_model(SPEC, seed=0)
    engine = FakeEngine(model)
    before = sum(t.numel() for t in engine.parameters())
    shared = SharedStorage(engine, model, SPEC)
    theirs = dict(engine.named_parameters())
    for a in shared.plan.aliases:
        assert _inside(dict(model.named_parameters())[a.param], theirs[a.tensor]), a
    assert shared.shared_bytes == sum(p.numel() * 4 for p in model.parameters())
    assert sum(t.numel() for t in engine.parameters()) == before  # nothing new allocated
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    fresh = FakeEngine(model)  # what a full reload of the updated weights would hold
    for name, t in dict(fresh.named_parameters()).items():
        assert torch.equal(theirs[name], t), name
    initial = FakeEngine(build_model(SPEC, seed=0)).named_parameters()
    assert any(not torch.equal(theirs[n], t) for n, t in initial)  # the update is visible


def test_a_moved_parameter_is_copied_back_and_re_aliased():
    model = build_model(SPEC, seed=0)
    engine = FakeEngine(model)
    shared = SharedStorage(engine, model, SPEC)
    name = "model.language_model.layers.0.self_attn.k_proj.weight"
    p = dict(model.named_parameters())[name]
    p.data = p.data.clone() + 1.0  # e.g. offloaded to host and loaded back, then updated
    assert shared.sync() == 1
    home = dict(engine.named_parameters())[
        "language_model.model.layers.0.self_attn.qkv_proj.weight"
    ]
    q = SPEC.num_heads * SPEC.head_dim
    assert _inside(p, home) and torch.equal(home[q : q + SPEC.kv_dim], p.detach())
    assert shared.sync() == 0


def test_a_layout_the_algebra_does_not_describe_is_refused_by_name():
    model = build_model(SPEC, seed=0)
    with pytest.raises(BackendError, match=r"qkv_proj.weight' do not hold '.*q_proj.weight'"):
        SharedStorage(FakeEngine(model, swap_qk=True), model, SPEC)
    half = FakeEngine(model).to(torch.float64)
    with pytest.raises(BackendError, match=r"backend\.vllm\.dtype"):
        SharedStorage(half, model, SPEC)


def test_a_sharing_engine_cannot_be_told_to_sleep_every_step():
    with pytest.raises(ValueError, match="weights='share' with sleep='always'"):
        VllmSpec(weights="share", sleep="always")
    assert VllmSpec(weights="share").sleep == "auto"
