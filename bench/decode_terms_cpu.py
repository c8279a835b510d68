"""The rollout decode's pricing (ops/formulas/decode.py) with each step's fixed terms
computed once (`DecodeStepTerms`, as it is), beside pricing each step through
`decode_step` (two Costs a step, as before): every model preset x workload preset x TP 1, 2,
4 and 8, in alternating order on CPU. The two give the same floats (checked here too).

    python bench/decode_terms_cpu.py --rounds 6 --md bench/results/decode_terms_cpu.md
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ab import pair_parser, pair_report, timed_rounds

from rollplex.ops.formulas import decode
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, ModelSpec

POINTS = [(m, w, tp) for m in MODEL_PRESETS.values() for w in WORKLOAD_PRESETS.values()
          for tp in (1, 2, 4, 8)]  # fmt: skip


@dataclass(slots=True)
class PerStepCosts:
    """DecodeStepTerms' interface, each step priced by `decode_step` (the loop before)."""

    model: ModelSpec
    tp: int

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> PerStepCosts:
        return cls(model, tp)

    def fields(self, batch: float, context: float) -> tuple[float, float, float, float, float]:
        c = decode.decode_step(self.model, batch, context, self.tp)
        return c.flops, c.bytes_read, c.bytes_written, c.weight_bytes, c.transient_bytes


@contextmanager
def terms(per_step: bool) -> Iterator[None]:
    """decode_rollout prices its steps through PerStepCosts while inside, if `per_step`."""
    real = decode.DecodeStepTerms
    decode.DecodeStepTerms = PerStepCosts if per_step else real  # type: ignore[misc]
    try:
        yield
    finally:
        decode.DecodeStepTerms = real  # type: ignore[misc]


def price_all(per_step: bool) -> list[decode.DecodeRollout]:
    with terms(per_step):
        return [decode.decode_rollout(m, w, w.prompts_per_step, tp=tp) for m, w, tp in POINTS]


def seconds(per_step: bool) -> float:
    start = time.perf_counter()
    price_all(per_step)
    return time.perf_counter() - start


def main() -> None:
    ap = pair_parser(__doc__)
    args = ap.parse_args()
    assert price_all(False) == price_all(True), "the two pricings differ"
    t = timed_rounds({"per_step": lambda: seconds(True), "terms": lambda: seconds(False)},
                     args.rounds)  # fmt: skip
    pair_report(
        "A rollout decode's pricing: fixed terms once, against two Costs a step (CPU)",
        f"each figure one pricing of {len(POINTS)} rollouts: every model and workload "
        "preset at TP 1, 2, 4 and 8; both give the same floats",
        ("decode_step a step", t["per_step"]),
        ("DecodeStepTerms", t["terms"]),
        args.md,
        per="pricing of the presets",
    )


if __name__ == "__main__":
    main()
