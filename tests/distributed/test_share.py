"""`backend.fsdp.rollout_sync=share`: the TP rollout reads the trainer's shards in place.

Under torchrun on gloo (float32, so the compute copy the rollout aliases is the master
shard itself), after a few optimizer steps, on every rank (share_checks.py):
- every rollout tensor equals the gathered full parameter cut to the algebra's rollout
  layout, bit for bit (and each TP DTensor reassembles to the full parameter);
- the tensors the algebra calls identical lie inside their trainer shard's storage, the
  rest inside the rebuild buffer;
- an in-place change of a trainer shard is read by the rollout with no sync;
- its greedy and sampled tokens equal a gather-and-copy rollout's, logprobs too (TP 1:
  bit for bit; TP: within 1e-5, the all-reduce's summation order).
Two ranks with rollout TP 2 cover aliasing (o/down stored Shard(1) by the trainer),
the all_to_all rebuild (norms, the replicated vision tower) and the TP forward; the
4-rank and TP 1 layouts are slow variants of the same checks.
"""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.fsdp.exchange import fold
from rollplex.specs import MODEL_PRESETS
from rollplex.weights import Copy, Kind, LayoutError
from rollplex.weights.torch_rollout import rollout_sharing, shard_dims, torch_rollout_bytes

PARAMS = 57  # tensors of the tiny Qwen2.5-VL
STEPS = 2  # conftest.CHECKS' --steps
TINY = MODEL_PRESETS["tiny"]


def _share(request, nproc: int, name: str) -> list[dict]:
    """The per-rank reports of conftest.CHECKS[nproc][name] (`views --sync share`)."""
    return request.getfixturevalue(f"checks{nproc}").rank_reports(name)


def _expected(world: int, tp: int, rank: int, spec=TINY, dtype="float32") -> tuple[int, int]:
    """(aliased tensors, their bytes) the algebra promises on `rank` (tied lm_head: 0)."""
    sharing = rollout_sharing(spec, world, tp, dtype)
    shares = [s for s in sharing.shares(rank) if s.kind in (Kind.IDENTICAL, Kind.VIEW) and s.host]
    return len(shares), sum(s.nbytes for s in shares)


def _check(reports: list[dict], nproc: int, tp: int, spec=TINY, dtype="float32") -> None:
    for r, rep in enumerate(reports):
        assert rep["world"] == nproc and rep["rank"] == r
        assert rep["checked"] == PARAMS * STEPS  # every tensor, after every step
        assert rep["moved"] > 0  # the updates were real, and the rollout followed them
        n, nbytes = _expected(nproc, tp, r, spec, dtype)
        st = rep["stats"]
        assert rep["aliased"] == n and rep["rebuilt"] == PARAMS - n
        assert st["shared_bytes"] == nbytes + st["placed_bytes"]
        # what the planner can read without torch is what the rank holds
        sharing = rollout_sharing(spec, nproc, tp, dtype)
        predicted = torch_rollout_bytes(sharing, r, cast=dtype != "float32")
        assert predicted == {k: st[k] for k in predicted}
        if dtype == "float32":  # the master shard is the compute copy
            assert st["compute_copy_bytes"] == 0 and st["placed_bytes"] == 0
        assert st["syncs"] == STEPS + 1  # the initial load, then one per step
        assert (rep["live"] is not None) == (n > 0)
        # Same prompts through this rollout and a gather-and-copy one: the same greedy and
        # sampled tokens; logprobs equal with TP 1 (the same values, the same GEMMs), within
        # float32 rounding with TP (row-parallel partial sums are all-reduced).
        d = rep["decode"]
        assert d["greedy_tokens_equal"] and d["sampled_tokens_equal"]
        if dtype == "float32":
            assert d["max_logprob_diff"] == 0.0 if tp == 1 else d["max_logprob_diff"] < 1e-5
        else:  # bfloat16 GEMMs in another split: a few bf16 ulps of a logprob
            assert d["max_logprob_diff"] < 0.05


def test_share_tp2_on_two_ranks(checks2):
    reports = checks2.rank_reports("share-tp2")
    _check(reports, 2, 2)
    st = reports[0]["stats"]
    # The whole LLM is aliased (q/k/v/gate/up/embed/lm_head Shard(0) rows, o/down
    # Shard(1) cols); only the norms and the replicated vision tower are rebuilt.
    assert reports[0]["aliased"] == 22
    assert st["shared_bytes"] + st["rebuild_bytes"] < st["full_copy_bytes"]
    assert st["received_bytes"] > 0 and st["received_bytes"] == st["sent_bytes"]


@pytest.mark.slow
@pytest.mark.parametrize("nproc,tp", [(1, 1), (2, 1), (4, 2)])  # (4, 1): as (2, 1)
def test_share_other_layouts(request, nproc, tp):
    """One rank: every tensor is aliased (a shard is the whole parameter). TP 1 over 2 or
    4 ranks, TP 2 over 4 (FSDP chunks are halves of a TP rank's rows): nothing is aliased,
    everything is rebuilt, and the values still match."""
    reports = _share(request, nproc, f"share-tp{tp}")
    _check(reports, nproc, tp)
    assert all(rep["aliased"] == (PARAMS if nproc == 1 else 0) for rep in reports)


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_share_bf16_compute_copy(checks2, tp):
    """bfloat16 compute (as on GPU): the rollout aliases its own bf16 copy of the shards,
    refreshed by a cast at each sync, and that copy of the shards the algebra places inside
    rebuilt tensors (norms, vision halves; at TP 1 every tensor) *is* those bytes of the
    rebuild buffer: only the other halves travel. Values equal the gathered masters cast
    to bf16, bit for bit. TP 1 costs exactly one full bf16 copy (half of it the shards);
    TP 2 less."""
    reports = checks2.rank_reports(f"share-tp{tp}-bf16")
    _check(reports, 2, tp, dtype="bfloat16")
    for rep in reports:
        st = rep["stats"]
        assert st["placed_bytes"] > 0
        assert st["received_bytes"] == st["rebuild_bytes"]  # the holes, and nothing else
        if tp == 1:
            assert st["compute_copy_bytes"] == 0 and st["extra_bytes"] == st["full_copy_bytes"]
        else:
            assert st["compute_copy_bytes"] > 0 and st["extra_bytes"] < st["full_copy_bytes"]


@pytest.mark.slow
def test_share_tp4_on_four_ranks(checks4):
    """t_r = d_t = 4 (a tiny model with 4 KV heads): the LLM is aliased again."""
    reports = checks4.rank_reports("share-tp4-kv4")
    spec = TINY.model_copy(update={"num_kv_heads": 4})
    _check(reports, 4, 4, spec)
    assert all(rep["aliased"] == 22 for rep in reports)


# -- in-process: errors and the rebuild's folding --------------------------------------
def test_a_layout_the_algebra_cannot_serve_names_the_parameter_and_layouts():
    with pytest.raises(LayoutError) as e:  # 4 TP ranks, 2 KV heads
        rollout_sharing(TINY, 4, 4, "float32").shares(0)
    msg = str(e.value)
    assert "k_proj" in msg and "KV heads" in msg
    assert "train fsdp=4" in msg and "rollout tp=4" in msg
    with pytest.raises(LayoutError, match=r"rollout TP 3 does not divide the 4 training"):
        rollout_sharing(TINY, 4, 3, "float32")
    with pytest.raises(LayoutError, match="k_proj"):  # refused before any model shards
        shard_dims(TINY, 4, 4)


def test_trainer_stores_row_parallel_weights_as_the_rollout_shards():
    dims = shard_dims(TINY, 2, 2)
    assert set(dims.values()) == {1}
    assert sorted({n.split(".")[-2] for n in dims}) == ["down_proj", "o_proj"]
    assert shard_dims(TINY, 2, 1) == {} and shard_dims(TINY, 4, 2) == {}


def test_fold_turns_row_runs_into_one_strided_copy():
    # 4 rows of 8 elements of a row-parallel block read from a (4, 16) shard (float32).
    copies = [Copy(dst=r * 32, gpu=1, param="w", src=r * 64 + 32, nbytes=32) for r in range(4)]
    (g,) = fold("t", copies, 4)
    assert (g.d0, g.s0, g.n, g.count, g.ds, g.ss) == (0, 8, 8, 4, 8, 16)
    src = torch.arange(64.0)
    dst = torch.zeros(32)
    g.dst(dst).copy_(g.src(src))
    assert torch.equal(dst, src.view(4, 16)[:, 8:].flatten())
