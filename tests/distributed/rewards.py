"""A reward with a learning signal from random weights, for the distributed tests: about
half of a random model's responses earn it, so every step has nonzero advantages."""

from __future__ import annotations

from rollplex.data.sample import Sample


def even_length(response: str, sample: Sample) -> float:
    return float(len(response) % 2 == 0)
