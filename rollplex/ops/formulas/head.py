"""Scratch of the LM head when it scores tokens: the torch head runs in chunks of at most
`HEAD_CHUNK_BYTES` of float32 logits (backends/torch/logprob.py), so one run of an op (a
micro-batch) holds a few chunks at most, however many tokens it scores. The multiples are
what torch.profiler measured (bench/fused_head.py, bench/results/fused_head_cpu.md).
"""

from __future__ import annotations

from typing import Literal

# float32 logits one chunk of the torch head holds (backends/torch/logprob.py reads it)
HEAD_CHUNK_BYTES = 1 << 30

HeadPass = Literal["sample", "score", "forward", "backward"]

# Peak scratch in chunks of float32 logits, by (pass, fused), as torch.profiler measured
# it (tests/backends/torch/test_head_scratch_priced.py holds the runtime to these):
# scoring without grad holds the bf16 logits, their float32 copy and the log-softmax
# (2.5); the training forward also takes the entropy (a metric at least) from the same
# chunk (2.0 fused: log p in place and p beside it; 3.5 as checkpointed chunks, whose
# softmax and product are buffers of their own); the fused backward 1.5 (it
# turns the recomputed logits into their gradient in place), the checkpointed chunk's 4.0
# (logits, float32 copy, softmax and gradient at once: a head the fused node cannot take,
# tensor-parallel).
_CHUNKS = {
    ("score", True): 2.5,
    ("score", False): 2.5,
    ("forward", True): 2.0,
    ("forward", False): 3.5,
    ("backward", True): 1.5,
    ("backward", False): 4.0,
}
# what the entropy's gradient adds to a backward's chunks (p log p beside the gradient)
_ENTROPY_GRAD_CHUNKS = {True: 0.5, False: 2.0}


def head_scratch(
    logit_bytes: float,
    head_pass: HeadPass,
    *,
    run_share: float = 1.0,
    fused: bool = True,
    entropy_grad: bool = False,
) -> float:
    """Peak scratch of the head over an op's `logit_bytes` of float32 logits, as the whole
    op's: the planner takes a run's `run_share` of an op's scratch (planner/layout.py), so
    a run's cap of whole chunks is `HEAD_CHUNK_BYTES / run_share` of the op. `sample`: the
    rollout's last-position logits (a row per sequence), held whole in float32."""
    if head_pass == "sample":
        return logit_bytes
    if not 0 < run_share <= 1:
        raise ValueError(f"run_share must be in (0, 1], got {run_share}")
    chunks = _CHUNKS[head_pass, fused]
    if head_pass == "backward" and entropy_grad:
        chunks += _ENTROPY_GRAD_CHUNKS[fused]
    return chunks * min(logit_bytes, HEAD_CHUNK_BYTES / run_share)
