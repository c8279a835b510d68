"""How co-running work shares one GPU: the rates each side keeps.

A rate is the fraction of its solo speed a step keeps while the other side runs: plain
streams, SM partitions, and piggybacked rows each have their own. The defaults are FACTS.md's
H200 measurements, not tuned to any paper; the reasoning is in docs/architecture.md (Planner).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from rollplex.planner.plan import CoRun


@dataclass(slots=True, frozen=True)
class InterferenceModel:
    streams_decode_rate: float = 0.65  # 1 / 1.54
    streams_other_rate: float = 0.36  # pair throughput 1.01x serial
    partition_saturation: float = 0.61  # decode on f SMs keeps min(1, f / 0.61): 64 SMs -> 1/1.26
    partition_contention: float = 0.77  # both sides, while the other partition is busy
    # (compute time per decode step / decode step time, extra time / compute time)
    piggyback_curve: tuple[tuple[float, float], ...] = (
        (0.0, 0.15),
        (0.49, 0.21),
        (0.98, 0.26),
        (1.95, 0.38),
        (4.0, 0.7),
        (8.0, 1.0),
    )

    def pair_rates(self, mode: CoRun, decode_fraction: float | None = None) -> tuple[float, float]:
        """(decode rate, other rate) while a compute-bound op runs beside decode."""
        if mode is CoRun.STREAMS:
            return self.streams_decode_rate, self.streams_other_rate
        if mode is CoRun.PARTITION:
            f = 0.5 if decode_fraction is None else decode_fraction
            c = self.partition_contention
            return min(1.0, f / self.partition_saturation) * c, (1 - f) * c
        return 1.0, 0.0  # NONE: the other side does not run beside decode

    def partition_solo_rate(self, fraction: float, bandwidth_bound: bool) -> float:
        """Rate of a step confined to `fraction` of the SMs while nothing else runs."""
        if bandwidth_bound:
            return min(1.0, fraction / self.partition_saturation)
        return fraction

    def piggyback_extra(self, compute_ratio: float) -> float:
        """Extra decode time per unit of piggybacked compute time."""
        xs = [x for x, _ in self.piggyback_curve]
        ys = [y for _, y in self.piggyback_curve]
        if compute_ratio >= xs[-1]:
            return ys[-1]
        i = max(1, bisect_left(xs, compute_ratio))
        t = (compute_ratio - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + t * (ys[i] - ys[i - 1])

    def overlap_gain(
        self, mode: CoRun, decode_s: float, work_s: float, decode_fraction: float | None = None
    ) -> float:
        """Seconds saved by running `work_s` of prefix work beside `decode_s` of decode
        (fluid model), against running them back to back. Negative: overlap loses."""
        rd, rp = self.pair_rates(mode, decode_fraction)
        if rp <= 0:
            return 0.0
        overlap = min(work_s / rp, decode_s / rd)  # until either side runs out
        done_work, done_decode = overlap * rp, overlap * rd
        together = overlap + (decode_s - done_decode) + (work_s - done_work)
        return decode_s + work_s - together
