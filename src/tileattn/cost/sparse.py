"""Block-sparse tiled attention: FLOPs and HBM bytes at block density ``s``.

A block layout (``tileattn.block_mask``) switches off whole BLOCK_Q x BLOCK_K
blocks of the score matrix; the kernels never load or compute their tiles.
Only the streamed operands depend on the layout: the forward (and dQ)
programs load K and V once per *visible* key block, the dK/dV programs load
Q, dO, lse and delta once per visible query block, so the *tile loads* are
``s`` times the dense ones.  The per-row terms (reading Q, writing O and
lse, the backward preprocess, K and V read once by their dK/dV program) do
not depend on ``s``.  The textbook count (no L2 reuse, ``--no-l2``) is then

    bytes(s) = Theta(N d + s * N^2 d^2 / M)

the FlashAttention paper's Proposition 4 (block-sparse FlashAttention, HBM
accesses for a block mask with a fraction ``s`` of nonzero blocks), and the
matmul FLOPs are ``s`` times the dense ones.  ``s`` counts blocks of the
layout that are on; with ``causal`` it multiplies the causal counts, i.e. the
model assumes the blocks that are on are spread evenly over the visible
ones (a layout concentrated on the diagonal does less causal-masked work).

With L2 reuse (the default of ``tileattn io``) the dense model reads each
streamed tile from DRAM once per head (per wave) and serves the other loads
from L2: that once-per-head term is Theta(N d), and a sparse layout does not
scale it by ``s``.  A tile is read from DRAM if *any* program sharing that
read needs it, see :func:`block_sparse_traffic`.
"""
from __future__ import annotations

import dataclasses

from .io import (LSE_BYTES, AttentionShape, CacheModel, TrafficEstimate, attention_flops, parse_config_name,
                 tiled_traffic)
from .shape import _check_bool, _check_int

__all__ = ["check_density", "block_sparse_flops", "block_sparse_traffic", "needed_fraction", "sparse_io_bound",
           "sparse_summary", "window_pairs", "varlen_flops"]


def check_density(density) -> float:
    if isinstance(density, bool):
        raise ValueError(f"density={density!r} must be a number in (0, 1]")
    try:
        s = float(density)
    except (TypeError, ValueError):
        raise ValueError(f"density={density!r} must be a number in (0, 1]") from None
    if not 0.0 < s <= 1.0:
        raise ValueError(f"density={density!r} must be in (0, 1]")
    return s


def density_arg(text: str) -> float:
    """argparse type for ``--density``."""
    import argparse
    try:
        return check_density(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def sparse_io_bound(seqlen: int, head_dim: int, sram_elements: float, density: float) -> float:
    """Proposition 4's count for one head, in elements: ``N d + N^2 d^2 s / M``
    (the constant factors of the Theta left out; ``M`` the on-chip memory in
    elements).  ``density = 1`` is the dense FlashAttention bound (Theorem 2)."""
    s = check_density(density)
    n, d = float(seqlen), float(head_dim)
    return n * d + n * n * d * d * s / float(sram_elements)


def _positive_sum(c: int, slope: int, i0: int, i1: int) -> int:
    """``sum(max(0, c + slope * i) for i in range(i0, i1))`` for ``slope`` in {-1, 0, 1}."""
    if i1 <= i0:
        return 0
    if slope == 0:
        return (i1 - i0) * max(0, c)
    if slope > 0:                     # positive from i = 1 - c on
        a = max(i0, 1 - c)
        return (i1 - a) * c + (a + i1 - 1) * (i1 - a) // 2 if i1 > a else 0
    b = min(i1, c)                    # c - i positive below i = c
    return (b - i0) * c - (i0 + b - 1) * (b - i0) // 2 if b > i0 else 0


def window_pairs(seqlen_q: int, seqlen_k: int, causal: bool = False, window=None) -> int:
    """(query, key) pairs visible under causal and a sliding window ``(left,
    right)`` (-1 = unbounded; bottom-right aligned, as the kernels): row i sees
    keys max(0, i + Nk - Nq - left) .. min(Nk - 1, i + Nk - Nq + right).

    Closed form: the count ``hi_i - lo_i + 1`` is linear in i between the row
    where ``hi_i`` reaches Nk - 1 and the row where ``lo_i`` leaves 0, so the
    sum of its positive part is taken over at most three linear pieces."""
    nq, nk = _check_int("seqlen_q", seqlen_q, 0), _check_int("seqlen_k", seqlen_k, 0)
    causal = _check_bool("causal", causal)
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    if causal:
        right = 0 if right < 0 else min(right, 0)
    diag = nk - nq
    top = nk - 1
    p = nk if right < 0 else diag + right             # hi_i = min(top, i + p)
    q = -(nq + nk + 1) if left < 0 else diag - left   # lo_i = max(0, i + q)
    cuts = sorted({0, nq, min(max(top - p, 0), nq), min(max(-q, 0), nq)})
    total = 0
    for i0, i1 in zip(cuts, cuts[1:]):
        hi_c, hi_s = (p, 1) if i0 < top - p else (top, 0)     # hi_i = hi_c + hi_s * i on [i0, i1)
        lo_c, lo_s = (0, 0) if i0 < -q else (q, 1)
        total += _positive_sum(hi_c - lo_c + 1, hi_s - lo_s, i0, i1)
    return total


def varlen_flops(lens_q, lens_k, heads: int, head_dim: int, *, causal: bool = False, window=None,
                 mode: str = "fwd") -> float:
    """Useful matmul FLOPs of packed sequences: the sum over sequences of
    ``4 * heads * pairs * head_dim`` (x 2.5 backward, x 3.5 both, as
    :func:`~tileattn.cost.io.attention_flops`)."""
    factor = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode]
    pairs = sum(window_pairs(nq, nk, causal, window) for nq, nk in zip(lens_q, lens_k))
    return factor * 4.0 * heads * pairs * head_dim


def block_sparse_flops(shape: AttentionShape, density: float, mode: str = "fwd") -> float:
    """Useful matmul FLOPs of the block-sparse call: ``s`` times
    :func:`~tileattn.cost.io.attention_flops` of the shape."""
    s = check_density(density)
    return s * attention_flops(shape.batch, shape.heads, shape.seqlen_q, shape.seqlen_k, shape.head_dim,
                               causal=shape.causal, mode=mode, head_dim_v=shape.head_dim_v)


def _own_read_bytes(shape: AttentionShape, kernel: str) -> float:
    """DRAM reads of a tiled kernel that do not repeat per visible block."""
    s = shape
    row, row_v = s.head_dim * s.elem_bytes, s.head_dim_v * s.elem_bytes   # Q/K, V/dO
    rows_q = s.batch * s.heads * s.seqlen_q
    lse_bytes = float(rows_q * LSE_BYTES)
    if kernel == "fwd":
        return float(rows_q * row)                       # Q once
    if kernel == "dkdv":
        return float(s.batch * s.kv_heads * s.seqlen_k * (row + row_v))   # K, V once
    if kernel == "dq":
        return float(rows_q * (row + row_v)) + 2 * lse_bytes   # Q, dO, lse2, delta once
    return float("nan")


# Rows and keys per block-layout entry: tileattn.block_mask.BLOCK_Q / BLOCK_K
# (not imported: that module needs torch, the cost model does not).
LAYOUT_BLOCK = 128


def needed_fraction(density: float, trials: float) -> float:
    """Expected fraction of tiles needed by at least one of ``trials``
    independent programs that each need a tile with probability ``density``:
    ``1 - (1 - s)^trials`` (``trials`` may be fractional: an average)."""
    s = check_density(density)
    return 1.0 - (1.0 - s) ** max(float(trials), 1.0)


def _sparse_streamed_dram(dense_dram: float, dense_loads: float, s: float, tile_rows: int) -> float:
    """DRAM bytes of a streamed operand at density ``s``, from the dense model's
    DRAM bytes and tile loads of that operand.

    Without L2 reuse (DRAM = loads) every load is a DRAM read: ``s * loads``.
    With it, each DRAM read in the dense model serves ``r = loads / DRAM``
    tile loads of programs that run together; under the layout a tile is read
    once if at least one of them needs it.  The programs decide per layout
    entry, and ``LAYOUT_BLOCK / tile_rows`` programs of one head fall in the
    same entry, so there are ``r * tile_rows / LAYOUT_BLOCK`` independent
    trials.  For a layout whose blocks are on independently with probability
    ``s`` the expected DRAM bytes are ``DRAM * (1 - (1 - s)^trials)``: nearly
    the dense once-per-head figure for long sequences (with N = 4096 and 128-row
    blocks, 32 query blocks per key block, ``1 - 0.75^32 > 0.9998`` at s = 0.25),
    never more than ``s * loads`` (Bernoulli's inequality).  The expression is
    concave in the number of trials, so where that number varies (causal
    masks, edge blocks) the average used here gives an upper bound; a layout
    shared by all heads (a broadcast head dim) needs the same tiles in every
    head of a GQA group and is overestimated the same way."""
    if dense_dram <= 0.0 or dense_loads <= dense_dram:
        return s * dense_loads
    trials = dense_loads / dense_dram * min(1.0, tile_rows / LAYOUT_BLOCK)
    return min(s * dense_loads, dense_dram * needed_fraction(s, trials))


def block_sparse_traffic(shape: AttentionShape, density: float, **tiled_kwargs) -> TrafficEstimate:
    """:func:`~tileattn.cost.io.tiled_traffic` at block density ``s``: the
    FLOPs of the forward, dK/dV and dQ kernels and their streamed tile loads
    scaled by ``s``; their streamed DRAM reads as
    :func:`_sparse_streamed_dram` has them (``s`` times the loads without L2
    reuse; with it, the once-per-head reads of tiles that some program still
    needs).  Keyword arguments go to ``tiled_traffic`` (configs, cache model, ...)."""
    s = check_density(density)
    dense = tiled_traffic(shape, **tiled_kwargs)
    tiles = {"fwd": parse_config_name(dense.params["fwd_config"]).block_m,
             "dkdv": parse_config_name(dense.params["dkdv_config"]).block_n,
             "dq": parse_config_name(dense.params["dq_config"]).block_m}
    passes = []
    for p in dense.passes:
        if p.kernel in tiles:
            own = _own_read_bytes(shape, p.kernel)
            streamed = max(p.read_bytes - own, 0.0)
            tile_streamed = max(p.tile_reads - own, 0.0)
            dram = _sparse_streamed_dram(streamed, tile_streamed, s, tiles[p.kernel])
            p = dataclasses.replace(p, read_bytes=own + dram, tile_read_bytes=own + s * tile_streamed,
                                    flops=s * p.flops, note=f"{p.note}; block density {s:.3g}")
        passes.append(p)
    params = dict(dense.params, density=s)
    return TrafficEstimate("tiled-block-sparse", shape, tuple(passes), params)


def sparse_summary(comp, density: float) -> dict:
    """Dense against block-sparse tiled kernels for a
    :class:`~tileattn.cost.roofline.Comparison` (same configs, cache model and
    hardware): FLOPs, DRAM bytes and roofline time per phase.  Used by
    ``tileattn io --density``."""
    from .roofline import predict
    s = check_density(density)
    params = comp.tiled.params
    kw = {"fwd_config": parse_config_name(params["fwd_config"]), "bwd_config": parse_config_name(params["dkdv_config"]),
          "dq_config": parse_config_name(params["dq_config"]),
          "cache": CacheModel(**params["cache"]) if params.get("cache") else None}
    sparse = block_sparse_traffic(comp.shape, s, **kw)
    pred = predict(sparse, comp.hardware, basis=comp.basis)
    rows = []
    for ph in ("fwd", "bwd", "fwd_bwd"):
        sel = None if ph == "fwd_bwd" else ph
        rows.append({"phase": ph, "dense_flops": comp.tiled.flops(sel), "sparse_flops": sparse.flops(sel),
                     "dense_bytes": comp.tiled.bytes(sel), "sparse_bytes": sparse.bytes(sel),
                     "dense_time_s": comp.tiled_pred[ph].time_s, "sparse_time_s": pred[ph].time_s})
    return {"density": s, "phases": rows}


def print_sparse_summary(comp, density: float) -> None:
    """Plain-text table of :func:`sparse_summary`."""
    d = sparse_summary(comp, density)
    l2 = "" if comp.tiled.params.get("cache") is None else (
        "; with L2 reuse a K/V (Q/dO) tile is still read once per head if any program needs it")
    print(f"block-sparse tiled kernels, density s = {d['density']:.3g} (tile loads Theta(N d + s N^2 d^2 / M), "
          f"FLOPs x s{l2})")
    print(f"{'phase':8} {'FLOPs dense':>12} {'FLOPs sparse':>13} {'bytes dense':>12} {'bytes sparse':>13} "
          f"{'time dense':>11} {'time sparse':>12}")
    for r in d["phases"]:
        print(f"{r['phase']:8} {r['dense_flops']:12.4g} {r['sparse_flops']:13.4g} {r['dense_bytes']:12.4g} "
              f"{r['sparse_bytes']:13.4g} {r['dense_time_s'] * 1e3:9.3f}ms {r['sparse_time_s'] * 1e3:10.3f}ms")
