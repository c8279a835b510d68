"""The hand-over's row arithmetic and wire format, in one process (no process group): the
prompt rows a replica sends a trainer, packed and unpacked, and merged back in row order,
give the trainer exactly the rows a one-process run holds."""

from __future__ import annotations

import torch

from rollplex.backends.torch.values import Features, Responses, TokenLogprobs
from rollplex.runtime.transfers import _merge, _pack, _rows, _unpack, prompt_rows

PROMPTS, G = 4, 3


def _values() -> dict:
    g = torch.Generator().manual_seed(0)
    s = PROMPTS * G
    tokens = [2, 3, 1, 4]  # visual tokens per prompt: rows of unequal size
    return {
        "features": Features(torch.randn(sum(tokens), 5, generator=g), tokens),
        "responses": Responses(torch.randint(0, 9, (s, 6), generator=g), torch.arange(s)),
        "logprobs": TokenLogprobs(torch.randn(s, 6, generator=g), torch.rand(s, 6) > 0.5),
        "advantages": torch.randn(s, generator=g),
        "none": None,  # a rollout without old logprobs
    }


def _same(a, b) -> None:
    if a is None:
        assert b is None
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, list):  # Features.tokens
        assert a == b
    else:
        assert type(a) is type(b)
        for k in a.__dataclass_fields__:
            _same(getattr(a, k), getattr(b, k))


def test_rows_sent_by_replicas_merge_into_each_trainers_rows():
    whole = _values()
    replicas, trainers = 2, 4
    for g in range(trainers):
        lo, hi = prompt_rows(g, trainers, PROMPTS)
        parts = []
        for k in range(replicas):
            a, b = prompt_rows(k, replicas, PROMPTS)
            mine = {n: _rows(v, a, b, PROMPTS) for n, v in whole.items()}  # replica k's
            x, y = max(lo, a), min(hi, b)
            if x >= y:
                continue
            header, tensors = _pack({n: _rows(v, x - a, y - a, b - a) for n, v in mine.items()})
            parts.append(_unpack(header, [t.clone() for t in tensors]))
        got = {n: _merge([p[n] for p in parts]) for n in parts[0]}
        for n, v in whole.items():
            _same(_rows(v, lo, hi, PROMPTS), got[n])


def test_booleans_travel_as_bytes_and_come_back_as_booleans():
    header, tensors = _pack({"mask": torch.tensor([True, False])})
    assert tensors[0].dtype == torch.uint8  # gloo has no bool
    assert _unpack(header, tensors)["mask"].dtype == torch.bool
