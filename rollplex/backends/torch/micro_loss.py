"""The loss over micro-batched values and its backward: one term per micro-batch, weighted
so the terms sum to the whole batch's loss, backpropagated one at a time (micro.py makes
the values; its docstring says how kept, recomputed and fused modes differ)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from rollplex.backends.torch.activations import MicroBatches
from rollplex.backends.torch.loss import micro_batch_weights
from rollplex.backends.torch.values import Loss


def backward_micro_batches(terms: list[Any], micro: MicroBatches) -> None:
    """Backward of each micro-batch's loss term in turn, freeing each graph before the
    next; then once through the forward they share. Gradients accumulate in `.grad`. A
    term may be a callable that makes it (recompute mode: its forward runs right here)."""
    for k, term in enumerate(terms):
        if not micro.trained[k]:  # its rows' gradient is exactly 0: nothing runs
            continue
        if term is None:
            raise RuntimeError(f"micro-batch {k}'s loss was already backpropagated")
        terms[k] = None
        (term() if callable(term) else term).backward()
        micro.release(k)
    micro.boundary.backward()


def backward_loss(loss: Loss) -> None:
    """A loss's backward: its value's, or its micro-batch terms' one by one."""
    if loss.terms is None:
        loss.value.backward()
    else:
        backward_micro_batches(loss.terms, loss.micro)
        if loss.finish is not None:
            loss.finish()


# run(per_token, rows) or, for values that carry an entropy, run(per_token, rows, entropy=)
LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def micro_loss(run: LossFn, values: Any, mode: str, mask: torch.Tensor | None = None) -> Loss:
    """`run(per_token, rows)` -> (loss, metrics) over `values` (TokenLogprobs, maybe
    micro-batched). Micro-batched: the value and metrics are the whole batch's (no grad),
    and one term per micro-batch, weighted so the terms sum to the whole batch's loss
    (`loss_agg_mode` `mode`, over the tokens of `mask`: by default the values' own);
    metrics["train_micro_batches"] says how many. Values that carry the policy's entropy
    pass it to `run` as `entropy=` (each term its micro-batch's)."""
    micro = getattr(values, "micro", None)
    whole = _entropy_kw(getattr(values, "entropy", None))
    if micro is None:  # one forward's values, with grad
        with torch.enable_grad():
            return Loss(*run(values.values, slice(None), **whole))
    with torch.no_grad():
        value, metrics = _whole_batch(run, values, micro)
    weights = micro_batch_weights(values.mask if mask is None else mask, micro.rows, mode)
    if micro.redo is not None:  # each term is made in the backward, after its forward
        terms: list[Any] = [
            partial(_recomputed_term, run, micro, k, w) if micro.trained[k] else None
            for k, w in enumerate(weights)
        ]
    else:
        with torch.enable_grad():
            terms = [
                run(v, slice(lo, hi), **_entropy_kw(micro, k))[0] * w if t else None
                for k, ((lo, hi), v, w, t) in enumerate(
                    zip(micro.rows, micro.logprobs, weights, micro.trained, strict=True)
                )
            ]
    metrics["train_micro_batches"] = torch.tensor(float(sum(micro.trained)))
    loss = Loss(value, metrics, terms, micro)
    if micro.fused:  # the value and metrics above are of zeros: filled after the backward
        loss.finish = partial(_fill_in, run, values, value, metrics)
    return loss


def _fill_in(run: LossFn, values: Any, value: torch.Tensor, metrics: dict) -> None:
    """Fused mode: the whole batch's loss value and metrics, in place, from the values the
    backward's forwards wrote (whoever holds these tensors sees the real ones)."""
    with torch.no_grad():
        real, real_metrics = _whole_batch(run, values, values.micro)
        value.copy_(real)
        for k, v in real_metrics.items():
            metrics[k].copy_(v)


# the loss's own numbers: over every row (an untrained row adds exactly 0 to each)
WHOLE_BATCH = ("loss", "pg_loss", "tokens")


def _whole_batch(
    run: LossFn, values: Any, micro: MicroBatches
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The batch's loss value and metrics, without grad. Where rows went untrained
    (skip_zero_advantage), their logprobs are placeholders: the loss value is still exact
    (their advantage is 0, so is their term), but the other metrics (entropy, ratio, clip
    fractions, KL) are the trained rows' (NaN when none trained); `trained_rows` counts them."""
    value, metrics = run(values.values, slice(None), **_entropy_kw(values.entropy))
    trained = micro.trained_rows()
    if trained is not None:
        rows = trained.nonzero().squeeze(1)
        entropy = None if values.entropy is None else values.entropy[rows]
        if rows.numel():
            _, own = run(values.values[rows], rows, **_entropy_kw(entropy))
        else:
            own = {k: torch.full_like(v, float("nan")) for k, v in metrics.items()}
        metrics |= {k: v for k, v in own.items() if k not in WHOLE_BATCH}
    if micro.skips:
        metrics["trained_rows"] = torch.tensor(float(micro.trained_count()[0]))
    return value, metrics


def _recomputed_term(run: LossFn, micro: MicroBatches, k: int, weight: Any) -> torch.Tensor:
    lo, hi = micro.rows[k]
    with torch.enable_grad():
        logprobs = micro.redo(k)
        return run(logprobs, slice(lo, hi), **_entropy_kw(micro, k))[0] * weight


def _entropy_kw(source: Any, k: int | None = None) -> dict[str, torch.Tensor]:
    """{"entropy": ...} for `run`: a whole batch's entropy tensor, or micro-batch k's of a
    MicroBatches; {} where there is none (the critic's values, a forward without it)."""
    if k is not None:
        return {"entropy": source.entropy[k]} if source.entropy else {}
    return {} if source is None else {"entropy": source}
