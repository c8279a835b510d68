"""Held-out accuracy: greedy answers of the rollout's current weights on a split.

`accuracy` scores with the run's own reward less its format part (exact_match when none is
given); `exact_match_accuracy` is reported beside it, so runs on different rewards compare.
The prompts are the split's batch 0, so every evaluation scores the same questions.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rollplex.data import PromptSource
from rollplex.data.render import PromptRenderer
from rollplex.data.rewards import REWARDS, RewardFn


@dataclass(slots=True, frozen=True)
class EvalResult:
    accuracy: float
    prompts: int
    majority_answer: str  # the split's most common answer among the prompts scored
    majority_accuracy: float  # accuracy of always answering it: the baseline to beat
    examples: tuple[tuple[str, str, str], ...]  # (problem, answer, response), first few
    exact_match_accuracy: float = 0.0  # the same responses by exact_match
    scored_by: str = "exact_match"  # what `accuracy` is the mean of


def evaluate(
    backend,
    source: PromptSource,
    renderer: PromptRenderer,
    prompts: int,
    max_new_tokens: int,
    batch_size: int = 16,
    score: RewardFn | None = None,
) -> EvalResult:
    exact = REWARDS["exact_match"]
    judge = score if score is not None else exact
    chosen = source.batch(0, min(prompts, len(source)))
    scores: list[float] = []
    exact_scores: list[float] = []
    answers: list[str] = []
    examples: list[tuple[str, str, str]] = []
    for start in range(0, len(chosen), batch_size):
        samples = chosen[start : start + batch_size]
        # samples too: an engine rollout (vLLM) reads their raw images, not pixel values
        gen = backend.generate(renderer.encode_batch(samples), max_new_tokens, samples=samples)
        rows = [t[:k] for t, k in zip(gen.tokens.tolist(), gen.lengths.tolist(), strict=True)]
        texts = renderer.tokenizer.batch_decode(rows, skip_special_tokens=True)
        for s, text in zip(samples, texts, strict=True):
            scores.append(judge(text, s))
            exact_scores.append(exact(text, s))
            answers.append(s.answer)
            if len(examples) < 5:
                examples.append((s.problem, s.answer, text))
    majority = max(set(answers), key=lambda a: (answers.count(a), a)) if answers else ""
    majority_acc = statistics.fmean(judge(majority, s) for s in chosen) if chosen else 0.0
    return EvalResult(
        statistics.fmean(scores) if scores else 0.0,
        len(scores),
        majority,
        majority_acc,
        tuple(examples),
        statistics.fmean(exact_scores) if exact_scores else 0.0,
        getattr(judge, "name", getattr(judge, "__name__", "custom")),
    )
