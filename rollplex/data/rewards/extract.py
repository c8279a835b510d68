"""Answer extraction and normalisation shared by the rewards.

The answer of a response is the last `<answer>…</answer>` span, else the last
`\\boxed{…}` (braces balanced), else the whole response.
"""

from __future__ import annotations

import re
import string

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCT = str.maketrans("", "", string.punctuation)


def answer_tag(text: str) -> str | None:
    """The last <answer>…</answer> span, or None."""
    spans = ANSWER_TAG.findall(text)
    return spans[-1] if spans else None


def boxed(text: str) -> str | None:
    """The content of the last \\boxed{…} (nested braces allowed), or None if unclosed/absent."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def extract_answer(text: str) -> str:
    tag = answer_tag(text)
    if tag is not None:
        return tag
    box = boxed(text)
    return box if box is not None else text


def normalize(text: str) -> str:
    """SQuAD-style: lowercase, drop punctuation and articles, collapse whitespace."""
    text = text.lower().translate(PUNCT)
    return " ".join(ARTICLES.sub(" ", text).split())


def has_format(text: str) -> bool:
    """The response marks its answer: <answer>…</answer> or a closed \\boxed{}."""
    return answer_tag(text) is not None or boxed(text) is not None
