"""A tiny Hub-format folder written the way a user's is: transformers' `save_pretrained`
of a random model, a BPE tokenizer trained with `tokenizers`, and a Qwen2-VL processor."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2VLImageProcessorPil

from rollplex.backends.torch.model import build_model
from rollplex.models.demo import demo_spec, train_tokenizer
from rollplex.specs.model import ModelSpec
from tests.models.demo_home import demo_home

torch.set_num_threads(1)
TEXT = "what colour is the shape ? red green blue yes no circle triangle how many"
WORDS = TEXT.split(" ")


@dataclass
class Hub:
    folder: Path
    spec: ModelSpec
    model: Any
    tokenizer: Any
    processor: Any

    def copy(self, dest: Path) -> Path:
        shutil.copytree(self.folder, dest)
        return dest


def write_hub(folder: Path, max_shard_size: str = "5GB") -> Hub:
    tok = train_tokenizer([" ".join(WORDS)] * 20 + WORDS * 20, vocab_size=300)
    spec = demo_spec(len(tok))
    model = build_model(spec, seed=0)
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    tok.save_pretrained(folder)
    processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=56 * 56)
    processor.save_pretrained(folder)
    return Hub(folder, spec, model, tok, processor)


@pytest.fixture(scope="session")
def hub(tmp_path_factory) -> Hub:
    return write_hub(tmp_path_factory.mktemp("hub") / "tiny-qwen")


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> tuple[Path, Path, float]:
    """The demo folder built once for the run: (root, folder, seconds to build)."""
    return demo_home(tmp_path_factory)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
