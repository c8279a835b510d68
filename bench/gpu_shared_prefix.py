"""Response logprobs on a shared prefix vs the old expand path: peak memory and time.

A random-weight Qwen2.5-VL LLM in the 3B shape (bf16 on CUDA), `--prompts` image prompts
of about `--prompt` tokens (256 visual tokens with random features; the vision tower is
not run), G = `--group` responses each of random tokens, lengths uniform in
[max/4, max] (one row at `--max-length`). Two paths score the same responses:

- expand: the prefix K/V repeat_interleave'd G times into a DynamicCache that the response
  K/V extend, the model's SDPA over [prefix ; response] (what response_logprobs ran
  before shared_prefix_attention.py);
- shared: each prompt's one prefix K/V, attended by its G rows (FlexAttention on CUDA).

Measured for each: the reference scorer's no-grad scoring, and the training forward +
backward (checkpointed prefix forward, `response_micro_batches` with checkpointed layers,
the micro-batches' backward then the prefix's), at each `--micro` count. Peak is
torch.cuda.max_memory_allocated above what was allocated before the call; time is the
median of `--repeats` runs after one warm-up (compilation). Agreement: the two paths'
logprobs (bf16: max |diff| over valid tokens) and the LLM gradients' relative difference.

    python bench/gpu_shared_prefix.py                  # one H200, < 4 min
    python bench/gpu_shared_prefix.py --device cpu --shape tiny --prompts 2 --group 4 \\
        --prompt 64 --max-length 16 --micro 1,2        # dry run

Prints a table last and writes JSON to $OUT/gpu_shared_prefix.json (else
bench/results/gpu_shared_prefix/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_decode import image_prompt

from rollplex.backends.torch.activations import SavedActivations
from rollplex.backends.torch.checkpointing import checkpointed_layers
from rollplex.backends.torch.logprob import (
    head_logprobs,
    response_logprobs,
    response_mask,
    token_logprobs,
)
from rollplex.backends.torch.micro import response_micro_batches
from rollplex.backends.torch.micro_loss import backward_micro_batches
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.shared_prefix_attention import SharedPrefix
from rollplex.backends.torch.values import Responses
from rollplex.data.prompts import collate_prompts
from rollplex.engine.prefix import (
    cache_kv,
    embed_tokens,
    expand_prefix,
    fork_cache,
    lm_hidden,
    prefix_forward,
    response_positions,
)
from rollplex.specs import MODEL_PRESETS


def expand_logprobs(model, state, tokens, lengths) -> torch.Tensor:
    """The old path (response_logprobs before the shared prefix), on prompt rows `state`."""
    g = tokens.shape[0] // state.rows
    state = expand_prefix(state, g)
    width = tokens.shape[1]
    valid = response_mask(lengths, width)
    mask = torch.cat([state.attention_mask, valid[:, :-1].to(state.attention_mask.dtype)], 1)
    hidden = lm_hidden(
        model,
        embed_tokens(model, tokens[:, :-1]),
        response_positions(state, width - 1),
        mask,
        fork_cache(cache_kv(state.cache)),
    )
    first = token_logprobs(state.last_logits, tokens[:, 0]).unsqueeze(1)
    out = torch.cat([first, head_logprobs(model.lm_head, hidden, tokens[:, 1:], 1.0)], 1)
    return torch.where(valid, out, 0.0)


def shared_logprobs(model, state, tokens, lengths) -> torch.Tensor:
    return response_logprobs(model, state, tokens, lengths)


@contextmanager
def math_attention():
    """SharedPrefix.build with flex=False: the matmul parts on CUDA too (a comparison)."""
    build = SharedPrefix.build.__func__
    SharedPrefix.build = classmethod(lambda cls, *a, **k: build(cls, *a, **{**k, "flex": False}))
    try:
        yield
    finally:
        SharedPrefix.build = classmethod(build)


def shared_math_logprobs(model, state, tokens, lengths) -> torch.Tensor:
    with math_attention():
        return response_logprobs(model, state, tokens, lengths)


PATHS = {"expand": expand_logprobs, "shared": shared_logprobs, "shared_math": shared_math_logprobs}


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def measured(fn, dev: torch.device, repeats: int) -> tuple[object, float, float]:
    """(last result, median seconds, peak bytes above the start) after one warm-up."""
    out = fn()
    del out
    times, peak = [], 0
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sync(dev)
        t = time.perf_counter()
        out = fn()
        sync(dev)
        times.append(time.perf_counter() - t)
        if dev.type == "cuda":
            peak = max(peak, torch.cuda.max_memory_allocated() - base)
        if len(times) < repeats:
            del out
    return out, statistics.median(times), peak


def train_step(model, batch, feats, responses: Responses, g: int, micro: int, logprobs):
    """Checkpointed prefix forward, micro-batched response forward (`logprobs(model, state,
    tokens, lengths)`, one of PATHS), backward; the LLM's gradients (left in .grad) and the
    logprobs."""
    model.zero_grad(set_to_none=True)
    saved = SavedActivations()
    with checkpointed_layers(model, saved):
        prefix = prefix_forward(model, batch, feats, grad=True)

    def score(state, tokens, lengths, _rows):
        return logprobs(model, state, tokens, lengths)

    out, _ = response_micro_batches(model, prefix, responses, g, micro, score)
    w = torch.linspace(-1, 1, out.values.numel(), device=out.values.device)
    w = w.view_as(out.values)
    terms = [
        (lp * w[lo:hi]).sum()
        for (lo, hi), lp in zip(out.micro.rows, out.micro.logprobs, strict=True)
    ]
    backward_micro_batches(terms, out.micro)
    return out.values


def random_llm(spec, prompts: int, prompt_tokens: int, dev: torch.device):
    """A random-weight model of `spec` (bf16 on CUDA, its vision tower frozen and not run),
    `prompts` image prompts of about `prompt_tokens` tokens, random visual features in
    place of the tower's, and the generator that drew them (for the responses)."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    with dev:
        model = build_model(spec, seed=0, dtype=dtype).to(dev)
    for p in model.model.visual.parameters():
        p.requires_grad_(False)  # the tower is not run: random features stand in
    gen = torch.Generator().manual_seed(0)
    batch = collate_prompts(
        [image_prompt(spec, prompt_tokens, gen) for _ in range(prompts)],
        spec.special_tokens.pad_token_id,
    ).to(dev)
    batch = batch.text_only()
    visual = int((batch.mm_token_type_ids != 0).sum())
    hidden = model.config.text_config.hidden_size
    feats = torch.randn(visual, hidden, generator=gen).to(dev, dtype)
    return model, batch, feats, gen


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", default="qwen2_5_vl_3b")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=600, help="prompt tokens (image + text)")
    ap.add_argument("--max-length", type=int, default=1024, help="longest response")
    ap.add_argument("--micro", default="1,4", help="training micro-batch counts")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=170.0, help="skip configs after this")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cpu":
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    start = time.perf_counter()
    deadline = start + args.budget_s
    spec = MODEL_PRESETS[args.shape]
    model, batch, feats, gen = random_llm(spec, args.prompts, args.prompt, dev)
    dtype, text = model.dtype, model.config.text_config
    n, r = args.prompts * args.group, args.max_length
    tokens = torch.randint(10, min(spec.vocab_size, 150000), (n, r), generator=gen)
    lengths = torch.randint(max(1, r // 4), r + 1, (n,), generator=gen)
    lengths[0] = r
    responses = Responses(tokens.to(dev), lengths.to(dev))
    g = args.group
    rows: list[dict] = []

    valid = response_mask(responses.lengths, r)
    score_diff: dict[str, float] = {}
    expanded = None
    for path in PATHS:
        with torch.no_grad():
            prefix = prefix_forward(model, batch, feats, grad=False)

            def run(path=path, prefix=prefix):
                return PATHS[path](model, prefix, responses.tokens, responses.lengths)

            row = {"op": "score (no grad)", "micro": "-", "path": path}
            rows.append(row)
            try:
                lp, row["s"], row["peak"] = measured(run, dev, args.repeats)
            except Exception as err:  # a kernel that fails still leaves the others' numbers
                row["error"] = f"{type(err).__name__}: {err}"[:400]
                print(f"score {path}: {row['error']}", flush=True)
                continue
        if path == "expand":
            expanded = lp
        elif expanded is not None:
            score_diff[path] = float((expanded - lp).abs()[valid].max())
        print(f"score {path}: {row['s']:.3f} s, peak {row['peak'] / 2**30:.2f} GiB", flush=True)
        del prefix, lp

    grad_rel: dict[str, float] = {}
    for micro in [int(x) for x in args.micro.split(",")]:
        ref_grads = None
        for path in PATHS:
            row = {"op": "train fwd+bwd", "micro": micro, "path": path}
            rows.append(row)
            if time.perf_counter() > deadline:
                row["error"] = "skipped (time budget)"
                print(f"train micro={micro} {path}: skipped (time budget)", flush=True)
                continue

            def run(path=path, micro=micro):
                return train_step(model, batch, feats, responses, g, micro, PATHS[path])

            try:
                _, row["s"], row["peak"] = measured(run, dev, args.repeats)
            except Exception as err:
                row["error"] = f"{type(err).__name__}: {err}"[:400]
                print(f"train micro={micro} {path}: {row['error']}", flush=True)
                model.zero_grad(set_to_none=True)
                continue
            grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
            model.zero_grad(set_to_none=True)
            if path == "expand":
                ref_grads = grads
            elif ref_grads is not None:
                num = sum(float((a - b).norm() ** 2) for a, b in zip(grads, ref_grads, strict=True))
                den = sum(float(b.norm() ** 2) for b in ref_grads)
                grad_rel[f"{path} micro={micro}"] = (num / den) ** 0.5
            del grads
            print(
                f"train micro={micro} {path}: {row['s']:.3f} s, peak {row['peak'] / 2**30:.2f} GiB"
            )
        del ref_grads

    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    head_dim = text.hidden_size // text.num_attention_heads
    plen = int(batch.input_ids.shape[1])
    kv_expand = 2 * text.num_hidden_layers * n * text.num_key_value_heads * plen * head_dim
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device,
        "torch": torch.__version__,
        "command": "python " + " ".join(sys.argv),
        "shape": args.shape,
        "prompts": args.prompts,
        "group": g,
        "prefix_tokens": plen,
        "max_response": r,
        "response_tokens": int(responses.lengths.sum()),
        "expanded_prefix_kv_bytes": kv_expand * torch.finfo(dtype).bits // 8,
        "score_logprob_max_abs_diff": score_diff,
        "train_grad_rel_diff": grad_rel,
        "rows": rows,
        "wall_s": time.perf_counter() - start,
    }
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else args.out
    out_dir = out_dir or Path(__file__).parent / "results" / "gpu_shared_prefix"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_shared_prefix.json").write_text(json.dumps(result, indent=1))

    print(f"\n{device}, {args.shape} {dtype}, {args.prompts} prompts x G={g}, prefix {plen}")
    print(f"tokens, responses <= {r} ({result['response_tokens']} tokens); one expanded")
    print(f"prefix K/V = {result['expanded_prefix_kv_bytes'] / 2**30:.2f} GiB")
    print(f"{'op':<16}{'micro':>6}{'path':>12}{'time s':>9}{'peak GiB':>10}")
    for row in rows:
        head = f"{row['op']:<16}{row['micro']:>6}{row['path']:>12}"
        if "error" in row:
            print(f"{head}  {row['error'][:60]}")
            continue
        print(f"{head}{row['s']:>9.3f}{row['peak'] / 2**30:>10.2f}")
    agree = ", ".join(f"{k}: {v:.3e}" for k, v in score_diff.items())
    print(f"logprobs agree, max |expand - path| over valid tokens ({dtype}): {agree}")
    grads = ", ".join(f"{k}: {v:.2e}" for k, v in grad_rel.items())
    print(f"LLM gradients, |path - expand| / |expand|: {grads}")


if __name__ == "__main__":
    main()
