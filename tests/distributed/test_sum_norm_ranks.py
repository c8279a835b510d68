"""seq-mean-token-sum-norm on 2 FSDP ranks trains what one process trains: the loss is a
sum over every token divided by a constant, so each rank's share is the world size (not
its share of the tokens or sequences, as for the mean modes). Tolerance and its reason:
test_equivalence.py. The runs are conftest's sweeps' 'sum-norm' jobs (2 steps each)."""

from __future__ import annotations

import csv

from tests.distributed.conftest import weights
from tests.distributed.test_equivalence import _assert_close


def _rows(run):
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_two_ranks_train_what_one_process_trains_under_sum_norm(runs1, runs2):
    one, two = runs1("sum-norm"), runs2("sum-norm")
    a, b = _rows(one), _rows(two)
    assert [r["reward"] for r in a] == [r["reward"] for r in b]
    for x, y in zip(a, b, strict=True):
        for k in ("loss", "pg_loss", "loss_kl"):
            assert abs(float(x[k]) - float(y[k])) < 1e-6, (k, x[k], y[k])
    _assert_close(weights(one, 2), weights(two, 2))
