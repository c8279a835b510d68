"""The registered rewards: each `fn(response: str, sample: Sample) -> float`, in [0, 1]."""

from __future__ import annotations

import threading

from rollplex.data.rewards.extract import answer_tag, boxed, extract_answer, has_format, normalize
from rollplex.data.sample import Sample


def exact_match(response: str, sample: Sample) -> float:
    """1.0 iff the extracted answer equals the ground truth after normalisation."""
    return float(normalize(extract_answer(response)) == normalize(sample.answer))


def format_reward(response: str, sample: Sample) -> float:
    """1.0 iff the response has <answer>…</answer> or \\boxed{…}."""
    return float(has_format(response))


def math_equal(response: str, sample: Sample) -> float:
    """1.0 iff math-verify finds the extracted answer equal to the ground truth
    (1/2 = \\frac{1}{2} = 0.5, x+1 = 1+x); text answers it cannot parse fall back to
    exact_match."""
    from math_verify import parse, verify  # imported late: it pulls in sympy

    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    limit = 5 if threading.current_thread() is threading.main_thread() else None

    def read(text: str) -> list:
        return parse(f"${text}$", parsing_timeout=limit) or parse(text, parsing_timeout=limit)

    gold = read(sample.answer)
    if not gold:
        return exact_match(response, sample)
    tag = answer_tag(response)
    if tag is not None:
        pred = read(tag)
    elif boxed(response) is not None:
        pred = parse(response, parsing_timeout=limit)  # math-verify reads \boxed itself
    else:
        pred = read(response)
    return float(bool(pred) and verify(gold, pred, timeout_seconds=limit))


REWARDS = {"exact_match": exact_match, "format": format_reward, "math": math_equal}
