"""The decode engine's entry point: `DecodeEngine.start` returns an `EngineSession`
(advance(k) / steps_left / result(), the contract of backends/torch/decode.py's eager
`DecodeSession`) over a `Workspace` of static buffers, its steps replayed as CUDA graphs."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import Literal

import torch

from rollplex.engine.cache import Attention, round_up
from rollplex.engine.decoded import DecodedOutputs
from rollplex.engine.graph_capture import StepGraphs
from rollplex.engine.phases import phase
from rollplex.engine.prefix import Model, PrefixState, cache_kv
from rollplex.engine.riders import RiddenPrefix, RiderRows, ride_alone
from rollplex.engine.sampling import row_seeds
from rollplex.engine.step import DecodeStep
from rollplex.engine.triton_support import resolve
from rollplex.engine.workspace import Shape, Workspace
from rollplex.ops.formulas.engines import (
    ENGINE_PREFIX_ALIGN,
    ENGINE_ROW_BUCKETS,
    engine_attention,
    engine_prompts,
)

# the planner prices the workspace these shape (ops/formulas/engines.py torch_engine_workspace)
ROW_BUCKETS, PREFIX_ALIGN = ENGINE_ROW_BUCKETS, ENGINE_PREFIX_ALIGN
log = logging.getLogger(__name__)


def check_lengths(lengths: Sequence[int] | None, rows: int, cap: int) -> list[int] | None:
    """Forced lengths, one per row, each in [1, cap]; raises ValueError otherwise."""
    if lengths is None:
        return None
    out = [int(x) for x in lengths]
    if len(out) != rows or not all(1 <= x <= cap for x in out):
        raise ValueError(f"forced lengths need {rows} values in [1, {cap}], got {out[:8]}...")
    return out


class DecodeEngine:
    """Decode for one model. Token 0 of each row is drawn from the prefix's last logits,
    then each step feeds the last token through the model (step.py) and draws the next. A
    finished row (it emitted eos) rides along masked: its later tokens are pad, its
    logprobs 0, its length stops growing. Everything a step reads or writes lives in a
    `Workspace`, so on CUDA the step is captured once per (rows bucket, kv_len) as a CUDA
    graph and replayed; on CPU it runs eagerly. Rows are padded to a bucket (8, 16, 32, 64,
    128, then every multiple of 64: ops/formulas/engines.py) with dummy prompts, on which
    no row's tokens depend (sampling.py draws per row). Graphs and buffers are kept for the
    next session of the same shape (one shape at a time) and captured again once the
    model's weights are no longer the tensors they read.

    `use_graphs` defaults to True on CUDA. `attention`:
    - "sdpa": SDPA over the group's folded queries and a visibility mask;
    - "split" (attention.py): each row reads the prefix and only its own response K/V;
    - "flex": FlexAttention's split-KV kernel (one graph for every step: its BlockMask
      skips unwritten blocks);
    - "auto" (the default): on CUDA split on its Triton kernels (`split_kernel`) at every
      size, without them split for few prompts and SDPA for many
      (`attention_for`), on CPU SDPA.
    Under SDPA and split `kv_chunk` is how many steps one graph's kv_len covers (more
    graphs, fewer unwritten slots read). `compile` (default: on
    CUDA) fuses each layer's small kernels (step.py); a torch.compile mode name compiles
    with that mode. `fused_qkv` (default True) runs each layer's q/k/v projections as one
    GEMM over a stacked copy of their weights (fused_qkv.py), refreshed at every start;
    `compile_sampler` (default: as `compile`) compiles the draw. `skinny_gemm` (default:
    on CUDA with Triton) runs steps of few rows on skinny.py's weight-streaming GEMMs;
    `split_kernel` (default: likewise) attends under "split" on split_kernel.py's kernels;
    `kernel_writes_kv` (default: as `split_kernel`) has them write the step's K/V too
    (step.py); `split_gemm` (default: likewise) runs the o and down projections of steps of
    at most 64 rows on skinny.py's split-reduction partials.
    `keep_workspace` (default: when graphs are used) keeps the buffers and graphs after a
    session finishes, for the next session of the same shape; otherwise they are freed with
    the finished session, as the eager loop's cache was."""

    def __init__(
        self,
        model: Model,
        buckets: Sequence[int] = ROW_BUCKETS,
        use_graphs: bool | None = None,
        kv_chunk: int = 64,
        sync_every: int = 16,
        keep_workspace: bool | None = None,
        attention: Literal["auto"] | Attention = "auto",
        compile: bool | str | None = None,
        fused_qkv: bool = True,
        compile_sampler: bool | None = None,
        skinny_gemm: bool | None = None,
        split_kernel: bool | None = None,
        kernel_writes_kv: bool | None = None,
        split_gemm: bool | None = None,
    ) -> None:
        if model.config.text_config.layer_types.count("full_attention") != len(
            model.config.text_config.layer_types
        ):
            raise ValueError("the decode engine supports full-attention layers only")
        if kv_chunk < 1 or sync_every < 1 or not buckets:
            raise ValueError(
                f"need kv_chunk >= 1, sync_every >= 1 and row buckets; "
                f"got {kv_chunk}, {sync_every}, {buckets}"
            )
        self.model, self.buckets, self.kv_chunk = model, sorted(buckets), kv_chunk
        self.device = model.lm_head.weight.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.sync_every = sync_every if self.device.type == "cuda" else 1
        self.keep_workspace = self.use_graphs if keep_workspace is None else keep_workspace
        if attention not in ("auto", "sdpa", "flex", "split"):
            raise ValueError(f"attention must be auto, sdpa, flex or split, got {attention!r}")
        if attention == "auto" and self.device.type != "cuda":
            attention = "sdpa"  # the choice below was measured on an H200
        # "auto" resolves per decode (attention_for, engine_attention)
        self.attention: Literal["auto"] | Attention = attention
        # compiled layer pieces (step.py) on CUDA; CPU runs transformers' modules eagerly
        compiled = self.device.type == "cuda" if compile is None else compile
        skinny_gemm = resolve(skinny_gemm, "skinny_gemm", self.device.type)
        split_kernel = resolve(split_kernel, "split_kernel", self.device.type)
        # the kernels' own K/V write measured faster at every size (gpu_decode/fusion.md)
        kernel_writes_kv = split_kernel if kernel_writes_kv is None else kernel_writes_kv
        # never slower in the engine once its adds fused into the norm (gpu_decode/split_gemm.md)
        split_gemm = resolve(split_gemm, "split_gemm", self.device.type)
        self.forward = DecodeStep(
            model,
            compiled,
            fused_qkv,
            compile_sampler,
            skinny_gemm,
            split_kernel,
            kernel_writes_kv,
            split_gemm,
        )
        self.workspace: Workspace | None = None
        self.graphs = StepGraphs(self.device)  # its CUDA-graph captures and their pool

    def attention_for(self, prompts: int) -> Attention:
        """The attention a decode of `prompts` padded prompts runs (engine_attention for
        "auto": SDPA measured faster than flex at every 7B batch; split on its Triton
        kernels faster than SDPA at every one, on torch matmuls with few prompts only;
        bench/results/gpu_decode/)."""
        if self.attention != "auto":
            return self.attention
        kv_heads = self.model.config.text_config.num_key_value_heads
        return engine_attention(prompts, kv_heads, self.forward.split_kernel)

    def bucket_prompts(self, prompts: int, group_size: int) -> int:
        return engine_prompts(prompts, group_size, tuple(self.buckets))

    def release(self) -> None:
        """Drop the buffers and graphs (their memory returns to the allocator)."""
        self.workspace = None
        self.graphs.release()

    def start(
        self,
        prefix: PrefixState,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        generator: torch.Generator | Sequence[torch.Generator] | None,
        eos_id: int,
        pad_id: int | None = None,
        lengths: Sequence[int] | None = None,
        keep_outputs: bool = False,
    ) -> EngineSession:
        """Sample `group_size` responses per row of `prefix` (one row per prompt, as
        prefix_forward returns it): rows b*G .. b*G+G-1 are prompt b's. `lengths` forces
        row r to end after exactly lengths[r] tokens, eos ignored (see Sampling).
        `keep_outputs` (decode once) keeps every layer's output of each fed token for the
        trainer (`EngineSession.kept`); off, the step writes nothing more."""
        if max_new_tokens < 1 or group_size < 1:
            raise ValueError(
                f"need max_new_tokens, group_size >= 1, got {max_new_tokens}, {group_size}"
            )
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(
                f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}"
            )
        if prefix.last_logits is None:
            raise ValueError("decode needs the prefix's last_logits (the LM head was deferred)")
        if pad_id is None:
            pad_id = self.model.config.text_config.pad_token_id or 0
        b, g = prefix.rows, group_size
        caps = check_lengths(lengths, b * g, max_new_tokens)
        kv = cache_kv(prefix.cache)
        prompts = self.bucket_prompts(b, g)
        shape = Shape(
            prompts,
            g,
            round_up(max(kv[0][0].shape[2], 1), PREFIX_ALIGN),
            max_new_tokens,
            float(temperature),
            float(top_p),
            int(pad_id),
            self.attention_for(prompts),
            b * g if keep_outputs else 0,
        )
        if self.forward.fused is not None:
            self.forward.fused.refresh()  # the weights this decode reads (fused_qkv.py)
        ws = self._workspace(shape)
        ws.generation += 1  # an export of the last decode here is gone (decoded.py)
        # Greedy draws nothing: leave every generator (the global one too) untouched.
        seeds = row_seeds(generator, b * g, self.device) if temperature > 0 else 0
        with torch.no_grad():
            ws.cache.load(kv, prefix.lengths.to(self.device))
            ws.seeds.zero_()
            ws.seeds[: b * g] = seeds
            ws.position.zero_()
            ws.position[: b * g] = prefix.next_positions.to(self.device).repeat_interleave(g)
            ws.step.zero_()
            ws.done.zero_()
            ws.done[b * g :] = True  # padding rows: masked from the start
            ws.caps.fill_(max_new_tokens)
            ws.eos.fill_(eos_id if caps is None else -1)  # forced lengths ignore eos
            if caps is not None:
                ws.caps[: b * g] = torch.tensor(caps, device=self.device)
            ws.lengths.zero_()
            ws.tokens.fill_(pad_id)
            ws.logprobs.zero_()
            logits = prefix.last_logits.to(self.device).repeat_interleave(g, 0)
            pad_rows = ws.shape.rows - b * g
            logits = torch.cat([logits, logits[:1].expand(pad_rows, -1)]) if pad_rows else logits
            ws.record(ws.step, logits, self.forward.choose)
        return EngineSession(self, ws, b * g)

    def _workspace(self, shape: Shape) -> Workspace:
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        if self.forward.fused is not None:
            weights += self.forward.fused.addresses()  # graphs read the stacked copy
        ws = self.workspace
        if ws is not None and ws.in_use():
            # a session still in flight holds the cached buffers: this one gets its own,
            # and captures its own graphs as it goes (said, since that is slower)
            log.info(
                "decode at %d rows: another session is still decoding in the engine's cached "
                "buffers; this one allocates its own and captures its own graphs",
                shape.rows,
            )
            fresh = Workspace(self.model, shape, self.device)
            fresh.weights = weights
            return fresh
        if ws is None or ws.shape != shape or ws.weights != weights:
            self.release()  # free the old buffers before allocating new ones
            ws = self.workspace = Workspace(self.model, shape, self.device)
            ws.weights = weights
        return ws

    @property
    def capture_retries(self) -> int:
        """Graph captures CUDA invalidated and took again (graph_capture.py)."""
        return self.graphs.retries

    def kv_len(self, ws: Workspace, step: int) -> int:
        """The kv_len of the graph that runs response step `step` (slots of steps <= step)."""
        return ws.cache.kv_len(round_up(step + 1, self.kv_chunk))

    def run_step(self, ws: Workspace, step: int) -> None:
        kv_len = self.kv_len(ws, step)
        if not self.use_graphs:
            ws.body(self.forward, kv_len)
            return
        graph = ws.graphs.get(kv_len)
        if graph is None:
            name = f"CUDA-graph capture ({ws.shape.rows} rows, kv {kv_len})"
            with phase(name):  # one log line per bucket (phases.py)
                graph = ws.graphs[kv_len] = self.graphs.capture(ws, self.forward, kv_len)
        graph.replay()


class EngineSession:
    """One decode over a Workspace: advance(k) / steps_left / result(), as decode.py's."""

    def __init__(self, engine: DecodeEngine, ws: Workspace, rows: int) -> None:
        self.engine, self.ws, self.rows = engine, ws, rows
        ws.owner = weakref.ref(self)
        self.t = 1  # tokens drawn per row so far (token 0 came from the prefix logits)
        self.finished = False
        self._check_done()

    @property
    def max_new_tokens(self) -> int:
        return self.ws.shape.max_new_tokens

    @property
    def steps_left(self) -> int:
        return 0 if self.finished else self.max_new_tokens - self.t

    def _check_done(self) -> None:
        if self.t >= self.max_new_tokens or bool(self.ws.done.all()):
            self.finished = True
            if not self.engine.keep_workspace and self.engine.workspace is self.ws:
                self.engine.workspace = None  # freed with this session

    def advance(self, steps: int | None = None) -> bool:
        """Run up to `steps` decode steps (all remaining when None); True once finished.
        On CUDA, all-rows-finished is checked every `sync_every` steps (a host sync); the
        extra steps only produce masked tokens."""
        budget = self.steps_left if steps is None else min(steps, self.steps_left)
        with torch.no_grad():
            for i in range(budget):
                self.engine.run_step(self.ws, self.t - 1)
                self.t += 1
                if self.t >= self.max_new_tokens or (i + 1) % self.engine.sync_every == 0:
                    self._check_done()
                    if self.finished:
                        break
        return self.finished

    def ride(self, rows: RiderRows) -> RiddenPrefix:
        """The next decode step with `rows` riding in its GEMMs (riders.py); the rows run
        alone, through the same layer code, once the decode has finished."""
        with torch.no_grad():
            if self.finished:
                return ride_alone(self.engine.model, self.engine.forward.rotary, rows)
            kv_len = self.engine.kv_len(self.ws, self.t - 1)
            ridden = self.ws.ride(self.engine.forward, kv_len, rows)
            self.t += 1
            self._check_done()
        return ridden

    def kept(self) -> DecodedOutputs:
        """The layer outputs this decode kept (`start(keep_outputs=True)`)."""
        if self.ws.kept is None:
            raise RuntimeError("this decode kept no layer outputs (start keep_outputs=False)")
        return DecodedOutputs(self.ws, self.ws.generation, self.rows)

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens [N, R] right-padded with pad, logprobs [N, R] 0 on padding, lengths [N])."""
        if not self.finished:
            raise RuntimeError(f"decode session still has {self.steps_left} steps to run")
        n = self.rows
        ws = self.ws
        return ws.tokens[:n].clone(), ws.logprobs[:n].clone(), ws.lengths[:n].clone()

    def tensors(self) -> Iterator[torch.Tensor]:
        """What the engine holds for this decode: its workspace and stacked q/k/v weights."""
        yield from self.ws.tensors()
        if self.engine.forward.fused is not None:
            yield from self.engine.forward.fused.tensors()
