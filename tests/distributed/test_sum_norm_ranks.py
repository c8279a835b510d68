"""seq-mean-token-sum-norm on 2 FSDP ranks trains what one process trains: the loss is a
sum over every token divided by a constant, so each rank's share is the world size (not
its share of the tokens or sequences, as for the mean modes). Tolerance and its reason:
tests/distributed/test_equivalence.py."""

from __future__ import annotations

import csv

import pytest

from tests.distributed.conftest import train, weights
from tests.distributed.test_equivalence import _assert_close

NORM = ("algo.loss_agg_mode=seq-mean-token-sum-norm", "algo.loss_scale_factor=8")


def _rows(run):
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # a 1-process and a 2-rank run of 2 steps: ~80 s on 2 cores
def test_two_ranks_train_what_one_process_trains_under_sum_norm(tmp_path):
    one = train(1, tmp_path / "one", 2, *NORM)
    two = train(2, tmp_path / "two", 2, *NORM)
    a, b = _rows(one), _rows(two)
    assert [r["reward"] for r in a] == [r["reward"] for r in b]
    for x, y in zip(a, b, strict=True):
        for k in ("loss", "pg_loss", "loss_kl"):
            assert abs(float(x[k]) - float(y[k])) < 1e-6, (k, x[k], y[k])
    _assert_close(weights(one, 2), weights(two, 2))
