"""Offload and onload copies (backends/torch/host_memory.py): exact round trips; on CUDA a
pinned buffer per moving tensor, reused by every offload, and copies that do not block the
issuing thread."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from rollplex.backends.torch.host_memory import to_device, to_host
from rollplex.backends.torch.values import OptimizerHandle, WeightsHandle

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
    weights = WeightsHandle("policy", layer, tuple(layer.parameters()), 0, None)
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
