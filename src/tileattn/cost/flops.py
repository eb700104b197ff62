"""FLOPs of standard and tiled attention: the score pairs a mask leaves
visible, the pairs the kernels' tiles execute, and the matmul work per
kernel (conventions in ``cost/io.py``)."""
from __future__ import annotations

import dataclasses

from ..configs import KernelConfig
from .shape import FLOP_MODES, AttentionShape, _check_bool, _check_head_dim, _check_int, _resolve_configs


# ---------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------
def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """Number of (query, key) pairs that take part in attention for one head.

    Causal: row ``i`` sees ``clamp(i + Nk - Nq + 1, 0, Nk)`` keys; the sum is
    done in closed form (a triangle plus, for Nk > Nq, a full rectangle).
    Lengths may be 0 (no pairs)."""
    nq, nk = _check_int("seqlen_q", seqlen_q, 0), _check_int("seqlen_k", seqlen_k, 0)
    causal = _check_bool("causal", causal)
    if not causal:
        return nq * nk
    c = nk - nq + 1  # keys seen by row 0 (may be <= 0)
    # rows with 0 < i + c < nk see i + c keys; rows with i + c >= nk see nk
    first = max(0, 1 - c)                # first row that sees >= 1 key
    full_from = max(0, nk - c)           # first row that sees all nk keys
    last_partial = min(nq, full_from)    # rows [first, last_partial) are partial
    total = 0
    if last_partial > first:
        a, b = first + c, last_partial - 1 + c
        total += (a + b) * (last_partial - first) // 2
    if nq > full_from:
        total += (nq - max(full_from, 0)) * nk
    return total


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a*i + b) / m) for i in range(n))`` for integers, ``m >= 1``,
    in O(log) steps (the Euclid-like reduction of the floor sum)."""
    if n <= 0:
        return 0
    qa, a = divmod(a, m)          # a, b brought into [0, m); their quotients summed directly
    qb, b = divmod(b, m)
    total = qa * (n * (n - 1) // 2) + qb * n
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b = divmod(y_max, m)
        m, a = a, m


def _fwd_key_rows(nq: int, nk: int, block_m: int, block_n: int, causal: bool, padded: bool = False) -> int:
    """Key rows the forward (and dQ) programs of one head load, summed over
    the query blocks; ``padded`` rounds each program's count up to whole
    BLOCK_N tiles (the executed keys).  The program of query block i loads
    all Nk keys, or, causal (the kernels' causal_key_bounds), the key tiles
    below ``hi = clamp((i + 1) BLOCK_M + Nk - Nq, 0, Nk)``: ``min(Nk, BLOCK_N
    ceil(hi / BLOCK_N))`` rows.

    In closed form, with ``x_i = (i + 1) BLOCK_M + Nk - Nq`` and ``K0`` the
    multiple of BLOCK_N at or below Nk: program i loads 0 keys for
    ``x_i <= 0``, ``BLOCK_N ceil(x_i / BLOCK_N)`` for ``0 < x_i <= K0`` (a
    floor sum) and all Nk for ``x_i > K0``: O(log N) whatever the length."""
    n_qb = _cdiv(nq, block_m)
    full = _cdiv(nk, block_n) * block_n if padded else nk
    if not causal:
        return n_qb * full
    off = nk - nq
    k0 = block_n * (nk // block_n)
    first = min(n_qb, max(0, (-off) // block_m))             # first block with x_i > 0
    last = min(n_qb, max(first, (k0 - off) // block_m))       # first block with x_i > K0
    ramp = block_n * _floor_sum(last - first, block_n, block_m, block_m * (first + 1) + off + block_n - 1)
    return ramp + (n_qb - last) * full


def _dkdv_query_rows(nq: int, nk: int, block_m: int, block_n: int, causal: bool, padded: bool = False) -> int:
    """Query rows the dK/dV programs of one head load, summed over the key
    blocks; ``padded`` rounds each program's count up to whole BLOCK_M tiles
    (the executed queries).  The program of key block j loads the queries
    from its start to Nq: 0, or, causal (the kernels' causal_query_bounds),
    ``min(Nq, BLOCK_M floor(max(j BLOCK_N - (Nk - Nq), 0) / BLOCK_M))``.

    In closed form, with ``y_j = j BLOCK_N - (Nk - Nq)``: program j starts at
    query 0 for ``y_j <= 0``, at ``BLOCK_M floor(y_j / BLOCK_M)`` (a floor
    sum) while that is below Nq, and loads nothing once
    ``y_j >= BLOCK_M ceil(Nq / BLOCK_M)``."""
    n_kb = _cdiv(nk, block_n)
    rows = _cdiv(nq, block_m) * block_m if padded else nq
    if not causal:
        return n_kb * rows
    off = nk - nq
    q1 = block_m * _cdiv(nq, block_m)
    first = max(0, min(n_kb, off // block_n + 1))           # first block with y_j > 0
    last = max(first, min(n_kb, _cdiv(q1 + off, block_n)))   # first block with y_j >= q1 (loads nothing)
    starts = block_m * _floor_sum(last - first, block_m, block_n, first * block_n - off)
    return last * rows - starts


def executed_pairs(seqlen_q: int, seqlen_k: int, causal: bool, block_m: int, block_n: int,
                   kernel: str = "fwd") -> int:
    """(query, key) pairs a tiled kernel computes for one head: whole
    BLOCK_M x BLOCK_N tiles, including the masked part of diagonal tiles and
    the padding of edge tiles; tiles hidden from every row are skipped.

    ``kernel="fwd"`` (also the dQ kernel) walks key tiles per query block;
    ``kernel="dkdv"`` walks query tiles per key block, from the first query
    tile that sees the key block (the two orders skip slightly different
    tiles on the diagonal when BLOCK_M != BLOCK_N).  Closed form (O(log N)),
    equal to walking the blocks."""
    if kernel not in ("fwd", "dq", "dkdv"):
        raise ValueError(f"kernel={kernel!r} must be 'fwd', 'dq' or 'dkdv'")
    nq, nk = _check_int("seqlen_q", seqlen_q, 0), _check_int("seqlen_k", seqlen_k, 0)
    causal = _check_bool("causal", causal)
    bm, bn = _check_int("block_m", block_m), _check_int("block_n", block_n)
    if kernel == "dkdv":
        return block_n * _dkdv_query_rows(nq, nk, bm, bn, causal, padded=True)
    return block_m * _fwd_key_rows(nq, nk, bm, bn, causal, padded=True)


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int | None = None, head_dim: int = 64, *,
                    causal: bool = False, mode: str = "fwd",
                    block_m: int | None = None, block_n: int | None = None,
                    head_dim_v: int | None = None) -> float:
    """Matmul FLOPs of attention -- the one place the formula lives.

    Forward: two matmuls (S = Q K^T and O = P V), each ``2 * D`` FLOPs per
    (query, key) pair, so ``4 * B * H * pairs * D``; ``pairs = Nq * Nk``, or the
    visible part when causal.  Backward: the conventional ``2.5 x`` forward --
    four gradient matmuls (dV, dP, dQ, dK = 2x) plus recomputing S (0.5x).
    ``mode`` is ``"fwd"``, ``"bwd"`` or ``"fwd_bwd"`` (3.5x).

    ``head_dim_v``: V's head dim Dv where it differs from D (default D).
    The matmuls over D are S, dQ, dK (and S again in the backward), those
    over Dv are O = P V, dP, dV: forward ``2 * B * H * pairs * (D + Dv)``,
    backward ``2 * B * H * pairs * (3 D + 2 Dv)`` (2.5x the forward when
    Dv = D).

    With ``block_m``/``block_n`` the pairs are those the tiled kernel
    *executes* (:func:`executed_pairs`) rather than the useful ones.
    Softmax exponentials and other elementwise work are not counted (they
    do not run on the tensor cores and are small next to ``D`` FLOPs/pair).

    Arguments are checked as :class:`AttentionShape` checks them (head dims
    up to the kernels' 512; TypeError for a non-integer type or a causal
    that is not a bool, ValueError for a bad value).
    """
    b = _check_int("batch", batch)
    h = _check_int("heads", heads)
    nq = _check_int("seqlen_q", seqlen_q)
    nk = nq if seqlen_k is None else _check_int("seqlen_k", seqlen_k)
    d = _check_head_dim("head_dim", head_dim)
    dv = d if head_dim_v is None else _check_head_dim("head_dim_v", head_dim_v)
    causal = _check_bool("causal", causal)
    if mode not in FLOP_MODES:
        raise ValueError(f"mode={mode!r} is not one of {', '.join(FLOP_MODES)}")
    if (block_m is None) != (block_n is None):
        raise ValueError("block_m and block_n must be given together")
    if block_m is None:
        pairs = visible_pairs(nq, nk, causal)
    else:
        pairs = executed_pairs(nq, nk, causal, _check_int("block_m", block_m), _check_int("block_n", block_n))
    fwd = 2.0 * b * h * pairs * (d + dv)
    bwd = 2.0 * b * h * pairs * (3 * d + 2 * dv)
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[mode]


@dataclasses.dataclass(frozen=True)
class FlopBreakdown:
    """FLOPs by term.  ``useful_*`` count visible pairs only; ``*_executed``
    is what each implementation actually runs."""

    useful_fwd: float
    useful_bwd: float                 # conventional 2.5x forward, recompute included
    standard_fwd_executed: float      # cuBLAS computes the full Nq x Nk product even when causal
    standard_bwd_executed: float      # 4 matmuls on the stored P: 2x its forward
    tiled_fwd_executed: float
    tiled_bwd_gradients: float        # dV, dP, dK (dK/dV kernel) + dQ (dQ kernel): 4 matmuls
    tiled_bwd_recompute: float        # S = Q K^T rebuilt from lse in the dK/dV kernel
    tiled_bwd_split_recompute: float  # S and dP rebuilt again in the separate dQ kernel

    @property
    def tiled_bwd_executed(self) -> float:
        return self.tiled_bwd_gradients + self.tiled_bwd_recompute + self.tiled_bwd_split_recompute

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["tiled_bwd_executed"] = self.tiled_bwd_executed
        return d


def _tile_matmul_flops(shape: AttentionShape, config: KernelConfig, kernel: str, over_v: bool = False) -> float:
    """FLOPs of one ``BM x BN x D`` matmul (``BM x BN x Dv`` with ``over_v``) per executed tile of
    ``kernel``, over all batches and heads."""
    s = shape
    pairs = executed_pairs(s.seqlen_q, s.seqlen_k, s.causal, config.block_m, config.block_n, kernel)
    return 2.0 * s.batch * s.heads * pairs * (s.head_dim_v if over_v else s.head_dim)


def flop_breakdown(shape: AttentionShape, fwd_config: KernelConfig | None = None,
                   bwd_config: KernelConfig | None = None,
                   dq_config: KernelConfig | None = None) -> FlopBreakdown:
    """FLOPs of both implementations, term by term (see :class:`FlopBreakdown`).

    Per executed tile of ``BM x BN`` pairs one matmul costs ``2*BM*BN*D``.
    The dK/dV program (tiles of ``bwd_config``) runs 4 of them (S, dP, dV,
    dK), the dQ program (tiles of ``dq_config``) 3 (S, dP, dQ): 7 per tile,
    against the 5 (2.5x forward) of the usual count.  Configs default to
    :func:`default_configs`.
    """
    fwd_config, bwd_config, dq_config = _resolve_configs(shape, fwd_config, bwd_config, dq_config=dq_config)
    s = shape
    args = (s.batch, s.heads, s.seqlen_q, s.seqlen_k, s.head_dim)
    dv = dict(head_dim_v=s.head_dim_v)
    useful_fwd = attention_flops(*args, causal=s.causal, mode="fwd", **dv)
    full_fwd = attention_flops(*args, causal=False, mode="fwd", **dv)
    tiled_fwd = attention_flops(*args, causal=s.causal, mode="fwd",
                                block_m=fwd_config.block_m, block_n=fwd_config.block_n, **dv)
    # one matmul over the dK/dV kernel's tiles / the dQ kernel's, over D and over Dv
    mm_dkdv, mm_dkdv_v = (_tile_matmul_flops(s, bwd_config, "dkdv", v) for v in (False, True))
    mm_dq, mm_dq_v = (_tile_matmul_flops(s, dq_config, "dq", v) for v in (False, True))
    return FlopBreakdown(
        useful_fwd=useful_fwd,
        useful_bwd=attention_flops(*args, causal=s.causal, mode="bwd", **dv),
        standard_fwd_executed=full_fwd,
        # dP, dV (over Dv), dQ, dK (over D) on the full product: 2x its forward
        standard_bwd_executed=2.0 * full_fwd,
        tiled_fwd_executed=tiled_fwd,
        tiled_bwd_gradients=2 * mm_dkdv_v + mm_dkdv + mm_dq,   # dP, dV, dK | dQ
        tiled_bwd_recompute=mm_dkdv,                           # S in the dK/dV kernel
        tiled_bwd_split_recompute=mm_dq + mm_dq_v,             # S and dP again in the dQ kernel
    )
