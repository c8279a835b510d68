"""The dispatch's forwards: prefix ops (vision, prefill, prefix scoring) in the plan's row
chunks or micro-batches, scoring over responses, and the attaches that take a rollout op's
exports in place of a training forward (prefill once, decode once).

A prefix op's row chunk i of n runs rows `row_ranges(rows, n)[i]` with the LM head
deferred, and the last chunk merges all parts through the role's `merge_rows`. A forward
the plan priced in micro-batches (`op_micro_batches`: vision, prefix and no-grad scoring
forwards, ops/micro_batches.py) runs the same way inside its one step, over
`micro_ranges(units, count)` of whole units (a prompt's group on its shared prefix K/V for
`logprob_response`), so its scratch is one range's. Fewer rows may round differently in
the matrix products: cut results equal whole ones to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollplex.backends.base import BackendError, Chunk, OpResult
from rollplex.backends.torch.row_ranges import live_prompts
from rollplex.backends.torch.rows import row_ranges
from rollplex.graph.ir import Op, Phase
from rollplex.ops.micro_batches import micro_ranges
from rollplex.runtime.dispatch_view import DispatchView

# run(op, inputs, head): one forward over `inputs`, its LM head deferred when head is False
Forward = Callable[[Op, dict[str, Any], bool], dict[str, Any]]


class ForwardOps:
    def __init__(self, dispatch: DispatchView) -> None:
        self.d = dispatch
        self.micro: dict[str, int] = {}  # op -> the plan's micro-batch count (counts > 1)

    # -- prefix ops ---------------------------------------------------------------------
    def prefix_chunk(
        self, op: Op, x: dict[str, Any], chunk: Chunk, carry: dict[str, Any], reads: dict
    ) -> OpResult:
        """A prefix op, or its row chunk (the LM head deferred to the merge); riding the
        live decode's next step when the plan says so and both roles can."""
        d, head = self.d, chunk.count == 1
        note = _prefixes_trained(d.values, x)
        if not head:
            lo, hi = row_ranges(d.values.rows(x), chunk.count)[chunk.index]
            x = _unit_rows(d.values, x, lo, hi, _samples_per_row(d.values, x))
        # a ride's backward recomputes its rows in the plan's micro-batches: a row chunk is
        # one already (planner/schedules/rollplex.py cuts none coarser)
        count = self.micro.get(op.name, 1) if head else 1
        out, deviation = d.rollout_ops.ride(op, x, head, count) if chunk.rides else (None, "")
        if out is None and head:
            out = self._in_micro_batches(op, x, self._prefix)
        elif out is None:
            out = self._prefix(op, x, False)
        if head:
            return OpResult(out, reads, deviation, note)
        carry.setdefault("parts", []).append(out)
        if not chunk.last:
            return OpResult({}, reads, deviation, note)
        return OpResult(d.role(op).merge_rows(carry.pop("parts")), reads, deviation, note)

    def _prefix(self, op: Op, x: dict[str, Any], head: bool = True) -> dict[str, Any]:
        """`head=False` (row chunks): leave the LM head to the merge of all chunks."""
        role = self.d.role(op)
        kw = {} if head else {"head": False}
        if op.kind == "vision_encode":
            return {"features": role.vision_encode(x["pixels"], **_live(x))}
        if op.kind == "prefix_prefill":
            self.d.rollout_ops.check_weights(op, x["weights"])
            if "exported" in op.outputs:  # prefill_once: the training prefix forward too
                if not head:
                    raise BackendError(f"'{op.name}' exports its activations: not in chunks")
                state, exported = role.prefix_prefill_exported(x["features"], x["text"])
                return {"kv": state, "exported": exported}
            return {"kv": role.prefix_prefill(x["features"], x["text"], **kw)}
        if "exported" in op.outputs:  # a no-grad prefix forward that exports (PPO's critic)
            if not head:
                raise BackendError(f"'{op.name}' exports its activations: not in chunks")
            state, exported = role.logprob_prefix_exported(x["features"], x["text"])
            return {"kv": state, "exported": exported}
        out = role.logprob_prefix(x["features"], x["text"], **kw, **_live(x))
        if op.phase is Phase.TRAIN:
            return {"kv": out[0], "saved": out[1]} if "saved" in op.outputs else {"kv": out[0]}
        return {"kv": out}

    # -- forwards over responses ----------------------------------------------------------
    def score(self, op: Op, x: dict[str, Any]) -> dict[str, Any]:
        """`logprob_response` on a prefix, or verl's per-sample `logprob`."""
        role = self.d.role(op)
        if op.name in self.micro:  # scored without grad, in the plan's micro-batches
            return self._in_micro_batches(op, x, lambda o, y, _: {"logprobs": _score(role, o, y)})
        out = _score(role, op, x)
        if op.phase is Phase.TRAIN:
            if "saved" in op.outputs:
                return {"logprobs": out[0], "saved": out[1]}
            return {"logprobs": out[0]}
        return {"logprobs": out}

    def _in_micro_batches(self, op: Op, x: dict[str, Any], run: Forward) -> dict[str, Any]:
        """`run(op, inputs, head)` over all of `x`, or, where the plan priced `op` in micro-
        batches, over each of `micro_ranges(units, count)` with the LM head deferred, the
        parts merged in row order by the role's `merge_rows` (the head then runs on all rows
        at once, as unsplit)."""
        values, count = self.d.values, self.micro.get(op.name, 1)
        if count == 1:
            return run(op, x, True)
        if "kv" in x:  # logprob_response: whole prompts' groups on their prefix K/V
            units = values.row_count(x["kv"])
            g = values.row_count(x["responses"]) // units
        else:
            units, g = values.rows(x), _samples_per_row(values, x)
        parts = [
            run(op, _unit_rows(values, x, lo, hi, g), False)
            for lo, hi in micro_ranges(units, count)
        ]
        return self.d.role(op).merge_rows(parts)

    # -- attaches -----------------------------------------------------------------------
    def attach_prefix(self, op: Op, role: Any, x: dict[str, Any]) -> Any:
        """attach_prefix: the trainer takes the rollout's exported prefill in place of its
        prefix forward, only at the weights version that computed it (the plan proves it
        from the graph; an update in between would make other gradients)."""
        made, reads = getattr(x["exported"], "version", None), x["weights"].name
        if made != reads:
            raise BackendError(
                f"'{op.name}' would attach a prefill of {made} to weights {reads}: "
                "prefill_once needs the version the rollout prefilled with"
            )
        state, _ = role.attach_exported(x["exported"], x["features"], **_live(x))
        return state

    def attach_response(self, op: Op, role: Any, x: dict[str, Any]) -> Any:
        """attach_response: the trainer takes the decode's kept layer outputs in place of
        its response forward, only at the weights version that decoded (decode_once)."""
        made, reads = getattr(x["kept"], "version", None), x["weights"].name
        if made != reads:
            raise BackendError(
                f"'{op.name}' would attach a decode of {made} to weights {reads}: "
                "decode_once needs the version the rollout decoded with"
            )
        out, _ = role.attach_decoded(
            x["kv"], x["responses"], op.attrs.get("group_size", 1), x["kept"], **_live(x)
        )
        return out


def _score(role: Any, op: Op, x: dict[str, Any]) -> Any:
    if op.kind == "logprob_response":
        g = op.attrs.get("group_size", 1)
        return role.logprob_response(x["kv"], x["responses"], g, **_live(x))
    return role.logprob(x["features"], x["text"], x["responses"], **_live(x))


PER_SAMPLE = ("responses", "advantages")  # ports with a row per sample, g to a unit


def _unit_rows(values: Any, x: dict[str, Any], lo: int, hi: int, g: int) -> dict[str, Any]:
    """`x`'s rows of units lo..hi (prompts, or verl's samples): g rows a unit of the
    per-sample ports."""
    rows = {p: values.select(v, lo, hi) for p, v in x.items() if p not in PER_SAMPLE}
    for p in PER_SAMPLE:
        if p in x:
            rows[p] = values.select(x[p], lo * g, hi * g)
    return rows


def _samples_per_row(values: Any, x: dict[str, Any]) -> int:
    """A prefix op's samples a row: its advantages' rows over its prompts (1 without)."""
    return values.row_count(x["advantages"]) // values.rows(x) if "advantages" in x else 1


def _prefixes_trained(values: Any, x: dict[str, Any]) -> str:
    """Where a training prefix op skipped prompts, how many it ran: the plan priced them all,
    so the step is left out of the calibration (as `_trained_note`'s in dispatch.py)."""
    if "advantages" not in x:
        return ""
    prompts = values.rows(x)
    live = live_prompts(x["advantages"], prompts)
    if all(live):
        return ""
    return f"ran {sum(live)} of {prompts} prompts (the others' advantages are 0)"


def _live(x: dict[str, Any]) -> dict[str, Any]:
    """A training forward's advantages, where the graph gave it them: the trainer skips
    the rows of groups whose advantages are all 0 (algo.skip_zero_advantage)."""
    return {"advantages": x["advantages"]} if "advantages" in x else {}


__all__ = ["ForwardOps"]
