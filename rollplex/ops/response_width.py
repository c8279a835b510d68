"""Response columns per row that a scoring op runs: the width the runtime pads its rows to.

With schedule.pack_responses (the default), every scorer below runs on the rows' real
tokens packed (backends/torch/packed_rows.py, packed_attention.py) and pays each row's own
response tokens (`mean_width`, costs.py); attention alone still runs the padded layout, a
small share of the FLOPs. Without it, the torch backend (and FSDP2's trainer, which wraps
it) scores responses on [rows, width] tensors right-padded to a common width, and pays for
every column:
- a forward with grad (the trainer's, the critic's in training) runs in the step's training
  micro-batches, each on the columns up to its own rows' longest response
  (backends/torch/trim.py `trimmed`, from micro.py); its backward, and its forward run again
  inside the backward (recompute, fused), the same: `trimmed_width`;
- a no-grad response part (reference, old-policy scorer, the critic's old values) runs all
  its rows together up to their longest response, zeros after (the same `trimmed`, from
  roles.py `TorchReference.logprob_response` and critic.py): `longest_width` of its rows;
- a no-grad full forward (verl's per-sample one) runs prefix + the longest response of its
  rows through the decoder (full_forward.py `_full_sequences`), its LM head the longest response
  (`trimmed`): `longest_width` of its rows;
- the losses and GAE run elementwise over [rows, cap]; a rule-based reward reads each
  row's own tokens (the mean).

The expected longest of n rows is `ResponseLengthSpec.expected_max(n)` (the n/(n+1)
quantile, as the decode prices the step's longest), never below the mean: one row's
expected length is the mean, which the n/(n+1) quantile (the median at n = 1) can be under.
"""

from __future__ import annotations

from rollplex.ops.micro_batches import micro_ranges
from rollplex.specs.workload import ResponseLengthSpec


def longest(lengths: ResponseLengthSpec, rows: float) -> float:
    """Expected longest response of `rows` rows run together, at most the cap."""
    n = max(1, int(rows))
    return min(float(lengths.max), max(float(lengths.mean), lengths.expected_max(n)))


def longest_width(lengths: ResponseLengthSpec, rows: float) -> int:
    """Columns per row of a forward that runs `rows` rows together to their longest."""
    return max(1, round(longest(lengths, rows)))


def micro_batch_rows(units: int, count: int, rows_per_unit: int) -> list[int]:
    """Rows of each micro-batch the trainer cuts `units` (prompts, whose groups of
    `rows_per_unit` rows stay together, or samples) into: `micro_ranges`, `count`
    near-equal contiguous ranges of at least one unit."""
    ranges = micro_ranges(max(1, int(units)), max(1, int(count)))
    return [rows_per_unit * (hi - lo) for lo, hi in ranges]


def trimmed_width(lengths: ResponseLengthSpec, units: int, count: int, rows_per_unit: int) -> int:
    """Columns per row (rows-weighted over the micro-batches) of a forward run in `count`
    micro-batches, each up to its own rows' longest response."""
    rows = micro_batch_rows(units, count, rows_per_unit)
    return max(1, round(sum(r * longest(lengths, r) for r in rows) / sum(rows)))


def cap_width(lengths: ResponseLengthSpec) -> int:
    """Columns per row of a path that runs the responses' whole padded width."""
    return lengths.max


def mean_width(lengths: ResponseLengthSpec) -> int:
    """Tokens per row of a path that reads each row's own tokens only."""
    return max(1, round(lengths.mean))
