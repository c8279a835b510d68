"""attention="split" as two Triton kernels (CUDA, or Triton's CPU interpreter in tests),
flash-decoding style: `_partials` per piece of work, then `_merge` per row, in place of the
compiled torch version's seven or so kernels a layer (attention.split_attention)."""

from __future__ import annotations

import torch

from rollplex.engine.triton_support import triton

if triton is not None:
    import triton.language as tl

BLOCK_KEYS = 64  # keys per tile in both kernels
# folded query rows per prefix program: 128 x 128 float32 accumulators compile without
# register spills for sm_90 (ptxas -v), 256 spill 1.5 KB a thread
MAX_QUERY_BLOCK = 128


def prefix_chunks(pairs: int, prefix_cap: int, programs: int) -> tuple[int, int]:
    """(chunks, keys per chunk) for `pairs` (prompt, K/V head) pairs over a prefix buffer of
    `prefix_cap` keys: enough chunks that the prefix programs alone fill `programs` (two
    per SM), none shorter than one tile, each a whole number of tiles."""
    tiles = max(1, -(-prefix_cap // BLOCK_KEYS))
    wanted = max(1, min(tiles, -(-programs // pairs)))
    per = -(-tiles // wanted)  # tiles per chunk
    return -(-tiles // per), per * BLOCK_KEYS


def _pow2(x: int, least: int = 16) -> int:
    return max(least, 1 << (x - 1).bit_length())


if triton is not None:

    @triton.jit
    def _flash(q, k_base, v_base, start, stop, stride_t, offs_d, dims, scale,
               ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
        """Keys [start, stop) of one K/V sequence (rows `stride_t` apart) for the query block
        q [ROWS, BLOCK_D]: the running (max, sum of exps, unnormalised output), online."""
        top = tl.full((ROWS,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((ROWS,), dtype=tl.float32)
        acc = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)
        for lo in range(start, stop, BLOCK_N):
            keys = lo + tl.arange(0, BLOCK_N)
            seen = keys < stop
            offs = keys[:, None] * stride_t + offs_d[None, :]
            inside = seen[:, None] & dims[None, :]
            k = tl.load(k_base + offs, mask=inside, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            s = tl.where(seen[None, :], s, float("-inf"))
            new_top = tl.maximum(top, tl.max(s, 1))
            p = tl.exp(s - new_top[:, None])
            alpha = tl.exp(top - new_top)
            v = tl.load(v_base + offs, mask=inside, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            total = total * alpha + tl.sum(p, 1)
            top = new_top
        return top, total, acc

    @triton.jit
    def _store_partial(m_ptr, l_ptr, o_ptr, at, m, total, acc, rows, offs_d, dims,
                       D: tl.constexpr):  # fmt: skip
        """A piece's (max, sum, unnormalised output) at partial rows `at`."""
        tl.store(m_ptr + at, m, mask=rows)
        tl.store(l_ptr + at, total, mask=rows)
        tl.store(o_ptr + at[:, None] * D + offs_d[None, :], acc, mask=rows[:, None] & dims[None, :])

    @triton.jit
    def _prefix_piece(
        q_ptr, pk_ptr, pv_ptr, len_ptr, pm_ptr, pl_ptr, po_ptr, pair, chunk, tile, b, j,
        scale, group, rep, chunks, chunk_keys, sq_b, sq_h, sq_g, sp_b, sp_h, sp_t,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        """Chunk `chunk` of prompt b's prefix for tile `tile` of the folded queries of K/V
        head j."""
        offs_d = tl.arange(0, BLOCK_D)
        dims = offs_d < D
        # query t = r * G + g: row g's r-th query head of K/V head j
        offs_t = tile * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rows = offs_t < rep * group
        heads = j * rep + offs_t // group
        q = tl.load(
            q_ptr + b * sq_b + heads[:, None] * sq_h + (offs_t % group)[:, None] * sq_g
            + offs_d[None, :], mask=rows[:, None] & dims[None, :], other=0.0,
        )  # fmt: skip
        start = chunk * chunk_keys
        stop = tl.minimum(start + chunk_keys, tl.load(len_ptr + b).to(tl.int32))
        m, total, acc = _flash(
            q, pk_ptr + b * sp_b + j * sp_h, pv_ptr + b * sp_b + j * sp_h, start, stop,
            sp_t, offs_d, dims, scale, BLOCK_Q, BLOCK_D, BLOCK_N,
        )  # fmt: skip
        at = (pair * chunks + chunk) * rep * group + offs_t
        _store_partial(pm_ptr, pl_ptr, po_ptr, at, m, total, acc, rows, offs_d, dims, D)

    @triton.jit
    def _own_piece(
        q_ptr, ok_ptr, ov_ptr, step_ptr, om_ptr, ol_ptr, oo_ptr, nk_ptr, nv_ptr, pair, g, b, j,
        scale, group, rep, own_keys, sq_b, sq_h, sq_g, so_b, so_h, so_g, so_t,
        snk_b, snk_h, snk_g, snv_b, snv_h, snv_g,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
        WRITE: tl.constexpr,
    ):  # fmt: skip
        """Row g's rep query heads of K/V head j over its own response keys so far; with
        WRITE, first the step's own key and value into the row's buffer."""
        offs_d = tl.arange(0, BLOCK_D)
        dims = offs_d < D
        step = tl.load(step_ptr).to(tl.int32)
        own = b * so_b + j * so_h + g * so_g
        if WRITE:  # this program is the only one that reads row g's keys of head j
            new_k = b * snk_b + j * snk_h + g * snk_g + offs_d
            new_v = b * snv_b + j * snv_h + g * snv_g + offs_d
            slot = own + step * so_t + offs_d
            tl.store(ok_ptr + slot, tl.load(nk_ptr + new_k, mask=dims), mask=dims)
            tl.store(ov_ptr + slot, tl.load(nv_ptr + new_v, mask=dims), mask=dims)
            tl.debug_barrier()  # the block's stores visible to all its threads' loads
        offs_r = tl.arange(0, BLOCK_R)
        rows = offs_r < rep
        q = tl.load(
            q_ptr + b * sq_b + (j * rep + offs_r)[:, None] * sq_h + g * sq_g + offs_d[None, :],
            mask=rows[:, None] & dims[None, :], other=0.0,
        )  # fmt: skip
        stop = tl.minimum(step + 1, own_keys)
        m, total, acc = _flash(
            q, ok_ptr + own, ov_ptr + own, 0, stop, so_t, offs_d, dims, scale,
            BLOCK_R, BLOCK_D, BLOCK_N,
        )  # fmt: skip
        at = (pair * group + g) * rep + offs_r
        _store_partial(om_ptr, ol_ptr, oo_ptr, at, m, total, acc, rows, offs_d, dims, D)

    @triton.jit
    def _partials(
        q_ptr, pk_ptr, pv_ptr, len_ptr, ok_ptr, ov_ptr, step_ptr,
        pm_ptr, pl_ptr, po_ptr, om_ptr, ol_ptr, oo_ptr, nk_ptr, nv_ptr,
        scale, kv_heads, group, rep, chunks, chunk_keys, tiles, own_keys,
        sq_b, sq_h, sq_g, sp_b, sp_h, sp_t, so_b, so_h, so_g, so_t,
        snk_b, snk_h, snk_g, snv_b, snv_h, snv_g,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, WRITE: tl.constexpr,
    ):  # fmt: skip
        pair = tl.program_id(0)  # b * kv_heads + j
        piece = tl.program_id(1)  # (prefix chunk, query tile) pairs, then one per row
        b, j = pair // kv_heads, pair % kv_heads
        # each branch in its own function: their blocks differ in shape (Triton types a
        # variable set in both branches of an `if` as one)
        if piece < chunks * tiles:
            _prefix_piece(
                q_ptr, pk_ptr, pv_ptr, len_ptr, pm_ptr, pl_ptr, po_ptr, pair, piece // tiles,
                piece % tiles, b, j,
                scale, group, rep, chunks, chunk_keys, sq_b, sq_h, sq_g, sp_b, sp_h, sp_t,
                D, BLOCK_D, BLOCK_Q, BLOCK_N,
            )  # fmt: skip
        else:
            _own_piece(
                q_ptr, ok_ptr, ov_ptr, step_ptr, om_ptr, ol_ptr, oo_ptr, nk_ptr, nv_ptr, pair,
                piece - chunks * tiles, b, j, scale, group, rep, own_keys, sq_b, sq_h, sq_g,
                so_b, so_h, so_g, so_t, snk_b, snk_h, snk_g, snv_b, snv_h, snv_g,
                D, BLOCK_D, BLOCK_R, BLOCK_N, WRITE,
            )  # fmt: skip

    @triton.jit
    def _merge(
        pm_ptr, pl_ptr, po_ptr, om_ptr, ol_ptr, oo_ptr, out_ptr,
        kv_heads, group, rep, chunks, sout_b, sout_g,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    ):  # fmt: skip
        pair, g = tl.program_id(0), tl.program_id(1)
        b, j = pair // kv_heads, pair % kv_heads
        offs_r = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, BLOCK_D)
        qrows = offs_r < rep
        tile = qrows[:, None] & (offs_d < D)[None, :]
        own = (pair * group + g) * rep + offs_r
        # the row's own part always holds a key (its current step's), so `top` is finite
        top = tl.load(om_ptr + own, mask=qrows, other=0.0)
        for c in range(0, chunks):
            at = (pair * chunks + c) * rep * group + offs_r * group + g
            top = tl.maximum(top, tl.load(pm_ptr + at, mask=qrows, other=float("-inf")))
        w = tl.exp(tl.load(om_ptr + own, mask=qrows, other=0.0) - top)
        total = tl.load(ol_ptr + own, mask=qrows, other=0.0) * w
        acc = tl.load(oo_ptr + own[:, None] * D + offs_d[None, :], mask=tile, other=0.0)
        acc = acc * w[:, None]
        for c in range(0, chunks):
            at = (pair * chunks + c) * rep * group + offs_r * group + g
            w = tl.exp(tl.load(pm_ptr + at, mask=qrows, other=float("-inf")) - top)
            total += tl.load(pl_ptr + at, mask=qrows, other=0.0) * w
            part = tl.load(po_ptr + at[:, None] * D + offs_d[None, :], mask=tile, other=0.0)
            acc += part * w[:, None]
        out = acc / tl.where(qrows, total, 1.0)[:, None]  # padding heads: no 0 / 0
        cols = (j * rep + offs_r)[:, None] * D + offs_d[None, :]
        tl.store(
            out_ptr + b * sout_b + g * sout_g + cols, out.to(out_ptr.dtype.element_ty),
            mask=tile,
        )  # fmt: skip


def split_attention_kernel(
    q: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    prefix_lengths: torch.Tensor,
    own_k: torch.Tensor,
    own_v: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    programs: int | None = None,
    new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """attention.split_attention's contract on the two kernels: q [B, H, G, D] over prompt
    b's first `prefix_lengths[b]` prefix keys [B, Hkv, C, D] and row g's own response keys
    [B, Hkv, G, n, D] at steps <= `step`: [B, G, H * D]. `programs`: how many prefix
    programs to aim for (default two per SM). `new_kv`: this step's K and V [B, Hkv, G, D],
    which the kernel writes into own_k / own_v at `step` before reading them (instead of a
    cache write of two launches before it).

    1. `_partials`, one program per (prompt, K/V head) and piece of work: a chunk of the
       prefix for the folded query block of the group's G rows x the rep query heads (the
       prefix read once per prompt), or one row's own response keys for its rep heads; each
       leaves its running (max, sum of exps, unnormalised output) in float32.
    2. `_merge`, one program per (prompt, K/V head, row): the row's pieces by log-sum-exp.
    Prefix chunks spread a step over the SMs when few prompts share it: the 7B's one prompt
    and four K/V heads would otherwise be four programs on 132 SMs. More than
    MAX_QUERY_BLOCK folded query rows (56 at the 7B with G = 8) take several query tiles a
    chunk, each reading the chunk (from L2 after the first). Rounding as the torch version:
    scores and exps in float32, exps cast to the values' dtype for PV, normalised after the
    merge."""
    b, heads, g, d = q.shape
    kv_heads, cap, n = prefix_k.shape[1], prefix_k.shape[2], own_k.shape[3]
    rep = heads // kv_heads
    for name, t in (("prefix_k", prefix_k), ("prefix_v", prefix_v)):
        if t.stride(-1) != 1 or t.stride() != prefix_k.stride():
            raise ValueError(f"{name} must be row-contiguous and laid out as prefix_k")
    for name, t in (("q", q), ("own_k", own_k), ("own_v", own_v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s head dimension must be contiguous")
    if own_v.stride() != own_k.stride():
        raise ValueError("own_v must be laid out as own_k")
    new_k, new_v = new_kv if new_kv is not None else (own_k, own_v)  # unread without WRITE
    if new_kv is not None and any(
        t.shape != (b, kv_heads, g, d) or t.stride(-1) != 1 for t in new_kv
    ):
        raise ValueError(
            f"new_kv must be two [B, Hkv, G, D] tensors with a contiguous head dimension, "
            f"got {[tuple(t.shape) for t in new_kv]}"
        )
    if programs is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 8
        programs = 2 * sms
    pairs = b * kv_heads
    # the folded queries in tiles of at most MAX_QUERY_BLOCK rows: larger G x heads per K/V
    # head would spill the accumulator out of registers
    block_d, block_q = _pow2(d), min(_pow2(rep * g), MAX_QUERY_BLOCK)
    tiles = -(-rep * g // block_q)
    chunks, chunk_keys = prefix_chunks(pairs * tiles, cap, programs)
    f32 = dict(dtype=torch.float32, device=q.device)
    pm = torch.empty(pairs * chunks * rep * g, **f32)
    pl, po = torch.empty_like(pm), torch.empty(pairs * chunks * rep * g * d, **f32)
    om = torch.empty(pairs * g * rep, **f32)
    ol, oo = torch.empty_like(om), torch.empty(pairs * g * rep * d, **f32)
    out = q.new_empty(b, g, heads * d)
    _partials[(pairs, chunks * tiles + g)](
        q, prefix_k, prefix_v, prefix_lengths, own_k, own_v, step,
        pm, pl, po, om, ol, oo, new_k, new_v,
        scale, kv_heads, g, rep, chunks, chunk_keys, tiles, n,
        q.stride(0), q.stride(1), q.stride(2),
        prefix_k.stride(0), prefix_k.stride(1), prefix_k.stride(2),
        own_k.stride(0), own_k.stride(1), own_k.stride(2), own_k.stride(3),
        new_k.stride(0), new_k.stride(1), new_k.stride(2),
        new_v.stride(0), new_v.stride(1), new_v.stride(2),
        D=d, BLOCK_D=block_d, BLOCK_Q=block_q, BLOCK_R=_pow2(rep), BLOCK_N=BLOCK_KEYS,
        WRITE=new_kv is not None,
        num_warps=4 if block_q * block_d <= 64 * 128 else 8,
    )  # fmt: skip
    _merge[(pairs, g)](
        pm, pl, po, om, ol, oo, out, kv_heads, g, rep, chunks, out.stride(0), out.stride(1),
        D=d, BLOCK_D=block_d, BLOCK_R=_pow2(rep, 1),
    )  # fmt: skip
    return out
