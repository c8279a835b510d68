"""The static tensors one decode step reads and writes, and the step itself
(`Workspace.body`), which reads its step from a device tensor, never from Python: so it can
be captured as a CUDA graph and replayed."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rollplex.engine.cache import Attention, SharedPrefixKV
from rollplex.engine.prefix import Model
from rollplex.engine.riders import RiddenPrefix, RiderRows, ride_step
from rollplex.engine.sampling import next_tokens
from rollplex.engine.step import DecodeStep


@dataclass(slots=True, frozen=True)
class Shape:
    prompts: int  # padded prompt count
    group_size: int
    prefix_cap: int
    max_new_tokens: int
    temperature: float
    top_p: float
    pad_id: int
    attention: Attention = "sdpa"
    # decode once: the rows (not padded) whose layer outputs each step keeps; 0: none. The
    # padding rows' outputs are dropped, not kept: at 192 rows in the 256 bucket, that is
    # a quarter of a buffer the plan prices at the real rows (4.5 GiB at 3B, 512 tokens).
    kept_rows: int = 0

    @property
    def kept_columns(self) -> int:
        """Steps that feed a token: 0 .. max_new_tokens - 2 (the last token is never fed)."""
        return max(self.max_new_tokens - 1, 1)

    @property
    def rows(self) -> int:
        return self.prompts * self.group_size


class Workspace:
    """The static tensors of one Shape, and its graphs by kv_len."""

    def __init__(self, model: Model, shape: Shape, device: torch.device) -> None:
        text = model.config.text_config
        heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
        dtype = model.lm_head.weight.dtype
        self.shape, n, r = shape, shape.rows, shape.max_new_tokens
        self.cache = SharedPrefixKV(
            text.num_hidden_layers,
            kv_heads,
            text.hidden_size // heads,
            heads // kv_heads,
            shape.prompts,
            shape.group_size,
            shape.prefix_cap,
            max(r - 1, 1),
            dtype,
            device,
            shape.attention,
        )
        long = dict(dtype=torch.long, device=device)
        self.token = torch.zeros(n, **long)  # the token each row feeds next
        self.position = torch.zeros(n, **long)
        self.step = torch.zeros(1, **long)  # response step of `token`
        self.seeds = torch.zeros(n, **long)
        self.done = torch.zeros(n, dtype=torch.bool, device=device)
        self.caps = torch.full((n,), r, **long)  # forced length per row (else the cap)
        self.eos = torch.full((), -1, **long)  # the session's eos; -1 while lengths are forced
        self.lengths = torch.zeros(n, **long)
        self.tokens = torch.full((n, r), shape.pad_id, **long)
        self.logprobs = torch.zeros((n, r), dtype=torch.float32, device=device)
        # decode once: [layers, rows, steps, hidden], layer i's output at each fed token
        # (the last layer's is the final norm's input); zeros, so columns no step wrote
        # (rows that ended) are finite. Absent unless asked for: no cost when off.
        self.kept: torch.Tensor | None = None
        if shape.kept_rows:
            size = (text.num_hidden_layers, shape.kept_rows, shape.kept_columns, text.hidden_size)
            self.kept = torch.zeros(size, dtype=dtype, device=device)
        self.generation = 0  # decodes started in these buffers (a kept export checks it)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.weights: tuple[int, ...] = ()
        # the EngineSession decoding in it now, held weakly: a session dropped unfinished (a
        # profiler pass, an error mid-decode) must not keep every later one off the buffers
        self.owner: weakref.ReferenceType[Any] | None = None

    def in_use(self) -> bool:
        """Whether a live, unfinished session is decoding in these buffers."""
        owner = None if self.owner is None else self.owner()
        return owner is not None and not owner.finished

    def tensors(self) -> list[torch.Tensor]:
        mine = [self.token, self.position, self.step, self.seeds, self.done, self.lengths]
        mine += [self.caps, self.eos]
        kept = [] if self.kept is None else [self.kept]
        return [*self.cache.tensors(), *mine, self.tokens, self.logprobs, *kept]

    def record(
        self, column: torch.Tensor, logits: torch.Tensor, choose: Callable = next_tokens
    ) -> None:
        """Draw response token `column` of every row from `logits` [rows, V] with `choose`
        (sampling.next_tokens, compiled on CUDA: DecodeStep.choose), and write it in."""
        s = self.shape
        args = (self.seeds, column, self.done, self.eos, self.caps)
        token, lp, live, finished, nxt = choose(logits, *args, s.temperature, s.top_p, s.pad_id)
        self.tokens.index_copy_(1, column, token[:, None])
        self.logprobs.index_copy_(1, column, lp[:, None])
        self.lengths.add_(live.long())
        self.done.copy_(finished)
        self.token.copy_(nxt)

    def body(self, forward: DecodeStep, kv_len: int) -> None:
        """One decode step on the static tensors (what a graph captures)."""
        self.cache.open_step(self.step)
        logits = forward(self.cache, self.token, self.position, self.step, kv_len, self.kept)
        self._advance(forward, logits)

    def ride(self, forward: DecodeStep, kv_len: int, rows: RiderRows) -> RiddenPrefix:
        """`body` with prefix rows in its GEMMs (riders.py), eagerly: a chunk's shape is
        its own, so no graph is kept for it."""
        self.cache.open_step(self.step)
        logits, ridden = ride_step(
            forward, self.cache, self.token, self.position, self.step, kv_len, rows, kept=self.kept
        )
        self._advance(forward, logits)
        return ridden

    def _advance(self, forward: DecodeStep, logits: torch.Tensor) -> None:
        self.record(self.step + 1, logits, forward.choose)
        self.position.add_(1)
        self.step.add_(1)
