"""The split-attention kernels (engine/split_kernel.py) under Triton's CPU interpreter, in
float32: run by test_interpreted_kernels.py in a child process with TRITON_INTERPRET=1
(Triton reads it when the kernels are defined). Raises on the first disagreement."""

from __future__ import annotations

import os

import torch

from rollplex.engine import split_kernel
from rollplex.engine.attention import split_attention
from tests.engine.interpreted import decodes_agree, tiny_batch

# (prompts, K/V heads, query heads per K/V head, G, prefix cap, response slots, head dim,
# prefix programs aimed at): one chunk and many, ragged tiles, GQA 1 and 7 (the 7B's), one
# row, a head dim below the tensor-core minimum, more folded queries than one tile holds
CASES = (
    (2, 2, 2, 3, 64, 7, 32, 8),
    (1, 4, 7, 8, 200, 40, 32, 64),
    (3, 1, 1, 1, 70, 1, 16, 5),
    (2, 2, 2, 3, 128, 70, 32, 1),
    (4, 2, 3, 2, 96, 130, 8, 16),
    (2, 1, 7, 20, 128, 3, 16, 4),  # 140 folded query rows: two query tiles per chunk
)


def check_attention(gen: torch.Generator) -> None:
    for b, kv_heads, rep, g, cap, n, d, programs in CASES:
        # q strided as the engine's before() leaves it; own K/V sliced off a longer buffer
        q = torch.randn(b, g, kv_heads * rep, d, generator=gen).transpose(1, 2)
        pk, pv = (torch.randn(b, kv_heads, cap, d, generator=gen) for _ in range(2))
        ok, ov = (torch.randn(b, kv_heads, g, n + 5, d, generator=gen)[:, :, :, :n] for _ in "kv")
        lengths = torch.randint(1, cap + 1, (b,), generator=gen)
        lengths[-1] = 0 if b > 1 else lengths[-1]  # a bucket's padding prompt: no prefix key
        for step in sorted({0, n // 2, n - 1}):
            at = torch.tensor(step)
            want = split_attention(q, pk, pv, lengths, ok, ov, at, d**-0.5)
            got = split_kernel.split_attention_kernel(
                q, pk, pv, lengths, ok, ov, at, d**-0.5, programs=programs
            )
            assert got.shape == want.shape, (got.shape, want.shape)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        check_write(gen, q, pk, pv, lengths, ok, ov, programs)


def check_write(
    gen: torch.Generator,
    q: torch.Tensor,
    pk: torch.Tensor,
    pv: torch.Tensor,
    lengths: torch.Tensor,
    ok: torch.Tensor,
    ov: torch.Tensor,
    programs: int,
) -> None:
    """With new_kv the kernel writes the step's K/V into the row's slot, then attends as
    if the cache had been written first: same output, same buffers, no other slot moved."""
    b, kv_heads, g, n, d = ok.shape
    step = n // 2
    new_k, new_v = (torch.randn(b, g, kv_heads, d, generator=gen).transpose(1, 2) for _ in "kv")
    at = torch.tensor(step)
    want_k, want_v = ok.clone(), ov.clone()
    want_k[:, :, :, step], want_v[:, :, :, step] = new_k, new_v
    want = split_attention(q, pk, pv, lengths, want_k, want_v, at, d**-0.5)
    got_k, got_v = ok.clone(), ov.clone()
    got = split_kernel.split_attention_kernel(
        q, pk, pv, lengths, got_k, got_v, at, d**-0.5, programs=programs, new_kv=(new_k, new_v)
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


def check_engine() -> None:
    """A split decode on the kernels equals one on torch's matmuls (tokens, lengths,
    logprobs), prompts of unequal prefix length and a bucket's padding prompts included.
    One sampled and one greedy decode: the kernels see the same inputs either way, and
    every decode is slow under the interpreter. 2 prompts x G = 3 in a 9-row bucket: one
    padding prompt (a 16-row bucket held four, twice the rows to interpret)."""
    decodes_agree(
        "split_kernel", "split_kernel", 1.0, 4, atol=1e-5, attention="split", buckets=(9,)
    )
    # the kernels writing the step's K/V against the cache's two index copies
    decodes_agree(
        "kernel_writes_kv", "kernel_writes_kv", 0.0, 0, atol=1e-6,
        attention="split", buckets=(9,), split_kernel=True,
    )  # fmt: skip


def check_ride() -> None:
    """A training prefix riding a decode step on the kernels (which write the step's K/V,
    the default with them) leaves the decode's draws as they are without it (the ride's
    own outputs against a separate forward: test_riders.py)."""
    from rollplex.backends.torch.roles import features_of, freeze_for_graph
    from rollplex.backends.torch.trainer import TorchTrainer
    from rollplex.backends.torch.values import Pixels
    from rollplex.engine.prefix import prefix_forward
    from rollplex.engine.session import DecodeEngine
    from rollplex.specs import AlgoSpec
    from rollplex.specs.model import MODEL_PRESETS

    model, batch = tiny_batch()
    spec = MODEL_PRESETS["tiny"]
    freeze_for_graph(model, spec)
    trainer = TorchTrainer(model, spec, AlgoSpec())
    with torch.no_grad():
        feats = features_of(model, Pixels.of(batch))
        prefix = prefix_forward(model, batch, feats.values, grad=False)
    results = []
    for ride in (False, True):
        engine = DecodeEngine(model, attention="split", split_kernel=True, buckets=(9,))
        assert engine.forward.kernel_writes_kv
        s = engine.start(prefix, 3, 6, 1.0, 1.0, torch.Generator().manual_seed(3), -1)
        s.advance(2)
        if ride:
            ridden = s.ride(trainer.ride_rows(feats, batch.text_only()))
            assert not ridden.alone
        s.advance()
        results.append(s.result())
    (t1, lp1, n1), (t2, lp2, n2) = results
    assert torch.equal(t1, t2) and torch.equal(n1, n2)
    torch.testing.assert_close(lp2, lp1, rtol=0, atol=1e-5)


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1" and split_kernel.triton is not None
    check_attention(torch.Generator().manual_seed(0))
    check_engine()
    check_ride()
    print("split kernels agree")


if __name__ == "__main__":
    main()
