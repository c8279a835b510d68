"""backend.vllm.weights=share on a real engine (CUDA): the trainer's parameters lie in the
engine's tensors, an AdamW step reaches the engine with no load, and its greedy tokens
equal those of an engine that loaded the updated weights (weights=load)."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.model import build_model, model_for
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.specs import AlgoSpec
from rollplex.specs.vllm import VllmSpec
from tests.backends.vllm.conftest import needs_vllm
from tests.backends.vllm.tiny_folder import SPEC, write_folder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    needs_vllm,
]
# head_dim 64 in both towers (GPU attention kernels take it; the tiny preset's 32 may not)
SMALL = SPEC.model_copy(
    update={
        "name": "small64",
        "hidden_size": 256,
        "intermediate_size": 512,
        "mrope_section": (8, 12, 12),
        "vision": SPEC.vision.model_copy(
            update={"hidden_size": 128, "intermediate_size": 256, "out_hidden_size": 256}
        ),
    }
)


def _engine(folder, weights: str):
    from rollplex.backends.vllm.rollout import VllmRollout

    spec = VllmSpec(
        dtype="bfloat16",
        weights=weights,
        sleep="never",
        enable_sleep_mode=False,
        kv_cache_bytes=256 << 20,
        max_model_len=512,
        gpu_memory_utilization=0.2,
        enforce_eager=True,
    )
    return VllmRollout(folder, spec, kv_cache_bytes=256 << 20), spec


def _tokens(rollout) -> list[list[int]]:
    from vllm import SamplingParams

    gen = torch.Generator().manual_seed(0)
    prompts = [
        {"prompt_token_ids": torch.randint(7, SMALL.vocab_size, (12,), generator=gen).tolist()}
        for _ in range(8)
    ]
    out = rollout.llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False
    )
    return [list(o.outputs[0].token_ids) for o in out]


def _inside(p: torch.Tensor, t: torch.Tensor) -> bool:
    lo, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
    return lo <= p.data_ptr() and p.data_ptr() + p.numel() * p.element_size() <= lo + size


def test_the_engine_reads_the_trainers_storage(tmp_path):
    from rollplex.backends.vllm.build import check_shareable

    model = build_model(SMALL, seed=0)
    with torch.no_grad():  # sharper weights: greedy tokens then depend on them
        for p in model.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn_like(p) * 0.2)
    folder = write_folder(tmp_path / "small", model, spec=SMALL)
    spec = SMALL.model_copy(update={"path": str(folder), "dtype": "bfloat16"})
    trainer = TorchTrainer(model_for(spec, 0, torch.device("cuda")), spec, AlgoSpec(lr=3e-2))
    rollout, vspec = _engine(folder, "share")
    check_shareable(trainer, vspec)
    shared = rollout.share_storage(trainer.model, spec)
    (engine,) = rollout.llm.apply_model(lambda m: m)
    theirs, mine = dict(engine.named_parameters()), dict(trainer.model.named_parameters())
    assert len(shared.views) == len(mine)
    for a in shared.plan.aliases:
        assert _inside(mine[a.param], theirs[a.tensor]), a
    before = _tokens(rollout)
    torch.manual_seed(1)
    for p in trainer.params:
        p.grad = torch.randn_like(p)
    trainer.optimizer.step()
    trainer.counter.n += 1
    rollout.load_weights(trainer.live_weights())  # loads nothing: resets the caches
    after = _tokens(rollout)
    assert after != before  # the update reached the engine without a load
    rollout.shutdown()  # the trainer's parameters keep the storage alive
    reference, _ = _engine(folder, "load")
    reference.load_weights(trainer.live_weights())
    assert _tokens(reference) == after
    reference.shutdown()
