"""rollplex: move response-independent prefix work into the decode window.

Prefix work that needs only prompts and weights is cut into row chunks and placed by
piggyback (rides decode steps), streams or SM partitions. `overlap=auto` keeps, per
candidate, the placement that most lowers the replayed step, and keeps serial+dedup unless
overlap wins `schedule.overlap_min_gain`. Search rules: docs/architecture.md (Schedules).
"""

from __future__ import annotations

from collections.abc import Callable

from rollplex.graph.ir import Op, Phase
from rollplex.graph.schema import get_kind
from rollplex.ops.costs import cost_key
from rollplex.planner.cost_model import Timing
from rollplex.planner.layout import rows_chunks
from rollplex.planner.placement import PlanBuilder
from rollplex.planner.plan import CoRun, Plan
from rollplex.planner.schedules.common import (
    CachedTimer,
    PlanningContext,
    ordered,
    packed_notes,
    packed_order,
    serial_timings,
)
from rollplex.planner.schedules.serial import plan_serial
from rollplex.planner.schedules.trials import Piece, TrialPlans
from rollplex.planner.simulate import replay

MODES = {
    "piggyback": (CoRun.PIGGYBACK,),
    "streams": (CoRun.STREAMS,),
    "sm_partition": (CoRun.PARTITION,),
    "none": (),
    "auto": (CoRun.PIGGYBACK, CoRun.STREAMS, CoRun.PARTITION),
}


DECODE, SIDE = 2, 3  # the decode and side streams' ids (after compute and copy)
TRIAL_OPS = 250_000  # op placements auto may spend on trials (each trial builds every op)


def plan_rollplex(ctx: PlanningContext, evaluate: Callable[[Plan], float] | None = None) -> Plan:
    """`evaluate` scores a candidate plan (default: replayed step time); the API passes
    one that also settles memory, so overlap that needs offloads pays for them."""
    n = ctx.hardware.num_gpus
    timer = ctx.timer(n, n)
    order = ordered(ctx, timer)
    # the decode window: a decode, or an engine's whole rollout (planner/capabilities.py)
    decode = next((op for op in order if op.kind in ("decode", "generate")), None)
    score = evaluate or (lambda p: replay(p, ctx.interference))
    if decode is None:
        score(_build(ctx, timer, order, decode, {}))
        best = plan_serial(ctx, "rollplex", timer, order)
        best.notes.append("no decode op: nothing to overlap, serial placement")
        return best
    # Trials are scored on plans built from shared steps where the score needs no
    # lifetimes (trials.py); the plan that wins is built in full at the end.
    quick = getattr(evaluate, "unshared", None) if evaluate else score
    pos = {op.name: i for i, op in enumerate(order)}

    def window(choice: dict[str, CoRun]) -> list[Piece]:
        overlapped = [order[pos[name]] for name in sorted(choice, key=pos.__getitem__)]
        return _window(ctx, timer, overlapped, decode, choice)

    lean = TrialPlans(ctx, timer, order, decode, window)

    def attempt(choice: dict[str, CoRun]) -> tuple[float, Plan | None]:
        """The choice's score, and its plan where it had to be built in full."""
        trial = lean.plan(choice) if quick is not None else None
        t = quick(trial) if trial is not None else None
        if t is not None:
            return t, None
        full = _build(ctx, timer, order, decode, choice)
        return score(full), full

    best_time, best = attempt({})
    best_choice: dict[str, CoRun] = {}
    chosen: dict[str, CoRun] = {}
    notes: list[str] = []
    before = {op.name for op in order[: order.index(decode)]}
    forced = ctx.schedule.overlap != "auto"
    trials = max(1, TRIAL_OPS // max(1, len(ctx.graph)))
    twins: dict[tuple, CoRun | None] = {}  # twin key -> placement kept (None: stayed serial)
    untried = 0  # candidates the budget left out
    for op in _candidates(ctx, order, decode):
        pick = None
        producers = {p.name for v in op.inputs.values() if (p := ctx.graph.producer(v))}
        if not producers <= before | set(chosen):
            continue  # needs work that only runs after the decode
        twin = (cost_key(ctx.graph, op), tuple(ctx.graph.weights_read(op).values()))
        modes = _modes(ctx, op, decode)
        if not forced and twin in twins:
            modes = () if twins[twin] is None else (twins[twin],)
        if not trials and modes:
            untried += 1
            if forced:  # an ablation places it anyway; the final plan is scored below
                chosen[op.name] = modes[0]
                notes.append(f"{op.name}: {modes[0].value} (untried)")
            continue
        for mode in modes:
            if not trials:
                break
            trials -= 1
            trial_choice = {**chosen, op.name: mode}
            t, trial = attempt(trial_choice)
            if forced or t < best_time * (1 - 1e-6):
                best_time, best, best_choice, pick = t, trial, trial_choice, mode
                if forced:
                    break
        twins[twin] = pick
        if pick is not None:
            chosen[op.name] = pick
        notes.append(
            f"{op.name}: {pick.value if pick else 'serial'} (step {best_time * 1e3:.1f} ms)"
        )
    if untried and forced:
        best_time, best = attempt(chosen)
        best_choice = chosen
        notes.append(f"trial budget spent: {untried} placed untried, step {best_time * 1e3:.1f} ms")
    elif untried:
        notes.append(f"trial budget spent: {untried} more candidates stay serial untried")
    if not forced:
        # The serial+dedup plan is a candidate too: when overlap gains nothing (or its
        # decode stream and arena cost more memory than it saves time), it is the plan.
        serial = plan_serial(ctx, "rollplex", timer, order)
        serial_time = score(serial)
        gain = ctx.schedule.overlap_min_gain
        if serial_time * (1 - gain) <= best_time:
            notes.append(
                f"serial+dedup placement kept: step {serial_time * 1e3:.1f} ms, best overlap "
                f"{best_time * 1e3:.1f} ms (overlap_min_gain {gain:.1%})"
            )
            best = serial
    if best is None:  # scored on a trial plan: build it
        best = _build(ctx, timer, order, decode, best_choice)
        score(best)
    best.notes.extend(notes)
    return best


def _candidates(ctx: PlanningContext, order: list[Op], decode: Op) -> list[Op]:
    after_decode = _descendants(ctx, decode)
    return [
        op
        for op in order
        if op.phase in (Phase.REFERENCE, Phase.TRAIN)
        and get_kind(op.kind).prefix
        and op.name not in after_decode
    ]


def _descendants(ctx: PlanningContext, op: Op) -> set[str]:
    """Names of the ops that read what `op` makes, directly or through others."""
    readers: dict[str, list[Op]] = {}
    for other in ctx.graph:
        for v in other.inputs.values():
            readers.setdefault(v, []).append(other)
    seen: set[str] = set()
    stack = [op]
    while stack:
        for v in stack.pop().outputs.values():
            for reader in readers.get(v, ()):
                if reader.name not in seen:
                    seen.add(reader.name)
                    stack.append(reader)
    return seen


def _modes(ctx: PlanningContext, op: Op, decode: Op) -> tuple[CoRun, ...]:
    modes = MODES[ctx.schedule.overlap]
    if not decode.meta.get("piggyback_rows", True):  # the rollout role cannot host rows
        modes = tuple(m for m in modes if m is not CoRun.PIGGYBACK)
    same_weights = set(ctx.graph.weights_read(op).values()) <= set(
        ctx.graph.weights_read(decode).values()
    )
    return tuple(m for m in modes if m is not CoRun.PIGGYBACK or same_weights)


def _build(
    ctx: PlanningContext,
    timer: CachedTimer,
    order: list[Op],
    decode: Op | None,
    choice: dict[str, CoRun],
) -> Plan:
    pb = PlanBuilder("rollplex", ctx.graph, ctx.graph_hash)
    n = ctx.hardware.num_gpus
    dev = pb.device("colocated", list(range(n)), tp=timer.rollout.tp, dp=timer.rollout.dp)
    partitioned = CoRun.PARTITION in choice.values()
    f = ctx.schedule.decode_sm_fraction
    pb.stream(dev, "compute")
    pb.stream(dev, "copy")
    pb.stream(dev, "decode", partition=f if partitioned else None)  # DECODE
    pb.stream(dev, "prefix", partition=(1 - f) if partitioned else None)  # SIDE
    overlapped = [op for op in order if op.name in choice]
    window = _window(ctx, timer, overlapped, decode, choice) if decode is not None else []
    order, packed = packed_order(ctx, order, apart=choice)
    timings = serial_timings(timer, order, packed)
    for op in order:
        if op.name in choice:
            continue  # issued beside the decode
        if op is not decode:
            t = timings.get(op.name) or timer(op)
            pb.add(dev, 0, op, t.seconds, t.rate_class, scratch_bytes=t.scratch_bytes)
            continue
        first = None
        for o, stream, solo, rate, chunk, chunks, corun, scratch, after in window:
            step = pb.add(
                dev,
                stream,
                o,
                solo,
                rate,
                chunk=chunk,
                chunks=chunks,
                after=[first] if after and first else None,
                corun=corun,
                scratch_bytes=scratch,
            )
            if o is decode:
                first = first or step
    pb.plan.notes += packed_notes(packed)
    return pb.plan


def _ride_s(ctx: PlanningContext, t: Timing, step_s: float) -> float:
    """What a chunk of `t` adds to the decode step it rides: the share of its compute that
    the step's GEMMs do not hide (the interference curve), and all that its roofline does
    not hold (its kernel launches, fixed seconds and dispatch), which the host pays in the
    ride as it would alone. Priced on compute alone, a 3B training prefix chunk planned at
    1 ms measured 59-70 ms on an H100 (bench/results/peers/h100_3b_easyvqa)."""
    roofline = max(t.compute_s, t.memory_s)
    return ctx.interference.piggyback_extra(t.compute_s / step_s) * t.compute_s + (
        t.seconds - roofline
    )


def _chunks(ctx: PlanningContext, timer: CachedTimer, op: Op) -> int:
    rows_value = ctx.graph.values[op.inputs.get("features", op.inputs.get("pixels"))]
    rows = max(1, rows_value.shape[0] // timer.train.dp)
    tokens = rows_value.shape[1] + (
        ctx.graph.values[op.inputs["text"]].shape[1] if "text" in op.inputs else 0
    )
    # never coarser than its micro-batches: a chunk runs whole (and one riding a decode
    # step cannot be cut), so the chunks bound its scratch as the micro-batches would
    micro = min(rows, timer.inner.op_micro_batches(op))
    return max(rows_chunks(rows, tokens, ctx.schedule.chunk_tokens), micro)


def _window(
    ctx: PlanningContext,
    timer: CachedTimer,
    overlapped: list[Op],
    decode: Op,
    choice: dict[str, CoRun],
) -> list[Piece]:
    """The decode window's steps, in issue order: decode cut into segments with the
    piggybacked chunks riding them (decode stream), the other overlapped ops' chunks on
    the side stream, issued once decode has begun so they never delay the prefill.
    `overlapped`: the chosen ops in priority order."""
    t_dec = timer(decode)
    riders = [op for op in overlapped if choice[op.name] is CoRun.PIGGYBACK]
    pieces = [
        (op, i, _chunks(ctx, timer, op)) for op in riders for i in range(_chunks(ctx, timer, op))
    ]
    segments = len(pieces) + 1
    seg_s = t_dec.seconds / segments
    # a chunk rides one decode step: its compute against that one step's time
    step_s = t_dec.seconds / max(1, ctx.graph.values[decode.outputs["responses"]].shape[1])
    eager_step_s = timer.inner.eager_decode_step_s()  # a ridden step leaves its graph
    out: list[Piece] = []
    for k in range(segments):
        out.append(
            (
                decode,
                DECODE,
                seg_s,
                "bandwidth",
                k,
                segments,
                CoRun.NONE,
                t_dec.scratch_bytes,
                False,
            )
        )
        if k < len(pieces):
            op, i, c = pieces[k]
            t = timer(op, c)
            extra = _ride_s(ctx, t, step_s) + eager_step_s
            out.append(
                (op, DECODE, extra, "bandwidth", i, c, CoRun.PIGGYBACK, t.scratch_bytes, False)
            )
    for op in overlapped:
        if choice[op.name] is CoRun.PIGGYBACK:
            continue
        c = _chunks(ctx, timer, op)
        t = timer(op, c)
        for i in range(c):
            out.append(
                (op, SIDE, t.seconds, "compute", i, c, choice[op.name], t.scratch_bytes, True)
            )
    return out
