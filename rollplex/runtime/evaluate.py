"""Held-out accuracy: answers of the rollout's current weights on a split, greedy, or
`n` sampled per prompt (verl's val_kwargs: n, temperature, top_p).

`accuracy` scores with the run's own reward less its format part (exact_match when none is
given), averaged over every answer (mean@n); `pass_at_n` is the share of prompts with at
least one answer scoring 1. `exact_match_accuracy` is reported beside them, so runs on
different rewards compare. The prompts are the split's batch 0, so every evaluation scores
the same questions.
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
    samples: int = 1  # answers per prompt (accuracy is their mean: mean@samples)
    pass_at_n: float = 0.0  # prompts with at least one answer scoring 1


def evaluate(
    backend,
    source: PromptSource,
    renderer: PromptRenderer,
    prompts: int,
    max_new_tokens: int,
    batch_size: int = 16,
    score: RewardFn | None = None,
    n: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> EvalResult:
    exact = REWARDS["exact_match"]
    judge = score if score is not None else exact
    chosen = source.batch(0, min(prompts, len(source)))
    scores: list[float] = []
    exact_scores: list[float] = []
    passed: list[bool] = []
    answers: list[str] = []
    examples: list[tuple[str, str, str]] = []
    for start in range(0, len(chosen), batch_size):
        samples = chosen[start : start + batch_size]
        # samples too: an engine rollout (vLLM) reads their raw images, not pixel values
        gen = backend.generate(
            renderer.encode_batch(samples), max_new_tokens,
            temperature=temperature, samples=samples, n=n, top_p=top_p,
        )  # fmt: skip
        rows = [t[:k] for t, k in zip(gen.tokens.tolist(), gen.lengths.tolist(), strict=True)]
        texts = renderer.tokenizer.batch_decode(rows, skip_special_tokens=True)
        for i, s in enumerate(samples):  # rows i*n .. i*n+n-1 answer prompt i
            own = texts[i * n : (i + 1) * n]
            mine = [judge(text, s) for text in own]
            scores += mine
            exact_scores += [exact(text, s) for text in own]
            passed.append(max(mine) >= 1.0)
            answers.append(s.answer)
            if len(examples) < 5:
                examples.append((s.problem, s.answer, own[0]))
    majority = max(set(answers), key=lambda a: (answers.count(a), a)) if answers else ""
    majority_acc = statistics.fmean(judge(majority, s) for s in chosen) if chosen else 0.0
    return EvalResult(
        statistics.fmean(scores) if scores else 0.0,
        len(passed),
        majority,
        majority_acc,
        tuple(examples),
        statistics.fmean(exact_scores) if exact_scores else 0.0,
        getattr(judge, "name", getattr(judge, "__name__", "custom")),
        n,
        statistics.fmean(passed) if passed else 0.0,
    )
