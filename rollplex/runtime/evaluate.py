"""Held-out accuracy: greedy answers of the rollout's current weights on a split.

A response is correct when the `exact_match` reward scores it 1 (the extracted answer,
normalised, equals the sample's answer). The prompts are the split's batch 0 (its first
`prompts` rows in the seeded order), so two evaluations score the same questions.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rollplex.data import PromptSource
from rollplex.data.render import PromptRenderer
from rollplex.data.rewards import REWARDS


@dataclass(slots=True, frozen=True)
class EvalResult:
    accuracy: float
    prompts: int
    majority_answer: str  # the split's most common answer among the prompts scored
    majority_accuracy: float  # accuracy of always answering it: the baseline to beat
    examples: tuple[tuple[str, str, str], ...]  # (problem, answer, response), first few


def evaluate(
    backend,
    source: PromptSource,
    renderer: PromptRenderer,
    prompts: int,
    max_new_tokens: int,
    batch_size: int = 16,
) -> EvalResult:
    exact = REWARDS["exact_match"]
    chosen = source.batch(0, min(prompts, len(source)))
    scores: list[float] = []
    answers: list[str] = []
    examples: list[tuple[str, str, str]] = []
    for start in range(0, len(chosen), batch_size):
        samples = chosen[start : start + batch_size]
        gen = backend.generate(renderer.encode_batch(samples), max_new_tokens)
        rows = [t[:k] for t, k in zip(gen.tokens.tolist(), gen.lengths.tolist(), strict=True)]
        texts = renderer.tokenizer.batch_decode(rows, skip_special_tokens=True)
        for s, text in zip(samples, texts, strict=True):
            scores.append(exact(text, s))
            answers.append(s.answer)
            if len(examples) < 5:
                examples.append((s.problem, s.answer, text))
    majority = max(set(answers), key=lambda a: (answers.count(a), a)) if answers else ""
    majority_acc = statistics.fmean(exact(majority, s) for s in chosen) if chosen else 0.0
    return EvalResult(
        statistics.fmean(scores) if scores else 0.0,
        len(scores),
        majority,
        majority_acc,
        tuple(examples),
    )
