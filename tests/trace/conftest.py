"""A small two-device timeline in which decode overlaps prefix and reference work."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollplex.trace import MemoryEvent, Span, Timeline

STEP_US = 10_000.0
STREAMS = {7: "decode", 13: "prefix", 20: "train"}
GIB = 1 << 30
# Per step: (stream, name, start, dur, phase). Decode runs in four chunks on stream 7 while
# prefix and reference work run on streams 13 and 20.
OPS = [
    (13, "vision_encode", 0, 1_500, "rollout"),
    (13, "prefix_prefill", 1_500, 2_500, "rollout"),
    *[(7, "decode", 4_000 + 1_200 * k, 1_200, "rollout") for k in range(4)],
    (20, "ref_logprob_prefix", 4_200, 3_000, "reference"),
    (13, "actor_logprob_prefix", 4_500, 3_500, "train"),
    (20, "backward", 9_000, 700, "train"),
    (20, "optimizer_step", 9_700, 250, "train"),
]
# Per step: (time, addr, delta, allocating op): KV cache and prefix activations, then frees.
ALLOCS = [
    (4_000.5, 0x1000, 8 * GIB, "decode"),
    (4_300, 0x9000, 2 * GIB, "ref_logprob_prefix"),
    (7_300, 0x9000, -2 * GIB, ""),
    (8_900, 0x1000, -8 * GIB, ""),
]


def make_timeline(label: str = "planned", skew: float = 1.0) -> Timeline:
    """Two steps on devices 0 and 1; device 1's durations are scaled by `skew`."""
    spans, memory, steps = [], [], []
    for step in range(2):
        t0 = step * STEP_US
        steps.append((t0, t0 + STEP_US))
        for device in (0, 1):
            k = skew if device else 1.0
            for stream, name, start, dur, phase in OPS:
                args = {"tokens": 128}
                spans.append(Span(device, stream, name, t0 + start, dur * k, "kernel", phase, args))
            spans.append(Span(device, 7, "reward", t0 + 8_900, 100, cat="cpu_op"))  # host only
            total = GIB  # weights stay resident
            for t, addr, delta, name in ALLOCS:
                total += delta
                memory.append(MemoryEvent(device, t0 + t, addr, delta, total, 12 * GIB, name))
    names = {(d, s): n for d in (0, 1) for s, n in STREAMS.items()}
    return Timeline(label, spans, memory, steps, names, "NVIDIA H200", 141 * GIB)


@pytest.fixture(scope="session")
def timeline_factory() -> Callable[..., Timeline]:
    return make_timeline


@pytest.fixture
def timeline() -> Timeline:
    return make_timeline()
