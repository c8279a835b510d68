"""Float32 master weights for a bf16 model: tiny RL-sized updates are kept (plain AdamW over
bf16 parameters rounds them away), a step equals a float32 model's step, the parameters'
storage is never replaced, and a float32 model trains exactly as before (no masters)."""

from __future__ import annotations

import copy

import pytest
import torch

from rollplex.backends.torch.handles import OptimizerHandle
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Loss, Pixels, Responses, TokenLogprobs
from rollplex.specs import AlgoSpec

BF16 = torch.bfloat16


def _bf16(spec):
    return build_model(spec, seed=0).to(BF16)


def _loss(params, seed: int, scale: float = 1.0) -> torch.Tensor:
    """sum(c * p) with c exactly representable in bf16, so a bf16 and a float32 model get
    bit-identical gradients (c) and differ only in how they apply them."""
    gen = torch.Generator().manual_seed(seed)
    terms = [
        (p.float() * (scale * torch.randn(p.shape, generator=gen)).to(p.device, BF16).float()).sum()
        for p in params
    ]
    return torch.stack(terms).sum()


def _step(trainer: TorchTrainer, seed: int, micro: int = 1) -> None:
    """One trainer step whose gradient accumulates over `micro` backward calls."""
    grads = trainer.backward(Loss(_loss(trainer.params, seed), {}))
    for _ in range(micro - 1):  # more micro-batches: accumulate into .grad
        _loss(trainer.params, seed).backward()
    trainer.optimizer_step(grads)


def test_plain_adamw_over_bf16_loses_tiny_updates_masters_keep_them(spec):
    lr, steps = 1e-6, 6
    algo = AlgoSpec(lr=lr)
    ours = TorchTrainer(_bf16(spec), spec, algo)
    plain = copy.deepcopy(ours.model)
    plain_params = [p for p in plain.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in ours.params]
    # the defect: AdamW straight over bf16 parameters, bf16 moments
    opt = torch.optim.AdamW(plain_params, lr=lr, weight_decay=0.0)
    for _ in range(steps):  # a constant gradient: Adam moves each weight by ~lr a step
        trainer_loss = sum(p.float().sum() for p in ours.params)
        ours.optimizer_step(ours.backward(Loss(trainer_loss, {})))
        opt.zero_grad()
        sum(p.float().sum() for p in plain_params).backward()
        torch.nn.utils.clip_grad_norm_(plain_params, algo.max_grad_norm)
        opt.step()

    # weights of magnitude >= 2^-10: a bf16 step there is 2^-17 = 7.6e-6, so a 1e-6 update
    # rounds away every time, while 6 of them (6e-6) pass half a step (3.8e-6)
    big = [w.float().abs() >= 2**-10 for w in start]
    lost = [(p.detach()[m] != w[m]).any() for p, w, m in zip(plain_params, start, big, strict=True)]
    assert not any(lost)  # plain AdamW: not one of them moved
    masters = ours.masters.tensors
    for w, m in zip(start, masters, strict=True):
        # every master moved by lr a step (Adam's |update| ~ lr): to 1%, plus float32's
        # own rounding of each step at the weight's magnitude
        moved = w.float() - m
        tol = 0.01 * steps * lr + steps * torch.finfo(torch.float32).eps * w.float().abs()
        assert ((moved - steps * lr).abs() <= tol).all()
    # ...and the bf16 weights follow them: every one in [2^-10, 2^-9) moved by one step
    band = [(w.float().abs() >= 2**-10) & (w.float().abs() < 2**-9) for w in start]
    kept = [(p.detach()[m] != w[m]).all() for p, w, m in zip(ours.params, start, band, strict=True)]
    assert all(kept) and sum(int(m.sum()) for m in band) > 1000
    for p, m in zip(ours.params, masters, strict=True):
        assert torch.equal(p.detach(), m.to(BF16))  # the weights are the rounded masters


def test_a_step_with_masters_equals_a_float32_models_step(spec):
    algo = AlgoSpec(lr=1e-3, weight_decay=0.1)
    ours = TorchTrainer(_bf16(spec), spec, algo)
    # the float32 model starts from the same (bf16-rounded) weights
    ref = TorchTrainer(copy.deepcopy(ours.model).float(), spec, algo)
    assert ours.masters is not None and ref.masters is None
    for k in range(3):
        _step(ours, seed=k, micro=2)
        _step(ref, seed=k, micro=2)
        for m, p, q in zip(ours.masters.tensors, ours.params, ref.params, strict=True):
            assert torch.equal(m, q.detach())  # the same float32 AdamW on the same gradients
            assert torch.equal(p.detach(), q.detach().to(BF16))  # within bf16 rounding


@pytest.mark.parametrize("chunk_bytes", [1, 64 * 1024, 1 << 30], ids=["each", "some", "one"])
def test_a_step_cast_in_chunks_equals_the_float32_models_step(spec, monkeypatch, chunk_bytes):
    """The masters' float32 gradients are cast, clipped and stepped a chunk at a time (each
    parameter alone, a few together, all at once): the same clipping and AdamW, bit for
    bit, as the float32 model's whole-model step; a parameter without a gradient stays."""
    from rollplex.backends.torch import masters as masters_module

    monkeypatch.setattr(masters_module, "MASTER_STEP_CHUNK_BYTES", chunk_bytes)
    algo = AlgoSpec(lr=1e-3, weight_decay=0.1, max_grad_norm=0.5)  # the clip is active
    ours = TorchTrainer(_bf16(spec), spec, algo)
    ref = TorchTrainer(copy.deepcopy(ours.model).float(), spec, algo)
    frozen = 3  # this parameter gets no gradient: AdamW must not move it
    before = ours.params[frozen].detach().clone()
    for k in range(2):
        for t in (ours, ref):
            grads = t.backward(Loss(_loss(t.params, k), {}))
            t.params[frozen].grad = None
            t.optimizer_step(grads)
        for m, p, q in zip(ours.masters.tensors, ours.params, ref.params, strict=True):
            assert torch.equal(m, q.detach()) and torch.equal(p.detach(), q.detach().to(BF16))
            assert p.grad is None and m.grad is None
    assert torch.equal(ours.params[frozen].detach(), before)


def test_a_micro_batched_step_applies_the_accumulated_gradients(spec, batch):
    """A real micro-batched forward/backward in bf16: the masters step with the float32
    casts of the gradients accumulated over all micro-batches."""
    algo = AlgoSpec(lr=1e-3)
    trainer = TorchTrainer(_bf16(spec), spec, algo)
    trainer.micro_batches = 2
    g, r = 2, 3
    gen = torch.Generator().manual_seed(0)
    responses = Responses(
        torch.randint(7, spec.vocab_size, (batch.lengths.shape[0] * g, r), generator=gen),
        torch.tensor([3, 2, 3, 1]),
    )
    mask = torch.arange(r)[None, :] < responses.lengths[:, None]
    feats = trainer.vision_encode(Pixels.of(batch))
    state, _ = trainer.logprob_prefix(feats, batch.text_only())
    lp, _ = trainer.logprob_response(state, responses, g)
    old = TokenLogprobs(lp.values.detach().float(), mask)
    out = trainer.loss(lp, old, torch.tensor([1.0, -1.0, 0.5, -0.5]), None)
    assert out.metrics["train_micro_batches"] == 2
    grads = trainer.backward(out)
    accumulated = [None if p.grad is None else p.grad.float() for p in trainer.params]
    assert sum(a is not None and bool(a.abs().sum() > 0) for a in accumulated) > 10
    start = [m.clone() for m in trainer.masters.tensors]
    expected = [m.clone() for m in start]
    opt = torch.optim.AdamW(expected, lr=algo.lr, weight_decay=algo.weight_decay, fused=True)
    for e, a in zip(expected, accumulated, strict=True):
        e.grad = a
    torch.nn.utils.clip_grad_norm_(expected, algo.max_grad_norm)
    opt.step()
    trainer.optimizer_step(grads)
    for m, e in zip(trainer.masters.tensors, expected, strict=True):
        assert torch.equal(m, e)
    assert all(p.grad is None for p in trainer.params)  # the bf16 grads were freed


def test_the_parameters_keep_their_storage(spec):
    trainer = TorchTrainer(_bf16(spec), spec, AlgoSpec(lr=1e-3))
    before = [(p, p.data_ptr(), p.dtype) for p in trainer.model.parameters()]
    start = [p.detach().clone() for p in trainer.params]
    for k in range(2):
        _step(trainer, seed=k)
    after = [(p, p.data_ptr(), p.dtype) for p in trainer.model.parameters()]
    assert all(a[0] is b[0] and a[1:] == b[1:] for a, b in zip(before, after, strict=True))
    assert any(not torch.equal(p.detach(), w) for p, w in zip(trainer.params, start, strict=True))


def test_a_float32_model_has_no_masters_and_steps_as_plain_adamw(spec):
    algo = AlgoSpec(lr=1e-3, weight_decay=0.1)
    trainer = TorchTrainer(build_model(spec, seed=0), spec, algo)
    assert trainer.masters is None
    stepped = trainer.optimizer.param_groups[0]["params"]  # the parameters themselves
    assert all(a is b for a, b in zip(stepped, trainer.params, strict=True))
    plain = copy.deepcopy(trainer.model)
    params = [p for p in plain.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=algo.lr, weight_decay=algo.weight_decay, fused=True)
    for k in range(3):
        _step(trainer, seed=k)
        opt.zero_grad(set_to_none=True)
        _loss(params, seed=k).backward()
        torch.nn.utils.clip_grad_norm_(params, algo.max_grad_norm)
        opt.step()
        for p, q in zip(trainer.params, params, strict=True):
            assert torch.equal(p.detach(), q.detach())
            assert torch.equal(p.grad, q.grad)  # grads stay on a float32 model's parameters
    assert set(trainer.state_dict()) == {"optimizer", "version"}
    assert trainer.counter.n == 3


def test_the_offloaded_optimizer_state_carries_the_masters(spec):
    """The plan's `policy.adam` is priced at 12 bytes a parameter (master + 2 moments): the
    handle the runtime offloads holds exactly that, and a round trip keeps training exact."""
    trainer, twin = (TorchTrainer(_bf16(spec), spec, AlgoSpec(lr=1e-3)) for _ in range(2))
    for t in (trainer, twin):
        _step(t, seed=0)
    handle = OptimizerHandle(trainer.optimizer, trainer.master_tensors())
    n = sum(p.numel() for p in trainer.params)
    assert sum(t.numel() * t.element_size() for t in handle.tensors() if t.dim()) == 12 * n
    masters = trainer.master_tensors()
    ptrs = [m.data_ptr() for m in masters]
    handle.move_to("cpu")  # a copy, as an offload and its onload make
    assert all(a is b for a, b in zip(trainer.master_tensors(), masters, strict=True))
    assert all(m.data_ptr() != p for m, p in zip(masters, ptrs, strict=True))
    for t in (trainer, twin):
        _step(t, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(masters, twin.master_tensors(), strict=True))
    assert TorchTrainer(build_model(spec, seed=0), spec, AlgoSpec()).master_tensors() == ()


def test_a_bf16_critic_trains_through_masters_too(spec):
    """PPO's critic has its own AdamW: in bf16 it keeps float32 masters as the policy does
    (RL-sized updates kept, parameter storage unchanged); in float32 it has none."""
    from rollplex.backends.torch.critic import TorchCritic

    lr, steps = 1e-6, 4
    critic = TorchCritic(_bf16(spec), spec, AlgoSpec(critic_lr=lr, weight_decay=0.0))
    assert critic.masters is not None
    ptrs = [p.data_ptr() for p in critic.params]
    start = [m.detach().clone() for _, _, m in critic.masters.separate()]
    for _ in range(steps):
        critic.optimizer_step(
            critic.backward(Loss(sum(p.float().sum() for p in critic.params), {}))
        )
    moved = [(m - s).abs() for (_, _, m), s in zip(critic.masters.separate(), start, strict=True)]
    assert all(torch.allclose(d, torch.full_like(d, steps * lr), rtol=0.02) for d in moved)
    for _, p, m in critic.masters.separate():
        assert torch.equal(p.detach(), m.to(BF16))  # weights are the rounded masters
    assert [p.data_ptr() for p in critic.params] == ptrs
    state = critic.state_dict()
    again = TorchCritic(_bf16(spec), spec, AlgoSpec(critic_lr=lr, weight_decay=0.0))
    again.load_state_dict(state)
    for (_, _, a), (_, _, b) in zip(
        again.masters.separate(), critic.masters.separate(), strict=True
    ):
        assert torch.equal(a, b)
    assert TorchCritic(build_model(spec, seed=0), spec, AlgoSpec()).masters is None


def test_the_critics_offloadable_optimizer_state_holds_its_masters(spec):
    """What the backend offloads as `critic_adam`: the masters and both moments, 12 bytes
    a trained parameter (the planner's pricing), as for the policy's `adam`."""
    from rollplex.backends.torch.critic import TorchCritic
    from rollplex.backends.torch.masters import own_masters

    critic = TorchCritic(_bf16(spec), spec, AlgoSpec(critic_lr=1e-6))
    critic.optimizer_step(critic.backward(Loss(sum(p.float().sum() for p in critic.params), {})))
    handle = OptimizerHandle(critic.optimizer, own_masters(critic.masters))
    held = sum(t.numel() * t.element_size() for t in handle.tensors() if t.dim() > 0)
    assert held == 12 * sum(p.numel() for p in critic.params)


def test_the_optimizer_is_fused_as_the_plan_prices_its_step(spec):
    """The planner gives the optimizer step no scratch; that holds for fused AdamW (in place)
    and not for torch's foreach default, which would need a float32 copy of the parameters."""
    from rollplex.ops import formulas as F

    trainer = TorchTrainer(_bf16(spec), spec, AlgoSpec())
    assert trainer.optimizer.defaults["fused"] is True
    assert F.optimizer_step(spec).transient_bytes == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_step_grows_the_peak_by_no_more_than_its_priced_scratch(spec, monkeypatch):
    """Measured with the allocator: a second step (state already made) grows the peak over
    its bf16 gradients by at most what the planner prices (`ops.formulas.optimizer_step`:
    the chunked float32 casts), far less than the float32 bytes of all the masters (which
    casting every gradient at once, or foreach AdamW, would add)."""
    from rollplex.backends.torch import masters as masters_module
    from rollplex.ops import formulas as F

    chunk = 64 * 1024  # several chunks even at the tiny model's size
    monkeypatch.setattr(masters_module, "MASTER_STEP_CHUNK_BYTES", chunk)
    monkeypatch.setattr(F.training, "MASTER_STEP_CHUNK_BYTES", chunk)
    trainer = TorchTrainer(_bf16(spec).cuda(), spec, AlgoSpec(lr=1e-3))
    _step(trainer, seed=0)
    grads = trainer.backward(Loss(_loss(trainer.params, 1), {}))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    trainer.optimizer_step(grads)
    torch.cuda.synchronize()
    grown = torch.cuda.max_memory_allocated() - base
    params = sum(p.numel() for p in trainer.params)
    priced = F.optimizer_step(spec, trainable_params=params, grad_bytes=2).transient_bytes
    assert grown <= 1.05 * priced + (1 << 20), (grown, priced)
    assert grown < 0.5 * 4 * params  # not every gradient in float32 at once
