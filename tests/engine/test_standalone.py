"""The engine on its own: a fresh process that imports only rollplex.engine (and the specs
and data it builds on) decodes greedily what the model's own forward predicts, and never
loads the torch backend's roles, the runtime, the jobs or the trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABOVE_ENGINE = ("rollplex.backends", "rollplex.runtime", "rollplex.jobs", "rollplex.trace")

# Two text prompts of unequal length (so the batch is right-padded), G responses each, greedy.
DECODE = """
import json, sys
import torch
from transformers import Qwen2_5_VLForConditionalGeneration
from rollplex.data.prompts import PromptInputs, collate_prompts
from rollplex.engine.prefix import prefix_forward, vision_encode
from rollplex.engine.session import DecodeEngine
from rollplex.specs.model import MODEL_PRESETS

G, R = 2, 5
spec = MODEL_PRESETS["tiny"]
torch.manual_seed(0)
model = Qwen2_5_VLForConditionalGeneration._from_config(
    spec.to_hf_config(), attn_implementation="sdpa", dtype=torch.float32
).eval()
first_text = 7  # ids below are special tokens (pad, bos, eos, vision markers)
ids = [torch.randint(first_text, spec.vocab_size, (n,)) for n in (5, 9)]
prompts = [PromptInputs(i, None, None, torch.zeros_like(i, dtype=torch.int)) for i in ids]
batch = collate_prompts(prompts, pad_id=spec.special_tokens.pad_token_id)
with torch.no_grad():
    feats = vision_encode(model, batch.pixel_values, batch.image_grid_thw)  # none: text only
    prefix = prefix_forward(model, batch, feats, grad=False)
    session = DecodeEngine(model).start(prefix, G, R, 0.0, 1.0, None, eos_id=-1)
    session.advance(2)
    session.advance()
    tokens, logprobs, lengths = session.result()
    # the reference: each prompt alone, one full forward of the LLM per greedy token
    want_tokens, want_logprobs = [], []
    for p in ids:
        seq, lps = p, []
        for _ in range(R):
            hidden = model.model.language_model(input_ids=seq[None]).last_hidden_state
            logp = model.lm_head(hidden[0, -1]).float().log_softmax(-1)
            nxt = logp.argmax()
            lps.append(float(logp[nxt]))
            seq = torch.cat([seq, nxt[None]])
        want_tokens += [seq[len(p):].tolist()] * G
        want_logprobs += [lps] * G
above = sorted(m for m in sys.modules if m.startswith(tuple(sys.argv[1:])))
print(json.dumps({
    "tokens": tokens.tolist(), "want_tokens": want_tokens,
    "logprobs": logprobs.tolist(), "want_logprobs": want_logprobs,
    "lengths": lengths.tolist(), "above": above,
}))
"""


def test_the_engine_decodes_without_the_backend_runtime_or_jobs():
    done = subprocess.run(
        [sys.executable, "-c", DECODE, *ABOVE_ENGINE],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["above"] == []
    assert out["tokens"] == out["want_tokens"]
    assert out["lengths"] == [5] * 4
    for got, want in zip(out["logprobs"], out["want_logprobs"], strict=True):
        assert got == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("module", ["rollplex.engine", "rollplex.engine.phases",
                                    "rollplex.engine.triton_support"])  # fmt: skip
def test_the_package_and_its_torch_free_helpers_import_no_torch(module):
    """The runtime's callbacks and the train job's knob checks import these before any
    model code: importing them must not cost torch's start-up."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m == 'torch'))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
