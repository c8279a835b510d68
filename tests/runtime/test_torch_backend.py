"""Backend pieces the plan relies on: resumable decode, row chunks, moves, checks."""

from __future__ import annotations

import itertools

import pytest
import torch

from rollplex.backends.base import BackendError, Chunk
from rollplex.backends.torch.decode import DecodeSession, decode
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.rows import row_ranges, text_only
from rollplex.backends.torch.values import Pixels
from rollplex.engine.prefix import expand_prefix, prefix_forward
from rollplex.graph.ir import Op, Phase
from tests.runtime.conftest import MODEL, WORKLOAD


@pytest.fixture(scope="module")
def setup():
    from rollplex.backends.torch.data import TaskData
    from rollplex.backends.torch.roles import features_of

    model = build_model(MODEL, seed=0)
    batch = TaskData(MODEL, WORKLOAD, seed=0).step(0).batch
    with torch.no_grad():
        feats = features_of(model, Pixels.of(batch))
        state = expand_prefix(prefix_forward(model, text_only(batch), feats.values, False), 4)
    return model, batch, feats, state


@pytest.mark.parametrize("splits", [[1, 1, 1, 1, 1, 1], [2, 4], [5, 1], [0, 3, 0, 3]])
def test_segmented_decode_draws_the_same_tokens(setup, splits):
    model, _, _, state = setup
    eos = MODEL.special_tokens.eos_token_id
    whole = decode(model, state, 6, 1.0, 1.0, torch.Generator().manual_seed(3), eos)
    s = DecodeSession(model, state, 6, 1.0, 1.0, torch.Generator().manual_seed(3), eos)
    for k in splits:
        s.advance(k)
    s.advance()  # whatever is left
    out = s.result()
    assert torch.equal(out.tokens, whole[0]) and torch.equal(out.logprobs, whole[1])
    assert torch.equal(out.lengths, whole[2])
    with pytest.raises(RuntimeError, match="still has"):
        DecodeSession(model, state, 6, 1.0, 1.0, None, eos).result()


def test_row_ranges_cover_every_row_once():
    for rows in range(1, 9):
        for n in range(1, rows + 1):
            r = row_ranges(rows, n)
            assert r[0][0] == 0 and r[-1][1] == rows and len(r) == n
            assert all(a[1] == b[0] and a[1] > a[0] for a, b in itertools.pairwise(r))
    with pytest.raises(BackendError):
        row_ranges(2, 3)


def test_chunked_prefill_is_bit_identical(setup):
    from rollplex.backends.step import StepConfig
    from rollplex.runtime.compose import compose
    from tests.runtime.conftest import ALGO

    _, batch, feats, _ = setup
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    handle = backend.trainer.handle()
    op = Op(
        "rollout.prefix_prefill",
        "prefix_prefill",
        Phase.ROLLOUT,
        {"features": "f", "text": "t", "weights": "w"},
        {"kv": "kv"},
    )
    x = {"features": feats, "text": text_only(batch), "weights": handle}
    whole = backend.run_op(op, x, Chunk(), {}).outputs["kv"]
    carry: dict = {}
    for i in range(3):
        out = backend.run_op(op, x, Chunk(i, 3), carry)
        assert bool(out.outputs) == (i == 2) and out.reads == {"weights": "policy@0"}
    merged = out.outputs["kv"]
    assert torch.equal(merged.last_logits, whole.last_logits)
    for a, b in zip(merged.cache.layers, whole.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    # Offload and onload are real copies that compare equal.
    host = backend.move(merged, to_host=True)
    back = backend.move(host, to_host=False)
    assert back.last_logits.data_ptr() != merged.last_logits.data_ptr()
    assert torch.equal(back.last_logits, merged.last_logits)
