"""Happens-before between the steps of one device group: stream order plus events.

Memory reuse across streams is safe only along these edges: bytes a step frees may be
written by another step only if that step is ordered after it. The predicted times say
when things happen; this says what is guaranteed to have happened.
"""

from __future__ import annotations

from rollplex.planner.plan import DevicePlan


def ordered_before(dev: DevicePlan, pos: dict[int, int]) -> dict[int, dict[int, int]]:
    """For each step: per stream, the latest step it follows (itself on its own stream),
    through stream order and the events it waits on."""
    by_index = {s.index: s for s in dev.steps}
    signaller = {s.signals: s.index for s in dev.steps if s.signals is not None}
    preds: dict[int, list[int]] = {i: [] for i in by_index}
    for st in dev.streams:
        for a, b in zip(st.steps, st.steps[1:], strict=False):
            preds[b].append(a)
    for s in dev.steps:
        preds[s.index] += [signaller[e] for e in s.waits if e in signaller]
    out: dict[int, dict[int, int]] = {}
    pending = {i: len(p) for i, p in preds.items()}
    succs: dict[int, list[int]] = {i: [] for i in by_index}
    for i, p in preds.items():
        for j in p:
            succs[j].append(i)
    ready = [i for i, n in pending.items() if n == 0]
    while ready:
        i = ready.pop()
        mine = {by_index[i].stream: i}
        for j in preds[i]:
            for stream, k in out[j].items():
                if stream not in mine or pos[k] > pos[mine[stream]]:
                    mine[stream] = k
        out[i] = mine
        for j in succs[i]:
            pending[j] -= 1
            if not pending[j]:
                ready.append(j)
    return out


def side_windows(
    dev: DevicePlan,
    side_lanes: set[int],
    begin: dict[int, int],
    until: dict[int, int],
    end: int,
    main: int = 0,
) -> dict[int, tuple[int, int]]:
    """For each side stream: the positions over which the main stream may not reuse its
    bytes. From the end of the last main-stream step that the side stream's first step is
    ordered after, to the start of the first main-stream step ordered after its last
    step (the whole step when there is none)."""
    pos = {i: k for st in dev.streams for k, i in enumerate(st.steps)}
    before = ordered_before(dev, pos)
    main_steps = next((st.steps for st in dev.streams if st.stream == main), [])
    out: dict[int, tuple[int, int]] = {}
    for st in dev.streams:
        if st.stream not in side_lanes or not st.steps:
            continue
        first, last = st.steps[0], st.steps[-1]
        hb = before.get(first, {}).get(main)
        lo = 0 if hb is None else until[hb] + 1
        after = next(
            (
                s
                for s in main_steps
                if (k := before[s].get(st.stream)) is not None and pos[k] >= pos[last]
            ),
            None,
        )
        hi = end if after is None else begin[after] - 1
        out[st.stream] = (min(lo, begin[first]), max(hi, until[last]))
    return out
