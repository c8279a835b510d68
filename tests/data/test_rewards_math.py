"""reward=math cannot be gamed: alphabetic answers compare as normalised text, math-verify
only judges where both sides are mathematics. Each case runs tagged, boxed and bare."""

from __future__ import annotations

import pytest

from rollplex.data import Sample
from rollplex.data.rewards import math_equal
from rollplex.data.rewards.math_answer import looks_mathematical, split_unit


def _score(answer: str, gold: str) -> dict[str, float]:
    sample = Sample("t:train:0", "q", gold)
    forms = {
        "tag": f"think first <answer>{answer}</answer>",
        "box": f"so \\boxed{{{answer}}}",
        "bare": answer,
    }
    return {k: math_equal(r, sample) for k, r in forms.items()}


def _all(answer: str, gold: str, want: float) -> None:
    got = _score(answer, gold)
    assert got == dict.fromkeys(got, want), (answer, gold, got)
    # and the other way round: which side is the gold does not matter
    back = _score(gold, answer)
    assert back == dict.fromkeys(back, want), (gold, answer, back)


@pytest.mark.parametrize(
    "answer,gold",
    [("on", "no"), ("sey", "yes"), ("tfel", "left"), ("eurt", "true"), ("ABC", "CAB"),
     ("on", "\\text{no}"), ("owt", "two"), ("noitcnuf", "function")],
)  # fmt: skip
def test_anagrams_score_zero(answer, gold):
    _all(answer, gold, 0.0)


@pytest.mark.parametrize("answer,gold", [("no", "no"), ("No.", "no"), ("\\text{Yes}", "yes"),
                                         ("LEFT", "left"), ("the circle", "Circle")])  # fmt: skip
def test_text_answers_still_match_as_text(answer, gold):
    _all(answer, gold, 1.0)


@pytest.mark.parametrize(
    "answer,gold,want",
    [
        ("5 cm", "5", 1.0),  # one side gives no unit: the numbers decide
        ("5 cm", "5 cm", 1.0),
        ("5\\text{ cm}", "5 cm", 1.0),
        ("5 cm", "5 mm", 0.0),  # both give units: they must agree
        ("5 cm", "6 cm", 0.0),
        ("3.5 km/h", "3.5 km/h", 1.0),
        # one letter after a number is math-verify's to read: it drops the units it knows
        # (m, s, g) and keeps a variable a variable
        ("5m", "5", 1.0),
        ("5x", "5", 0.0),
        ("5 apples", "5 oranges", 0.0),
    ],
)
def test_units(answer, gold, want):
    _all(answer, gold, want)


@pytest.mark.parametrize(
    "answer,gold,want",
    [
        ("\\frac{1}{2}", "0.5", 1.0),
        ("\\frac12", "1/2", 1.0),
        ("$\\frac{3}{4}$", "0.75", 1.0),
        ("\\sqrt{4}", "2", 1.0),
        ("x+1", "1+x", 1.0),
        ("2x", "x \\cdot 2", 1.0),
        ("\\pi", "\\pi", 1.0),
        ("\\sin(x)", "\\sin(x)", 1.0),
        ("1,000", "1000", 1.0),
        ("\\frac{1}{3}", "0.5", 0.0),
        ("x-1", "1-x", 0.0),
    ],
)
def test_latex_and_expressions_go_to_math_verify(answer, gold, want):
    _all(answer, gold, want)


def test_numbers_written_as_words_are_text():
    """Decided: "five" is text, so it never equals "5" (the reward does not read words as
    numbers); as text it equals itself in any case."""
    _all("five", "5", 0.0)
    _all("Five.", "five", 1.0)
    _all("twenty one", "21", 0.0)


@pytest.mark.parametrize(
    "answer,gold,want",
    [("True", "true", 1.0), ("yes", "Yes!", 1.0), ("yes", "true", 0.0), ("no", "false", 0.0),
     ("no", "yes", 0.0), ("false", "eslaf", 0.0)],
)  # fmt: skip
def test_booleans_are_text(answer, gold, want):
    _all(answer, gold, want)


def test_multiple_choice_letters():
    _all("A", "a", 1.0)
    _all("(B)", "B", 1.0)
    _all("A", "B", 0.0)


def test_classification():
    assert [looks_mathematical(t) for t in ["5", "x+1", "\\frac{1}{2}", "\\sin(x)", "A", "3.2e5"]]\
        == [True] * 6  # fmt: skip
    assert not any(looks_mathematical(t) for t in ["no", "five", "\\text{yes}", "True", "", "?"])
    assert split_unit("5 cm") == ("5", "cm") and split_unit("-2.5 km/h") == ("-2.5", "km/h")
    assert split_unit("5m") == ("5m", None) and split_unit("x+1") == ("x+1", None)
