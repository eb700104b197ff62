"""Block-sparse tiled attention: FLOPs and HBM bytes at block density ``s``.

A block layout (``tileattn.block_mask``) switches off whole BLOCK_Q x BLOCK_K
blocks of the score matrix; the kernels never load or compute their tiles.
Only the streamed operands scale with the layout: the forward (and dQ)
programs stream K and V once per *visible* key block, the dK/dV programs
stream Q, dO, lse and delta once per visible query block.  The per-row
terms (reading Q, writing O and lse, the backward preprocess, K and V read
once by their dK/dV program) do not depend on ``s``.  So the textbook count
becomes

    bytes(s) = Theta(N d + s * N^2 d^2 / M)

the FlashAttention paper's Proposition 4 (block-sparse FlashAttention, HBM
accesses for a block mask with a fraction ``s`` of nonzero blocks), and the
matmul FLOPs are ``s`` times the dense ones.  ``s`` counts blocks of the
layout that are on; with ``causal`` it multiplies the causal counts, i.e. the
model assumes the blocks that are on are spread evenly over the visible
ones (a layout concentrated on the diagonal does less causal-masked work).
"""
from __future__ import annotations

import dataclasses

from .io import (LSE_BYTES, AttentionShape, CacheModel, TrafficEstimate, attention_flops, parse_config_name,
                 tiled_traffic)

__all__ = ["check_density", "block_sparse_flops", "block_sparse_traffic", "sparse_io_bound", "sparse_summary",
           "window_pairs", "varlen_flops"]


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


def window_pairs(seqlen_q: int, seqlen_k: int, causal: bool = False, window=None) -> int:
    """(query, key) pairs visible under causal and a sliding window ``(left,
    right)`` (-1 = unbounded; bottom-right aligned, as the kernels): row i sees
    keys max(0, i + Nk - Nq - left) .. min(Nk - 1, i + Nk - Nq + right)."""
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    if causal:
        right = 0 if right < 0 else min(right, 0)
    diag = seqlen_k - seqlen_q
    total = 0
    for i in range(seqlen_q):
        lo = 0 if left < 0 else max(0, i + diag - left)
        hi = seqlen_k - 1 if right < 0 else min(seqlen_k - 1, i + diag + right)
        total += max(0, hi - lo + 1)
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


def block_sparse_traffic(shape: AttentionShape, density: float, **tiled_kwargs) -> TrafficEstimate:
    """:func:`~tileattn.cost.io.tiled_traffic` with the streamed reads and the
    FLOPs of the forward, dK/dV and dQ kernels scaled by the density ``s``
    (keyword arguments go to ``tiled_traffic``: configs, cache model, ...)."""
    s = check_density(density)
    dense = tiled_traffic(shape, **tiled_kwargs)
    passes = []
    for p in dense.passes:
        if p.kernel in ("fwd", "dkdv", "dq"):
            own = _own_read_bytes(shape, p.kernel)
            streamed = max(p.read_bytes - own, 0.0)
            tile_streamed = max(p.tile_reads - own, 0.0)
            p = dataclasses.replace(p, read_bytes=own + s * streamed, tile_read_bytes=own + s * tile_streamed,
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
    print(f"block-sparse tiled kernels, density s = {d['density']:.3g} (bytes Theta(N d + s N^2 d^2 / M), "
          f"FLOPs x s)")
    print(f"{'phase':8} {'FLOPs dense':>12} {'FLOPs sparse':>13} {'bytes dense':>12} {'bytes sparse':>13} "
          f"{'time dense':>11} {'time sparse':>12}")
    for r in d["phases"]:
        print(f"{r['phase']:8} {r['dense_flops']:12.4g} {r['sparse_flops']:13.4g} {r['dense_bytes']:12.4g} "
              f"{r['sparse_bytes']:13.4g} {r['dense_time_s'] * 1e3:9.3f}ms {r['sparse_time_s'] * 1e3:10.3f}ms")
