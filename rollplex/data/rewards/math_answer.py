"""Which answers are mathematics, and how `reward=math` compares two of them.

math-verify alone scores "no" against "on" as equal (letters are commuting symbols), so an
answer goes to it only when both sides look mathematical; anything with a word of two or
more letters is compared as normalised text. Rules: `looks_mathematical`, `split_unit`.
"""

from __future__ import annotations

import re

from rollplex.data.rewards.extract import normalize

_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_LATEX_CMD = re.compile(r"\\[A-Za-z]+")
_DELIMS = re.compile(r"^\s*(?:\$\$?|\\\(|\\\[)(.*?)(?:\$\$?|\\\)|\\\])\s*$", re.DOTALL)
_WORD = re.compile(r"[^\W\d_]{2,}")  # two or more letters in a row, any script
_FUNCTIONS = re.compile(
    r"\b(?:arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc|log|ln|exp|sqrt|"
    r"lim|max|min|gcd|lcm|mod|pi|infinity|inf|oo)\b",
    re.IGNORECASE,
)
# a number, then a unit of at least two letters ("cm", "km/h", "m^2" is a variable's power)
_NUMBER_UNIT = re.compile(
    r"^\s*([-+]?(?:\d[\d,]*)?\.?\d+(?:/\d+)?)\s*([^\W\d_]{2,}(?:\s*[/\s]\s*[^\W\d_]+)*)\s*\.?\s*$"
)


def unwrap(text: str) -> str:
    """Math delimiters ($...$, \\(...\\)) dropped, \\text{...}-like commands replaced by their
    content (spaced, so "5\\text{cm}" reads "5 cm")."""
    m = _DELIMS.match(text)
    text = m.group(1) if m else text
    return _TEXT_CMD.sub(lambda g: f" {g.group(1)} ", text).strip()


def split_unit(text: str) -> tuple[str, str | None]:
    """(number, unit) for "5 cm"-like answers, else (text, None).

    The number compares by math-verify, the unit as text: "5 cm" = "5" (one side gives no
    unit) but "5 cm" != "5 mm". A single letter after a number is math-verify's to read
    ("5m" = 5, "5x" != 5). Number words and booleans are text: "five" != "5"."""
    m = _NUMBER_UNIT.match(unwrap(text))
    return (m.group(1), m.group(2)) if m else (text, None)


def looks_mathematical(text: str) -> bool:
    """No word (two letters in a row) outside LaTeX commands and function names, and
    something to read: a digit, a letter (a variable) or a LaTeX command."""
    bare = _FUNCTIONS.sub(" ", _LATEX_CMD.sub(" ", unwrap(text)))
    if _WORD.search(bare):
        return False
    return bool(re.search(r"[\w\\]", bare + text))


def same_text(a: str, b: str) -> bool:
    return normalize(unwrap(a)) == normalize(unwrap(b))
