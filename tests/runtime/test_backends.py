"""The backend registry: lazy, and honest about what is not there."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rollplex.backends import REGISTRY, BackendUnavailable, available_backends, backend_class
from rollplex.backends.base import Backend, Lifecycle, RolloutRole, Trainer


def test_torch_is_real_and_declares_its_kinds_and_lifecycle():
    cls = backend_class("torch")
    assert issubclass(cls, Backend) and cls.name == "torch"
    kinds = cls.op_kinds()
    grpo = {
        "vision_encode",
        "prefix_prefill",
        "decode",
        "reward",
        "advantage",
        "logprob_prefix",
        "logprob_response",
        "logprob",
        "expand_group",
        "policy_loss",
        "backward",
        "optimizer_step",
        "weight_sync",
    }
    assert grpo | {"value_loss"} <= kinds  # PPO's critic runs too (critic.py)
    assert set(cls.lifecycle) == {"rollout", "reference", "trainer"}
    assert all(isinstance(v, Lifecycle) for v in cls.lifecycle.values())
    assert "torch" in available_backends()


def test_fsdp_is_built():
    from rollplex.backends.fsdp.backend import FsdpBackend
    from rollplex.backends.torch.backend import TorchBackend

    assert backend_class("fsdp") is FsdpBackend and "fsdp" in available_backends()
    assert issubclass(FsdpBackend, TorchBackend)  # the same ops, an FSDP2 trainer


@pytest.mark.parametrize("name", ["vllm"])
def test_unbuilt_backends_say_why(name):
    with pytest.raises(BackendUnavailable, match=r"not implemented yet") as err:
        backend_class(name)
    assert name in str(err.value) and "use backend 'torch'" in str(err.value)
    assert name not in available_backends()


def test_unknown_and_missing_packages(monkeypatch):
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'"):
        backend_class("tpu")
    entry = REGISTRY["torch"]
    monkeypatch.setitem(
        REGISTRY, "torch", type(entry)("torch", entry.module, entry.cls, ("no_such_package_xyz",))
    )
    with pytest.raises(BackendUnavailable, match="needs no_such_package_xyz"):
        backend_class("torch")


def test_importing_the_registry_imports_no_backend():
    code = (
        "import sys, rollplex.backends; "
        "print(any(m in sys.modules for m in ('transformers', 'rollplex.backends.torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_roles_take_weights_from_the_trainer_or_a_folder():
    # The hook later backends (vLLM rollout, FSDP trainer) build on.
    assert "load_weights" in RolloutRole.__abstractmethods__
    assert {"live_weights", "state_dict", "save_weights"} <= Trainer.__abstractmethods__
