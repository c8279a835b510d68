"""Offload and onload copies (backends/torch/host_memory.py): exact round trips; on CUDA a
pinned buffer per moving tensor, reused by every offload, and copies that do not block the
issuing thread."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from rollplex.backends.torch.handles import OptimizerHandle, VersionCounter, WeightsHandle
from rollplex.backends.torch.host_memory import to_device, to_host

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_off_cuda_the_moves_are_plain_copies():
    t = torch.randn(5, 3)
    owner = torch.zeros(1)
    host = to_host(t, owner, "x")
    assert torch.equal(host, t) and host.data_ptr() != t.data_ptr()
    back = to_device(host, "cpu")
    assert torch.equal(back, t) and back.data_ptr() != host.data_ptr()


@pytest.mark.gpu
@cuda
def test_on_cuda_an_owner_keeps_one_pinned_buffer_and_the_copy_does_not_block():
    owner = torch.zeros(1)
    t = torch.randn(256, 1 << 20, device="cuda")  # 1 GiB
    first = to_host(t, owner)
    torch.cuda.synchronize()
    assert first.is_pinned() and torch.equal(first, t.cpu())
    t.mul_(2)
    torch.cuda.synchronize()
    begin = time.perf_counter()
    again = to_host(t, owner)  # into the same buffer, issued without waiting for it
    issued = time.perf_counter() - begin
    torch.cuda.synchronize()
    done = time.perf_counter() - begin
    assert again.data_ptr() == first.data_ptr()
    assert issued < 0.5 * done, (issued, done)
    back = to_device(again, "cuda")
    assert torch.equal(back, t)


@pytest.mark.gpu
@cuda
def test_on_cuda_weights_and_adamw_state_round_trip_through_the_same_buffers():
    layer = nn.Linear(64, 32).cuda()
    opt = torch.optim.AdamW(layer.parameters(), fused=True)
    layer(torch.randn(4, 64, device="cuda")).sum().backward()
    opt.step()
    want = [p.detach().clone() for p in layer.parameters()]
    moments = [v.clone() for st in opt.state.values() for k, v in st.items() if k != "step"]
    weights = WeightsHandle("policy", layer, tuple(layer.parameters()), 0, VersionCounter())
    state = OptimizerHandle(opt)
    ptrs = []
    for _ in range(2):
        weights.move_to("cpu")
        state.move_to("cpu")
        torch.cuda.synchronize()
        ptrs.append([p.data_ptr() for p in layer.parameters()])
        assert all(p.is_pinned() for p in layer.parameters())
        weights.move_to("cuda")
        state.move_to("cuda")
    assert ptrs[0] == ptrs[1]  # the second offload reused the first's buffers
    assert all(torch.equal(p, w) for p, w in zip(layer.parameters(), want, strict=True))
    again = [v for st in opt.state.values() for k, v in st.items() if k != "step"]
    assert all(a.is_cuda and torch.equal(a, b) for a, b in zip(again, moments, strict=True))
    layer(torch.randn(4, 64, device="cuda")).sum().backward()
    opt.step()  # fused AdamW runs on the onloaded state


def test_an_owner_keeps_one_buffer_per_slot_until_it_dies():
    import gc

    from rollplex.backends.torch import host_memory

    owner = torch.zeros(4)  # a tensor: its == is elementwise, so keys must not compare
    a = to_host(torch.ones(3), owner, "m")
    b = to_host(torch.full((3,), 2.0), owner, "m")
    c = to_host(torch.ones(3), owner, "v")
    assert a.data_ptr() == b.data_ptr() != c.data_ptr() and torch.equal(b, torch.full((3,), 2.0))
    d = to_host(torch.ones(2, 2), owner, "m")  # another shape: a buffer of its own
    assert d.shape == (2, 2) and torch.equal(d, torch.ones(2, 2))
    key = id(owner)
    assert key in host_memory._BUFFERS
    del owner
    gc.collect()
    assert key not in host_memory._BUFFERS


def _ref_handle(version: VersionCounter) -> tuple[nn.Linear, WeightsHandle]:
    layer = nn.Linear(4, 3)
    return layer, WeightsHandle("ref", layer, tuple(layer.parameters()), 0, version)


def test_an_offload_at_the_version_its_host_copy_holds_copies_nothing():
    """Frozen weights round-trip at one version: the second write-back finds the host copy
    current and only drops the device copy. Poisoning the host copy between the two shows
    which happened: a copy would overwrite the poison, a drop keeps it."""
    version = VersionCounter()
    layer, weights = _ref_handle(version)
    want = [p.detach().clone() for p in layer.parameters()]
    weights.move_to("cpu")  # the first write-back copies
    assert all(torch.equal(p, w) for p, w in zip(layer.parameters(), want, strict=True))
    host = [p.data for p in layer.parameters()]
    weights.move_to("cpu")  # same version: a drop, into the same buffers
    assert [p.data.data_ptr() for p in layer.parameters()] == [h.data_ptr() for h in host]
    for h in host:
        h.fill_(7.0)  # not how weights change: only the test writes behind the version
    weights.move_to("cpu")
    assert all(torch.all(p == 7.0) for p in layer.parameters())


def test_a_version_bump_or_a_forgotten_tag_makes_the_next_offload_copy():
    """An in-place update bumps the version; a checkpoint load (same version, new values)
    forgets the tags. Either way the next write-back copies the live values."""
    from rollplex.backends.torch.host_memory import forget_tags

    version = VersionCounter()
    layer, weights = _ref_handle(version)
    weights.move_to("cpu")
    for p in layer.parameters():
        p.data.fill_(1.0)  # a stale host copy from here on, unless the copy runs again
    version.n += 1
    weights.move_to("cpu")
    assert all(torch.all(p == 1.0) for p in layer.parameters())
    fresh = [torch.full_like(p, 2.0) for p in layer.parameters()]
    for p, f in zip(layer.parameters(), fresh, strict=True):
        p.data = f  # the parameter lives elsewhere now, its buffer holds 1.0 tagged current
    forget_tags(layer.parameters())
    weights.move_to("cpu")
    assert all(torch.all(p == 2.0) for p in layer.parameters())


def test_the_trainers_weight_load_forgets_the_host_copies(spec, tmp_path):
    """`load_weights` writes new values at the same version: the frozen tower's host copy,
    tagged at that version, must not be taken for them by the next write-back."""
    from rollplex.backends.torch.model import build_model, save_model
    from rollplex.backends.torch.roles import vision_params
    from rollplex.backends.torch.trainer import TorchTrainer
    from rollplex.specs import AlgoSpec

    trainer = TorchTrainer(build_model(spec, seed=0), spec, AlgoSpec())
    other = build_model(spec, seed=1)
    save_model(other, spec, tmp_path)
    tower = vision_params(trainer.model)
    weights = WeightsHandle("vision", trainer.model, tower, 0, VersionCounter())
    weights.move_to("cpu")
    for p in tower:  # an onload as on CUDA: a device copy apart from the host buffer
        p.data = to_device(p.data, "cpu")
    trainer.load_weights(tmp_path)
    weights.move_to("cpu")
    assert all(torch.equal(p, q) for p, q in zip(tower, vision_params(other), strict=True))


@pytest.mark.parametrize("share", [0.1, 0.3, 0.5, 0.8, 1.0])
def test_a_share_of_the_adamw_state_moves_its_first_tensors_and_comes_back_exact(share):
    """A partial offload (a plan's copy step with share < 1) moves the state's first
    tensors, masters then each parameter's moments in the optimizer's order, until they
    hold `share` of its bytes, and no more; its onload picks the same ones and brings back
    the same values, and AdamW steps on them."""
    layers = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 8), nn.Linear(8, 4))
    masters = tuple(p.detach().clone() for p in layers.parameters())
    opt = torch.optim.AdamW(layers.parameters())
    layers(torch.randn(3, 16)).sum().backward()
    opt.step()
    state = OptimizerHandle(opt, masters)
    parts = [t for t, _ in state._parts()]
    total = sum(t.nbytes for t in parts)
    cumulative = [sum(t.nbytes for t in parts[: k + 1]) for k in range(len(parts))]
    want = next(k + 1 for k, c in enumerate(cumulative) if c >= share * total)
    before = [t.clone() for t in parts]
    ptrs = [t.data_ptr() for t in parts]
    state.move_to("cpu", share)
    after = [t for t, _ in state._parts()]
    moved = [i for i, (a, t) in enumerate(zip(ptrs, after, strict=True)) if t.data_ptr() != a]
    assert moved == list(range(want))  # the first tensors, just enough to hold the share
    state.move_to("cpu", share)  # the onload: the same tensors, the same values
    assert all(torch.equal(t, b) for (t, _), b in zip(state._parts(), before, strict=True))
    layers(torch.randn(3, 16)).sum().backward()
    opt.step()


def test_a_share_of_anything_but_optimizer_state_is_refused_by_name():
    from rollplex.backends.base import BackendError
    from rollplex.backends.torch.rows import TorchValues

    layer = nn.Linear(4, 4)
    weights = WeightsHandle("policy", layer, tuple(layer.parameters()), 0, VersionCounter())
    with pytest.raises(BackendError, match="WeightsHandle moves whole, not 50% of it"):
        TorchValues().move(weights, "cpu", share=0.5)


@pytest.mark.gpu
@cuda
def test_on_cuda_a_share_of_the_adamw_state_is_on_host_and_the_rest_on_the_device():
    layers = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)).cuda()
    opt = torch.optim.AdamW(layers.parameters(), fused=True)
    layers(torch.randn(4, 64, device="cuda")).sum().backward()
    opt.step()
    state = OptimizerHandle(opt)
    state.move_to("cpu", 0.5)
    torch.cuda.synchronize()
    where = [t.is_cuda for t, _ in state._parts()]
    on_host = sum(t.nbytes for t, _ in state._parts() if not t.is_cuda)
    total = sum(t.nbytes for t, _ in state._parts())
    assert not where[0] and where[-1] and 0.5 * total <= on_host < total
    state.move_to("cuda", 0.5)
    assert all(t.is_cuda for t, _ in state._parts())
    layers(torch.randn(4, 64, device="cuda")).sum().backward()
    opt.step()
