"""The registered rewards: each `fn(response: str, sample: Sample) -> float`, in [0, 1]."""

from __future__ import annotations

import threading

from rollplex.data.rewards.extract import extract_answer, has_format, normalize
from rollplex.data.rewards.math_answer import looks_mathematical, same_text, split_unit, unwrap
from rollplex.data.sample import Sample


def exact_match(response: str, sample: Sample) -> float:
    """1.0 iff the extracted answer equals the ground truth after normalisation."""
    return float(normalize(extract_answer(response)) == normalize(sample.answer))


def format_reward(response: str, sample: Sample) -> float:
    """1.0 iff the response has <answer>…</answer> or \\boxed{…}."""
    return float(has_format(response))


def math_equal(response: str, sample: Sample) -> float:
    """1.0 iff the extracted answer equals the ground truth: by math-verify where both are
    mathematics (1/2 = \\frac{1}{2} = 0.5, x+1 = 1+x), as normalised text where either is
    not ("no" != "on": math-verify alone reads letters as a commutative product). Units,
    number words and booleans: math_answer.py."""
    pred, gold = extract_answer(response), sample.answer
    (pred_num, pred_unit), (gold_num, gold_unit) = split_unit(pred), split_unit(gold)
    if pred_unit and gold_unit and not same_text(pred_unit, gold_unit):
        return 0.0
    if pred_unit or gold_unit:  # one side's number has a unit: compare the numbers
        pred, gold = pred_num, gold_num
    if looks_mathematical(pred) and looks_mathematical(gold):
        verdict = _math_verify(gold, pred)
        if verdict is not None:
            return float(verdict)
    return float(same_text(pred, gold))


def _math_verify(gold: str, pred: str) -> bool | None:
    """math-verify's verdict, None when either side does not parse."""
    from math_verify import parse, verify  # imported late: it pulls in sympy

    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    limit = 5 if threading.current_thread() is threading.main_thread() else None

    def read(text: str) -> list:
        text = unwrap(text)
        return parse(f"${text}$", parsing_timeout=limit) or parse(text, parsing_timeout=limit)

    g, p = read(gold), read(pred)
    if not g or not p:
        return None
    return bool(verify(g, p, timeout_seconds=limit))


REWARDS = {"exact_match": exact_match, "format": format_reward, "math": math_equal}
