"""Bench rewards with a set share of dead groups (every response of the prompt scored the
same), for timing algo.skip_zero_advantage on a random-weight model, whose task rewards are
all 0 (every group dead): `reward.components=[{name: 'bench.dead_groups:half', ...}]`.

A prompt is dead when its row index (the sample uid's last field) falls in the share; a live
prompt's responses score their character count's parity, so a group of G all-equal scores
(dead by chance) has probability 2^(1-G). The runs log the rows they trained
(`trained_rows` in metrics.csv), which is the share to read, not this nominal one.
"""

from __future__ import annotations

from rollplex.data import Sample


def _scored(response: str, sample: Sample, dead_in_8: int) -> float:
    row = int(sample.uid.rsplit(":", 1)[1])
    if row % 8 < dead_in_8:
        return 0.0
    return float(len(response) % 2)


def none(response: str, sample: Sample) -> float:
    return _scored(response, sample, 0)


def quarter(response: str, sample: Sample) -> float:
    return _scored(response, sample, 2)


def half(response: str, sample: Sample) -> float:
    return _scored(response, sample, 4)


def three_quarters(response: str, sample: Sample) -> float:
    return _scored(response, sample, 6)
