"""The role registry: each role chosen on its own, lazy, and honest about what is not there."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from pydantic import ValidationError

from rollplex.backends import (
    ROLES,
    BackendUnavailable,
    available_roles,
    role_entry,
    rollout_capabilities,
)
from rollplex.backends.base import RolloutRole, Trainer
from rollplex.runtime.compose import check_roles
from rollplex.specs.backend import BackendSpec
from rollplex.specs.roles import ROLE_NAMES, RoleCapabilities


def test_torch_roles_are_real_and_declare_capabilities():
    for role in ("rollout", "reference", "trainer"):
        assert "torch" in available_roles(role)
        caps = role_entry(role, "torch").role_class().capabilities
        assert isinstance(caps, RoleCapabilities)
    roll = rollout_capabilities(BackendSpec())
    assert roll.piggyback_rows and roll.prefix_kv_export and not roll.fused_prefix
    assert roll.scaled_logprobs  # its decode logprobs serve as old logprobs


def test_the_registry_declares_what_each_role_class_declares():
    for role, entries in ROLES.items():
        for name, entry in entries.items():
            if entry.module is None or entry.missing():
                continue
            module = __import__(entry.module, fromlist=[entry.cls])
            assert entry.capabilities() == getattr(module, entry.cls).capabilities, (role, name)


def test_the_registry_holds_exactly_the_names_a_spec_may_choose():
    """specs/roles.py names the choices (the spec layer imports no backend); the registry
    builds exactly those."""
    assert {role: tuple(entries) for role, entries in ROLES.items()} == ROLE_NAMES


def test_capabilities_are_small_frozen_values():
    caps = RoleCapabilities()
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.piggyback_rows = True  # type: ignore[misc]
    assert {f.name for f in dataclasses.fields(caps)} >= {
        "segmented_decode",
        "prefix_kv_export",
        "piggyback_rows",
        "sleep_levels",
        "in_place_weight_load",
        "weights_sources",
    }


def test_the_vllm_rollout_declares_what_it_cannot_host():
    # readable where vLLM is not installed: planning needs no engine
    c = rollout_capabilities(BackendSpec(rollout="vllm"))
    assert c.fused_prefix and not c.piggyback_rows and not c.prefix_kv_export
    # processed_logprobs: of logits / T, as the trainer scores (test_parity.py shows it)
    assert c.in_place_weight_load and c.scaled_logprobs


def test_the_fsdp_trainer_is_built_with_its_own_torch_roles():
    entry = role_entry("trainer", "fsdp")
    assert "fsdp" in available_roles("trainer")
    from rollplex.backends.fsdp.build import FsdpValues, GatheredRollout
    from rollplex.backends.fsdp.trainer import FsdpTrainer
    from rollplex.backends.torch.roles import TorchRollout
    from rollplex.backends.torch.rows import TorchValues
    from rollplex.backends.torch.trainer import TorchTrainer

    assert entry.role_class() is FsdpTrainer and issubclass(FsdpTrainer, TorchTrainer)
    from rollplex.backends.fsdp import build

    assert entry.builder_fn("rollout_builder") is build.build_rollout
    assert entry.builder_fn("reference_builder") is build.build_reference
    assert issubclass(GatheredRollout, TorchRollout) and issubclass(FsdpValues, TorchValues)
    assert entry.builder_fn("runtime").__name__ == "runtime"
    assert role_entry("trainer", "torch").builder_fn("runtime") is None


def test_unknown_names_fail_in_the_spec():
    with pytest.raises(ValidationError, match=r"backend.rollout='sglang' is unknown"):
        BackendSpec(rollout="sglang")
    with pytest.raises(ValidationError, match=r"extra"):
        BackendSpec(backend="torch")  # type: ignore[call-arg]


def test_missing_packages_name_what_to_install(monkeypatch):
    entry = ROLES["rollout"]["torch"]
    monkeypatch.setitem(
        ROLES["rollout"], "torch", dataclasses.replace(entry, requires=("no_such_package_xyz",))
    )
    with pytest.raises(BackendUnavailable, match=r"needs no_such_package_xyz.*pip install"):
        check_roles(BackendSpec())


def test_importing_the_registry_imports_no_role():
    code = (
        "import sys, rollplex.backends, rollplex.specs.backend; "
        "print(any(m in sys.modules for m in ('transformers', 'vllm', 'rollplex.backends.torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_roles_take_weights_from_the_trainer_or_a_folder():
    assert "load_weights" in RolloutRole.__abstractmethods__
    assert {"live_weights", "state_dict", "save_weights"} <= Trainer.__abstractmethods__
