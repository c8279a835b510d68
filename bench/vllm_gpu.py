"""The vLLM rollout role (`VllmRollout`) on one H200: decode throughput, in-place weight
update, sleep level 1. Run through bench/vllm_gpu.sh on the GPU machine (vllm 0.26.0 in
/tmp/site, in-process engine); `--dry-run` exercises the CPU-side logic anywhere.

    python3 bench/vllm_gpu.py [--shapes qwen2_5_vl_3b,qwen2_5_vl_7b] [--budget-s 480]
    python3 bench/vllm_gpu.py --dry-run            # no engine: arithmetic, JSON, table
    python3 bench/vllm_gpu.py --table-only OUT/vllm_gpu.json

Per shape (folders /tmp/<shape>, random weights, Qwen tokenizer and chat template), one
engine at a time (shut down, gc, empty_cache before the next):
1. decode: 448x448 random images, G samples per prompt, batch = prompts x G; 256 new
   tokens, eos ignored (eos_id=-1), temperature 1, no logprobs. After a warm run (prompts
   now in the prefix cache) a full run and a max_new_tokens=1 run are timed; the step time
   is their difference over the difference in engine steps. HBM roofline share = (LM weight
   bytes + KV bytes read per step, averaged over the decode) / step time / 4.8e12. Then the
   same at the logprobs batch with `return_logprobs=True`.
2. weights: every tensor of the folder from GPU memory through
   `VllmRollout.load_weights(LiveWeights(...))` (collective_rpc reload_weights + prefix,
   mm and encoder cache resets); two tensors zeroed must change the tokens, restoring them
   must give the original tokens.
3. sleep: level 1, memory freed (torch.cuda.mem_get_info), sleep and wake times, same
   tokens after wake.
Results go to $OUT/vllm_gpu.json after every measurement; a markdown table is printed last
and written to $OUT/vllm_gpu.md. A section is skipped (recorded as such) once past the
budget; a watchdog writes the table and exits if the engine hangs past budget + grace.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

T0 = time.time()
HBM_BYTES_PER_S = 4.8e12  # H200
PROMPT_TEXT = "What colour is the shape in the picture? Answer with one word."
IMAGE_SIDE = 448
SECTIONS = ("decode", "logprobs", "weights", "sleep")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def log(*args: Any) -> None:
    print(f"[vllm_gpu {time.time() - T0:6.1f}s]", *args, flush=True)


def elapsed() -> float:
    return time.time() - T0


# -- arithmetic (CPU, no engine) ------------------------------------------------------------
def lm_shape(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's sizes from a Qwen2.5-VL config.json (transformers 5 keeps them
    under text_config; older folders at the top level)."""
    text = dict(config.get("text_config") or config)
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or hidden // heads)
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    return dict(
        hidden=hidden,
        layers=int(text["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(text["num_key_value_heads"]),
        head_dim=head_dim,
        intermediate=int(text["intermediate_size"]),
        vocab=int(text["vocab_size"]),
        tied=tied,
    )


def lm_params(s: dict[str, Any]) -> dict[str, int]:
    """LM parameter counts (vision tower excluded): q/k/v with bias, o, SwiGLU MLP, two
    norms per layer, final norm, embedding, and lm_head unless tied."""
    h, hd, nh, nkv = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"]
    per_layer = (
        h * nh * hd
        + nh * hd  # q
        + 2 * (h * nkv * hd + nkv * hd)  # k, v
        + nh * hd * h  # o
        + 3 * h * s["intermediate"]  # gate, up, down
        + 2 * h  # norms
    )
    embed = s["vocab"] * h
    head = 0 if s["tied"] else s["vocab"] * h
    total = s["layers"] * per_layer + h + embed + head
    return dict(total=total, embed=embed, lm_head=head, layers=s["layers"] * per_layer)


def kv_bytes_per_token(s: dict[str, Any], dtype_bytes: int = 2) -> int:
    return s["layers"] * 2 * s["kv_heads"] * s["head_dim"] * dtype_bytes


def roofline(
    lm_weight_bytes: float,
    kv_per_token: float,
    rows: int,
    prompt_len: float,
    new_tokens: int,
    step_s: float,
) -> dict[str, float]:
    """Bytes read per decode step (all LM weights once + every row's KV so far, averaged
    over the decode steps) and the share of the HBM bandwidth that the measured step uses.
    The decode steps produce tokens 2..new_tokens; the step producing token j+1 attends
    to prompt_len + j cached tokens, j = 1..new_tokens-1: mean prompt_len + new_tokens/2."""
    avg_ctx = prompt_len + new_tokens / 2
    kv_step = rows * avg_ctx * kv_per_token
    floor_s = (lm_weight_bytes + kv_step) / HBM_BYTES_PER_S
    return dict(
        avg_context=avg_ctx,
        kv_GB_per_step=kv_step / 1e9,
        lm_weight_GB=lm_weight_bytes / 1e9,
        roofline_step_ms=1e3 * floor_s,
        roofline_share=floor_s / step_s if step_s > 0 else float("nan"),
    )


def decode_figures(
    rec: dict[str, Any], full: dict[str, Any], one: dict[str, Any], shape: dict[str, Any]
) -> dict[str, Any]:
    """Step time, tokens/s and roofline share from a full run and a 1-token run."""
    steps = full["steps"] - one["steps"]
    if steps <= 0:
        steps = rec["new_tokens"] - 1
    decode_s = full["advance_s"] - one["advance_s"]
    step_s = decode_s / steps
    out = dict(
        decode_steps=steps,
        decode_s=decode_s,
        step_ms=1e3 * step_s,
        decode_tok_s=rec["rows"] * steps / decode_s if decode_s > 0 else float("nan"),
        full_run_tok_s=rec["rows"] * rec["new_tokens"] / (full["add_s"] + full["advance_s"]),
    )
    out.update(
        roofline(
            shape["lm_weight_bytes"],
            shape["kv_bytes_per_token"],
            rec["rows"],
            full["prompt_len"],
            rec["new_tokens"],
            step_s,
        )
    )
    return out


# -- results --------------------------------------------------------------------------------
class Results:
    def __init__(self, out_dir: Path, meta: dict[str, Any]) -> None:
        self.dir = out_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "vllm_gpu.json"
        self.data: dict[str, Any] = {"meta": meta, "shapes": {}}
        self._lock = threading.Lock()

    def shape(self, name: str) -> dict[str, Any]:
        return self.data["shapes"].setdefault(
            name, {"decode": [], "weights": {}, "sleep": {}, "engine": {}, "errors": []}
        )

    def save(self) -> None:
        with self._lock:
            self.data["meta"]["elapsed_s"] = round(elapsed(), 1)
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str))
            tmp.replace(self.path)

    def error(self, shape: str, where: str, e: BaseException) -> None:
        traceback.print_exc()
        self.shape(shape)["errors"].append(f"{where}: {type(e).__name__}: {str(e)[:400]}")
        log("ERROR", shape, where, repr(e)[:300])
        self.save()

    def skip(self, shape: str, where: str) -> None:
        self.shape(shape)["errors"].append(f"{where}: skipped (past the time budget)")
        log("SKIP", shape, where, "(budget)")
        self.save()

    def finish(self) -> str:
        md = table(self.data)
        with self._lock:
            (self.dir / "vllm_gpu.md").write_text(md)
        return md


def _f(v: Any, fmt: str) -> str:
    if v is None:
        return "-"
    try:
        return format(v, fmt)
    except (TypeError, ValueError):
        return str(v)


def table(data: dict[str, Any]) -> str:
    meta = data.get("meta", {})
    lines = [
        f"# VllmRollout on {meta.get('device', '?')} (vllm {meta.get('vllm', '?')}"
        f"{', DRY RUN: numbers are made up' if meta.get('dry_run') else ''})",
        "",
        f"Decode: G={meta.get('group_size')}, {meta.get('new_tokens')} new tokens, eos ignored,"
        " prompts in the prefix cache; ms per step = (full run - 1-token run) / steps;"
        " roofline = (LM weights + mean KV per step) / step / 4.8 TB/s.",
        "",
        "| shape | batch | logprobs | ms/step | decode tok/s | HBM roofline | roofline ms"
        " | KV GB/step | prompt len |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in data.get("shapes", {}).items():
        for d in s.get("decode", []):
            if "step_ms" not in d:
                lines.append(
                    f"| {name} | {d.get('batch')} | {d.get('logprobs')} | "
                    f"error: {str(d.get('error', '?'))[:60]} | | | | | |"
                )
                continue
            lines.append(
                f"| {name} | {d['batch']} | {'yes' if d['logprobs'] else 'no'} | "
                f"{_f(d['step_ms'], '.2f')} | {_f(d['decode_tok_s'], ',.0f')} | "
                f"{_f(100 * d['roofline_share'], '.0f')}% | {_f(d['roofline_step_ms'], '.2f')} | "
                f"{_f(d['kv_GB_per_step'], '.2f')} | {_f(d['prompt_len'], '.0f')} |"
            )
    lines += [
        "",
        "| shape | engine start s | weights GB | full update s (runs) | zeroed 2 tensors:"
        " rows changed | restored: same tokens | sleep freed GiB | sleep s | wake s |"
        " same after wake |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in data.get("shapes", {}).items():
        e, w, z = s.get("engine", {}), s.get("weights", {}), s.get("sleep", {})
        runs = w.get("full_update_s") or []
        upd = (
            f"{statistics.median(runs):.2f} ({', '.join(f'{x:.2f}' for x in runs)})"
            if runs
            else "-"
        )
        changed = (
            f"{w.get('rows_changed')}/{w.get('rows')}" if w.get("rows_changed") is not None else "-"
        )
        lines.append(
            f"| {name} | {_f(e.get('startup_s'), '.1f')} | {_f(w.get('bytes_GB'), '.2f')} | "
            f"{upd} | "
            f"{changed} | {_f(w.get('same_after_restore'), '')} | "
            f"{_f(z.get('freed_GiB'), '.1f')} | {_f(z.get('sleep_s'), '.2f')} | "
            f"{_f(z.get('wake_s'), '.2f')} | {_f(z.get('same_after_wake'), '')} |"
        )
    errors = [(n, m) for n, s in data.get("shapes", {}).items() for m in s.get("errors", [])]
    errors += [("-", m) for m in data.get("meta", {}).get("errors", [])]
    if errors:
        lines += ["", "Errors and skips:"] + [f"- {n}: {m}" for n, m in errors]
    lines.append(f"\n(elapsed {meta.get('elapsed_s', '?')} s of budget {meta.get('budget_s')} s)")
    return "\n".join(lines) + "\n"


# -- the engine side ------------------------------------------------------------------------
def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.mem_get_info()[0] / 2**30


def random_image(seed: int) -> Any:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, 3)
    a = np.clip(base + rng.normal(0, 20, (IMAGE_SIDE, IMAGE_SIDE, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(a)


def prompt_ids(folder: Path) -> tuple[list[int], dict[str, Any]]:
    """The easy prompt through the folder's chat template (one image placeholder)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT_TEXT}]}
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    return ids, dict(text_tokens=len(ids), image_pads=ids.count(pad), text=text[-120:])


def media_for(n: int, seed: int) -> Any:
    from rollplex.backends.vllm import Media

    return Media(tuple((random_image(seed + i),) for i in range(n)))


class Bench:
    def __init__(self, args: argparse.Namespace, res: Results) -> None:
        self.a, self.res = args, res
        self.rollout: Any = None

    def left(self) -> float:
        return self.a.budget_s - elapsed()

    # one timed rollout through the role
    def run(self, prefix: Any, group: int, new_tokens: int, seed: int) -> dict[str, Any]:
        from rollplex.backends.base import Sampling

        sampling = Sampling(new_tokens, 1.0, 1.0, -1, self.pad_id)  # eos -1: never stops
        sync()
        t0 = time.perf_counter()
        session = self.rollout.start_decode(prefix, group, sampling, seed)
        sync()
        t1 = time.perf_counter()
        try:
            session.advance()
        except BaseException:
            self.recover(session)
            raise
        sync()
        t2 = time.perf_counter()
        responses, logprobs = session.result()
        lengths = responses.lengths
        return dict(
            add_s=t1 - t0,
            advance_s=t2 - t1,
            steps=int(getattr(session, "_steps", new_tokens)),
            prompt_len=statistics.mean(session.prompt_lengths),
            min_len=int(lengths.min()),
            max_len=int(lengths.max()),
            has_logprobs=logprobs is not None,
            tokens=responses.tokens,
        )

    def recover(self, session: Any) -> None:
        try:
            session.abort()
        except Exception:
            traceback.print_exc()
        self.rollout._session = None

    # -- engine ----------------------------------------------------------------------------
    def start(self, name: str, folder: Path) -> bool:
        from rollplex.backends.vllm import VllmRollout
        from rollplex.specs.vllm import VllmSpec

        rec = self.res.shape(name)["engine"]
        self.spec = VllmSpec(
            dtype="bfloat16",
            max_model_len=4096,
            kv_cache_bytes=int(self.a.kv_gib * 2**30),
            gpu_memory_utilization=self.a.gpu_mem_util,
            enable_sleep_mode=True,
            return_logprobs=False,
            max_num_seqs=max(256, max(self.a.batches)),
        )
        rec.update(spec=self.spec.model_dump(), folder=str(folder), free_before_GiB=free_gib())
        log("START", name, folder, rec["spec"])
        t0 = time.perf_counter()
        self.rollout = VllmRollout(folder, self.spec)
        rec["startup_s"] = time.perf_counter() - t0
        rec["free_after_start_GiB"] = free_gib()
        config = json.loads((folder / "config.json").read_text())
        self.pad_id = int(
            config.get("pad_token_id")
            or config.get("text_config", {}).get("pad_token_id")
            or 151643
        )
        shape = lm_shape(config)
        counts = lm_params(shape)
        try:  # what the engine really holds, when it says
            engine_lm = self.rollout.llm.apply_model(
                lambda m: sum(p.numel() for k, p in m.named_parameters() if "visual" not in k)
            )[0]
            engine_vis = self.rollout.llm.apply_model(
                lambda m: sum(p.numel() for k, p in m.named_parameters() if "visual" in k)
            )[0]
        except Exception as e:
            engine_lm = engine_vis = None
            rec["apply_model_error"] = repr(e)[:300]
        rec.update(
            lm_shape=shape,
            lm_params_config=counts,
            lm_params_engine=engine_lm,
            visual_params_engine=engine_vis,
        )
        lm = engine_lm or counts["total"]
        self.shape = dict(lm_weight_bytes=2 * lm, kv_bytes_per_token=kv_bytes_per_token(shape))
        rec.update(self.shape)
        self.ids, rec["prompt"] = prompt_ids(folder)
        log("STARTED", name, f"{rec['startup_s']:.1f}s", json.dumps(rec["prompt"]))
        self.res.save()
        return True

    def stop(self, name: str) -> None:
        import torch

        rec = self.res.shape(name)["engine"]
        t0 = time.perf_counter()
        try:
            if self.rollout is not None:
                self.rollout.shutdown()
        except Exception as e:
            self.res.error(name, "shutdown", e)
        self.rollout = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        rec["shutdown_s"] = time.perf_counter() - t0
        rec["free_after_shutdown_GiB"] = free_gib()
        log("STOPPED", name, f"free {rec['free_after_shutdown_GiB']} GiB")
        self.res.save()

    # -- 1. decode --------------------------------------------------------------------------
    def decode(self, name: str, batch: int, logprobs: bool, seed: int) -> None:
        g = self.a.group_size
        rec: dict[str, Any] = dict(
            batch=batch,
            group_size=g,
            prompts=batch // g,
            rows=(batch // g) * g,
            new_tokens=self.a.new_tokens,
            logprobs=logprobs,
        )
        self.res.shape(name)["decode"].append(rec)
        self.rollout.spec = self.spec.model_copy(update={"return_logprobs": logprobs})
        try:
            media = media_for(batch // g, seed)
            prefix = self.rollout.prefix_prefill(
                self.rollout.vision_encode(media), [self.ids] * (batch // g)
            )
            runs = {}
            for label, n in (("warm", self.a.new_tokens), ("full", self.a.new_tokens), ("one", 1)):
                r = self.run(prefix, g, n, seed)
                r.pop("tokens")
                runs[label] = r
                log("DECODE", name, batch, "logprobs" if logprobs else "", label, json.dumps(r))
            rec["runs"] = runs
            if logprobs and not runs["full"]["has_logprobs"]:
                rec["note"] = "logprobs were asked for but the role returned none"
            rec.update(decode_figures(rec, runs["full"], runs["one"], self.shape))
            rec["prompt_len"] = runs["full"]["prompt_len"]
            log("DECODE", name, batch, json.dumps({k: v for k, v in rec.items() if k != "runs"}))
        finally:
            self.rollout.spec = self.spec
            self.res.save()

    # -- 2. weights -------------------------------------------------------------------------
    def one_prompt(self, seed: int = 7) -> Any:
        if not hasattr(self, "_one"):
            media = media_for(1, 10_000)
            self._one = self.rollout.prefix_prefill(self.rollout.vision_encode(media), [self.ids])
        return self.run(self._one, self.a.group_size, self.a.check_tokens, seed)["tokens"]

    def weights(self, name: str, folder: Path) -> dict[str, Any]:
        import torch
        from safetensors import safe_open

        from rollplex.backends.base import LiveWeights

        rec = self.res.shape(name)["weights"]
        t0 = time.perf_counter()
        W: dict[str, torch.Tensor] = {}
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), framework="pt", device=dev) as st:
                for k in st.keys():  # noqa: SIM118
                    W[k] = st.get_tensor(k)
        sync()
        rec.update(
            read_to_gpu_s=time.perf_counter() - t0,
            tensors=len(W),
            bytes_GB=sum(t.numel() * t.element_size() for t in W.values()) / 1e9,
            path="VllmRollout.load_weights(LiveWeights(dict on GPU)) -> collective_rpc"
            "('reload_weights') + reset prefix/mm/encoder caches",
        )
        self.res.save()
        base = self.one_prompt()
        rec["rows"] = int(base.shape[0])
        times: list[float] = []

        def load(tensors: dict[str, torch.Tensor], version: int) -> float:
            sync()
            t = time.perf_counter()
            self.rollout.load_weights(LiveWeights(tensors, "policy", version))
            sync()
            dt = time.perf_counter() - t
            log(
                "LOAD_WEIGHTS",
                name,
                f"v{version}",
                f"{dt:.3f}s",
                f"(role: {self.rollout.last_update_seconds:.3f}s)",
            )
            return dt

        times.append(load(W, 1))  # same weights: tokens must not move
        rec["full_update_s"] = times
        rec["same_after_identical_update"] = bool(torch.equal(self.one_prompt(), base))
        self.res.save()
        zk = [
            k
            for k in W
            if "visual" not in k
            and (
                k.endswith("layers.0.mlp.down_proj.weight")
                or k.endswith("layers.0.self_attn.o_proj.weight")
            )
        ]
        rec["zeroed"] = zk
        perturbed = dict(W)
        for k in zk:
            perturbed[k] = torch.zeros_like(W[k])
        times.append(load(perturbed, 2))
        z = self.one_prompt()
        rec["rows_changed"] = int((z != base).any(dim=1).sum())
        rec["changed_after_zeroing"] = rec["rows_changed"] > 0
        del perturbed
        self.res.save()
        times.append(load(W, 3))
        rec["same_after_restore"] = bool(torch.equal(self.one_prompt(), base))
        self.res.save()
        for v in (4, 5):
            if self.left() < 30:
                break
            times.append(load(W, v))
        rec["weights_version"] = self.rollout.weights_version
        rec["full_update_median_s"] = statistics.median(times)
        log("WEIGHTS", name, json.dumps({k: v for k, v in rec.items() if k != "zeroed"}))
        self.res.save()
        del W
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return rec

    # -- 3. sleep ---------------------------------------------------------------------------
    def sleep(self, name: str) -> None:
        import torch

        rec = self.res.shape(name)["sleep"]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        base = self.one_prompt()
        sync()
        f_a = free_gib()
        t = time.perf_counter()
        self.rollout.sleep(level=1)
        sync()
        rec["sleep_s"] = time.perf_counter() - t
        f_b = free_gib()
        freed = f_b - f_a if f_a is not None and f_b is not None else None
        rec.update(free_before_GiB=f_a, free_asleep_GiB=f_b, freed_GiB=freed)
        self.res.save()
        t = time.perf_counter()
        self.rollout.wake_up()  # the role resets the caches after the wake-up
        sync()
        rec["wake_s"] = time.perf_counter() - t
        rec["free_after_wake_GiB"] = free_gib()
        rec["same_after_wake"] = bool(torch.equal(self.one_prompt(), base))
        log("SLEEP", name, json.dumps(rec))
        self.res.save()

    # -- one shape ------------------------------------------------------------------------
    def shape_all(self, name: str, folder: Path) -> None:
        res = self.res
        if self.left() < self.a.min_engine_s:
            res.skip(name, f"engine start ({self.left():.0f}s left < {self.a.min_engine_s}s)")
            return
        try:
            self.start(name, folder)
        except Exception as e:
            res.error(name, "engine start", e)
            self.stop(name)
            return
        try:
            if "decode" in self.a.sections:
                for i, b in enumerate(self.a.batches):
                    if self.left() < 20:
                        res.skip(name, f"decode batch {b}")
                        continue
                    try:
                        self.decode(name, b, False, 1000 * (i + 1))
                    except Exception as e:
                        res.shape(name)["decode"][-1]["error"] = repr(e)[:300]
                        res.error(name, f"decode batch {b}", e)
            if "logprobs" in self.a.sections:
                b = self.a.logprobs_batch
                if self.left() < 30:
                    res.skip(name, f"decode batch {b} with logprobs")
                else:
                    try:
                        # the same prompts as the plain run at this batch (already cached)
                        i = self.a.batches.index(b) if b in self.a.batches else 9
                        self.decode(name, b, True, 1000 * (i + 1))
                    except Exception as e:
                        res.shape(name)["decode"][-1]["error"] = repr(e)[:300]
                        res.error(name, f"decode batch {b} with logprobs", e)
            if "weights" in self.a.sections:
                if self.left() < 40:
                    res.skip(name, "weights")
                else:
                    try:
                        self.weights(name, folder)
                    except Exception as e:
                        res.error(name, "weights", e)
                        gc.collect()
            if "sleep" in self.a.sections:
                if self.left() < 25:
                    res.skip(name, "sleep")
                else:
                    try:
                        self.sleep(name)
                    except Exception as e:
                        res.error(name, "sleep", e)
        finally:
            if hasattr(self, "_one"):
                del self._one
            self.stop(name)


# -- dry run: the same bookkeeping with made-up timings ------------------------------------
def dry_run(args: argparse.Namespace, res: Results) -> None:
    from rollplex.specs.model import MODEL_PRESETS

    for name in args.shapes:
        folder = Path(args.models_dir) / name
        if (folder / "config.json").is_file():
            config = json.loads((folder / "config.json").read_text())
            try:
                _, info = prompt_ids(folder)
                res.shape(name)["engine"]["prompt"] = info
            except Exception as e:
                res.error(name, "prompt", e)
        else:
            config = MODEL_PRESETS[name].to_hf_config().to_dict()
        shape = lm_shape(config)
        counts = lm_params(shape)
        sh = dict(lm_weight_bytes=2 * counts["total"], kv_bytes_per_token=kv_bytes_per_token(shape))
        res.shape(name)["engine"].update(lm_shape=shape, lm_params_config=counts, **sh)
        log("DRY", name, json.dumps(counts), json.dumps(sh))
        for b, lp in [(b, False) for b in args.batches] + [(args.logprobs_batch, True)]:
            rec = dict(
                batch=b,
                group_size=args.group_size,
                prompts=b // args.group_size,
                rows=b,
                new_tokens=args.new_tokens,
                logprobs=lp,
            )
            step = 0.004 + 2e-5 * b * (2 if lp else 1)
            full = dict(
                add_s=0.1,
                advance_s=0.05 + step * args.new_tokens,
                steps=args.new_tokens,
                prompt_len=281.0,
            )
            one = dict(add_s=0.1, advance_s=0.05 + step, steps=1, prompt_len=281.0)
            rec["runs"] = dict(full=full, one=one)
            rec.update(decode_figures(rec, full, one, sh))
            rec["prompt_len"] = full["prompt_len"]
            res.shape(name)["decode"].append(rec)
            res.save()
        res.shape(name)["weights"].update(
            bytes_GB=sh["lm_weight_bytes"] / 1e9,
            full_update_s=[0.5, 0.4, 0.45],
            rows=8,
            rows_changed=8,
            same_after_restore=True,
        )
        res.shape(name)["sleep"].update(
            freed_GiB=20.0, sleep_s=3.0, wake_s=0.4, same_after_wake=True
        )
        res.save()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shapes",
        default="qwen2_5_vl_3b,qwen2_5_vl_7b",
        type=lambda s: [x for x in s.split(",") if x],
    )
    p.add_argument("--models-dir", default="/tmp", help="folders are <models-dir>/<shape>")
    p.add_argument(
        "--batches", default="8,32,64,256", type=lambda s: [int(x) for x in s.split(",") if x]
    )
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--logprobs-batch", type=int, default=256)
    p.add_argument(
        "--check-tokens",
        type=int,
        default=64,
        help="tokens per row of the one-prompt checks (weights, sleep)",
    )
    p.add_argument("--kv-gib", type=float, default=16.0, help="kv_cache_bytes of the spec")
    p.add_argument(
        "--gpu-mem-util",
        type=float,
        default=0.35,
        help="vLLM's gpu_memory_utilization (start-up checks free >= this share)",
    )
    p.add_argument(
        "--sections", default=",".join(SECTIONS), type=lambda s: [x for x in s.split(",") if x]
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="skip remaining sections past this many seconds from start",
    )
    p.add_argument(
        "--grace-s",
        type=float,
        default=60.0,
        help="watchdog: write the table and exit this long past the budget",
    )
    p.add_argument(
        "--min-engine-s",
        type=float,
        default=110.0,
        help="do not start an engine with less than this left",
    )
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    p.add_argument("--dry-run", action="store_true", help="no engine; made-up timings")
    p.add_argument("--table-only", metavar="JSON", help="print the table of a results file")
    a = p.parse_args(argv)
    bad = [s for s in a.sections if s not in SECTIONS]
    if bad:
        p.error(f"--sections: unknown {bad}; choose from {SECTIONS}")
    bad = [b for b in [*a.batches, a.logprobs_batch] if b < a.group_size or b % a.group_size]
    if bad:
        p.error(f"batches {bad} are not multiples of --group-size {a.group_size}")
    if a.new_tokens < 2:
        p.error("--new-tokens must be >= 2 (the step time is full run - 1-token run)")
    return a


def watchdog(res: Results, deadline_s: float) -> None:
    def fire() -> None:
        time.sleep(max(deadline_s - elapsed(), 0))
        log(f"WATCHDOG: {deadline_s:.0f}s passed; writing what there is and exiting")
        try:
            import faulthandler

            faulthandler.dump_traceback(all_threads=True)
            res.data["meta"].setdefault("errors", []).append(
                f"watchdog fired at {elapsed():.0f}s (a section hung or ran long)"
            )
            res.save()
            print(res.finish(), flush=True)
        finally:
            os._exit(3)

    threading.Thread(target=fire, daemon=True, name="watchdog").start()


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.table_only:
        data = json.loads(Path(a.table_only).read_text())
        md = table(data)
        Path(a.table_only).with_name("vllm_gpu.md").write_text(md)
        print(md, flush=True)
        return 0
    meta: dict[str, Any] = dict(
        budget_s=a.budget_s,
        group_size=a.group_size,
        new_tokens=a.new_tokens,
        batches=a.batches,
        logprobs_batch=a.logprobs_batch,
        sections=a.sections,
        kv_gib=a.kv_gib,
        gpu_mem_util=a.gpu_mem_util,
        dry_run=a.dry_run,
        image_side=IMAGE_SIDE,
        hbm_bytes_per_s=HBM_BYTES_PER_S,
        env={
            k: os.environ.get(k)
            for k in (
                "VLLM_ENABLE_V1_MULTIPROCESSING",
                "VLLM_USE_FLASHINFER_SAMPLER",
                "PYTORCH_CUDA_ALLOC_CONF",
            )
        },
        started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0)),
    )
    res = Results(Path(a.out), meta)
    res.save()
    if a.dry_run:
        dry_run(a, res)
        md = res.finish()
        print(md, flush=True)
        return 0
    watchdog(res, a.budget_s + a.grace_s)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    try:
        import torch

        meta.update(torch=torch.__version__, device=torch.cuda.get_device_name())
        t = time.perf_counter()
        import vllm

        meta.update(vllm=vllm.__version__, vllm_import_s=time.perf_counter() - t)
        log(
            "vllm",
            vllm.__version__,
            "torch",
            torch.__version__,
            meta["device"],
            f"import {meta['vllm_import_s']:.1f}s, free {free_gib():.1f} GiB",
        )
    except Exception as e:
        traceback.print_exc()
        meta.setdefault("errors", []).append(f"import: {type(e).__name__}: {str(e)[:400]}")
        res.save()
        print(res.finish(), flush=True)
        return 2
    res.save()
    bench = Bench(a, res)
    for name in a.shapes:
        folder = Path(a.models_dir) / name
        if not (folder / "config.json").is_file():
            res.shape(name)["errors"].append(f"no model folder at {folder}")
            res.save()
            continue
        try:
            bench.shape_all(name, folder)
        except Exception as e:  # anything shape_all did not catch
            res.error(name, "shape", e)
    md = res.finish()
    res.save()
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
