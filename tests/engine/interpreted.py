"""What the Triton-kernel tests share: running check modules in a child process under
Triton's CPU interpreter (TRITON_INTERPRET=1 must be set before the kernels are defined),
the tiny model's two-prompt prefix, and a decode on a kernel knob against one without."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from rollplex.data.prompts import PromptBatch
from rollplex.engine.prefix import PrefixState

ROOT = Path(__file__).resolve().parents[2]


def run_interpreted(checks: dict[str, str]) -> None:
    """Run each check module (name -> the line it prints when it passes) as `__main__`, in
    turn, in one child under the interpreter: it must exit 0 and print every line."""
    # one thread: the interpreter runs tiny tensors, and a second only spins against the
    # suite's other worker (~10% of the CPU time)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    code = f"import runpy\nfor m in {list(checks)!r}:\n    runpy.run_module(m, run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for module, marker in checks.items():
        assert marker in done.stdout, module


def tiny_batch() -> tuple[torch.nn.Module, PromptBatch]:
    """The tiny model and two prompts of unequal length (conftest's batch)."""
    from rollplex.backends.torch.model import build_model
    from rollplex.backends.torch.task import QUESTIONS, VisualTask
    from rollplex.backends.torch.tokenizer import (
        build_image_processor,
        build_tokenizer,
        encode_prompt,
    )
    from rollplex.data.prompts import collate_prompts
    from rollplex.specs.model import MODEL_PRESETS

    spec = MODEL_PRESETS["tiny"]
    model = build_model(spec, seed=0)
    tok, proc = build_tokenizer(spec), build_image_processor(spec)
    a, b = VisualTask(seed=0).samples(0, 2)
    prompts = [
        encode_prompt(tok, proc, a.image.resize((56, 56)), QUESTIONS["count"]),
        encode_prompt(tok, proc, b.image, QUESTIONS["colour"]),
    ]
    batch = collate_prompts(prompts, pad_id=spec.special_tokens.pad_token_id)
    assert batch.lengths[0] != batch.lengths[1]
    return model, batch


def tiny_prefix() -> tuple[torch.nn.Module, PrefixState]:
    """`tiny_batch`'s model and its two prompts prefilled."""
    from rollplex.engine.prefix import prefix_forward, vision_encode

    model, batch = tiny_batch()
    with torch.no_grad():
        feats = vision_encode(model, batch.pixel_values, batch.image_grid_thw)
        return model, prefix_forward(model, batch, feats, grad=False)


def decodes_agree(
    knob: str, attr: str, temperature: float, seed: int, atol: float, **engine: object
) -> None:
    """A decode with `knob` on equals one with it off (the engine's forward.`attr` says
    which ran): tokens and lengths exactly, logprobs within `atol`."""
    from rollplex.engine.session import DecodeEngine

    model, prefix = tiny_prefix()
    results = []
    for on in (True, False):
        e = DecodeEngine(model, **{knob: on}, **engine)
        assert getattr(e.forward, attr) is on
        s = e.start(prefix, 3, 6, temperature, 1.0, torch.Generator().manual_seed(seed), -1)
        s.advance()
        results.append(s.result())
    (t1, lp1, n1), (t2, lp2, n2) = results
    assert torch.equal(t1, t2) and torch.equal(n1, n2)
    torch.testing.assert_close(lp1, lp2, rtol=0, atol=atol)
