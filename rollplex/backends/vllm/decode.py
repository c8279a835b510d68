"""Segmented decode on a vLLM engine: requests are added once, then `advance(k)` runs k engine
steps and returns, so other work can run between segments.

k steps make at most k tokens per row; each row's sampling seed is a function of (engine
seed, RL step, row), so tokens depend neither on the segmentation nor on the batch.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import torch

from rollplex.backends.base import BackendError, DecodeSession, Sampling
from rollplex.backends.torch.logprob import response_mask
from rollplex.backends.torch.values import Responses, TokenLogprobs
from rollplex.backends.vllm.prompts import VllmPrompts

_session_ids = itertools.count()


def row_seed(seed: int, base: int, row: int) -> int:
    """A request's sampling seed: a hash of the engine seed, the step's seed and the row."""
    digest = hashlib.sha256(f"rollplex-vllm-row:{seed}:{base}:{row}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def step_seed(generator: Any) -> int:
    """The step's base seed: drawn from the backend's decode generator (seeded by (seed,
    step)), or given as an int."""
    if isinstance(generator, int):
        return generator
    if isinstance(generator, torch.Generator):
        return int(torch.randint(0, 1 << 62, (1,), generator=generator, device=generator.device))
    if generator is None:
        return 0
    raise BackendError(f"decode generator is {type(generator).__name__}: expected int or Generator")


class VllmDecode(DecodeSession):
    """G samples of each prompt, rows ordered prompt-major (row = prompt * G + g), like
    the torch rollout's expanded prefix."""

    def __init__(
        self,
        llm: Any,
        prompts: VllmPrompts,
        group_size: int,
        sampling: Sampling,
        seed: int,
        logprobs: bool,
        engine_seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        if llm.llm_engine.has_unfinished_requests():
            raise BackendError("the vLLM engine is still running another decode")
        self.llm, self.sampling, self.logprobs = llm, sampling, logprobs
        self.device = torch.device(device)  # where the trainer reads the responses
        self.rows = prompts.rows * group_size
        self.max_new_tokens = sampling.max_new_tokens
        tag = f"rp{next(_session_ids)}"
        self._ids = [f"{tag}-{r}" for r in range(self.rows)]
        self._row_of = {rid: r for r, rid in enumerate(self._ids)}
        self._out: list[Any] = [None] * self.rows
        # prompt tokens per row as the engine saw them (placeholders expanded); -1 until done
        self.prompt_lengths: list[int] = [-1] * self.rows
        self._steps = 0
        vocab = llm.llm_engine.model_config.get_vocab_size()
        # an eos outside the vocabulary (e.g. -1) never occurs: no stop, as in the torch role
        stop = [sampling.eos_id] if 0 <= sampling.eos_id < vocab else []
        forced = sampling.lengths
        if forced is not None:
            if len(forced) != self.rows:
                raise ValueError(f"{len(forced)} forced lengths for {self.rows} rows")
            stop = []  # a forced length ignores eos, as the torch rollout does
        for r, rid in enumerate(self._ids):
            params = SamplingParams(
                n=1,
                max_tokens=sampling.max_new_tokens if forced is None else forced[r],
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                seed=row_seed(engine_seed, seed, r),
                # stop at the role's eos only (not the config's or the tokenizer's), as the
                # torch rollout does; the eos token stays in the output
                ignore_eos=True,
                stop_token_ids=stop,
                logprobs=0 if logprobs else None,
                detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            llm.llm_engine.add_request(rid, prompts.prompts[r // group_size], params)

    @property
    def finished(self) -> bool:
        return all(o is not None for o in self._out)

    @property
    def steps_left(self) -> int:
        return 0 if self.finished else max(self.max_new_tokens - self._steps, 1)

    def advance(self, steps: int | None = None) -> bool:
        budget = None if steps is None else steps
        while not self.finished and (budget is None or budget > 0):
            for out in self.llm.llm_engine.step():
                r = self._row_of.get(out.request_id)
                if r is None:
                    raise BackendError(f"vLLM returned an unknown request {out.request_id!r}")
                if out.finished:
                    self._out[r] = out.outputs[0]
                    self.prompt_lengths[r] = len(out.prompt_token_ids or ())
            self._steps += 1
            if budget is not None:
                budget -= 1
        return self.finished

    def abort(self) -> None:
        """Drop the unfinished requests (the engine is free again)."""
        left = [rid for rid, o in zip(self._ids, self._out, strict=True) if o is None]
        if left:
            self.llm.llm_engine.abort_request(left)

    def result(self) -> tuple[Responses, TokenLogprobs | None]:
        """Token ids [S, R] right-padded with pad, lengths [S] (eos included) and, when asked
        for, the policy's raw per-token logprobs [S, R] (0 on padding)."""
        if not self.finished:
            raise RuntimeError(f"decode session still has {self.steps_left} steps to run")
        s, r = self.rows, self.max_new_tokens
        tokens = torch.full((s, r), self.sampling.pad_id, dtype=torch.long)
        lengths = torch.zeros(s, dtype=torch.long)
        values = torch.zeros((s, r), dtype=torch.float32) if self.logprobs else None
        for i, out in enumerate(self._out):
            ids = list(out.token_ids)
            n = len(ids)
            tokens[i, :n] = torch.tensor(ids, dtype=torch.long)
            lengths[i] = n
            if values is not None:
                values[i, :n] = torch.tensor(
                    [lp[t].logprob for lp, t in zip(out.logprobs, ids, strict=True)]
                )
        tokens, lengths = tokens.to(self.device), lengths.to(self.device)
        responses = Responses(tokens, lengths)
        if values is None:
            return responses, None
        return responses, TokenLogprobs(values.to(self.device), response_mask(lengths, r))
