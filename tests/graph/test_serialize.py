from __future__ import annotations

from rollplex.graph.ir import Graph
from rollplex.graph.passes import DEDUP_PASSES, run_passes
from rollplex.graph.serialize import from_json, stable_hash, to_json


def test_json_round_trip_keeps_hash(grpo_7b: Graph) -> None:
    for g in (grpo_7b, run_passes(grpo_7b, DEDUP_PASSES)[0]):
        back = from_json(to_json(g))
        assert stable_hash(back) == stable_hash(g)
        assert to_json(back) == to_json(g)
        assert [o.name for o in back.topo_order()] == [o.name for o in g.topo_order()]


def test_hash_changes_with_meaning(grpo_7b: Graph) -> None:
    g = grpo_7b.copy()
    g.ops["train.policy_loss"].attrs["kl_coef"] = 0.5
    assert stable_hash(g) != stable_hash(grpo_7b)


def test_hash_ignores_meta(grpo_7b: Graph) -> None:
    g = grpo_7b.copy()
    g.ops["train.policy_loss"].meta["note"] = "annotation only"
    assert stable_hash(g) == stable_hash(grpo_7b)
