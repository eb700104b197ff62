"""The stream-K tail of the persistent Hopper forward (``HopperFwdConfig.stream_k``).

Why: a non-causal persistent forward walks U units (a query tile of 128
rows each, every unit T key tiles) over P programs, one an SM.  When U is
not a multiple of P the last wave is partial: at the FA2 protocol's shapes
U = 2,048 (d = 128) or 4,096 (d = 64) on 132 SMs, so 68 or 4 units run
while the other SMs idle, and the call takes 16 (32) units' time for 15.5
(31.03) units of work: 3 % of every non-causal call.  Stream-K cuts the
tail's key tiles instead.  The tail is the last partial wave and the whole
wave before it (U mod P + P units): each program first runs
U // P - 1 whole units, then one contiguous range of the tail's key tiles,
an even share of between T and 2 T tiles, so a range meets at most three
units and a unit at most two ranges (a tail of the partial wave alone gives
up to P / (U mod P) pieces a unit, 33 at d = 64, which made the combine
slow: perf-notes v46).  A piece short of its unit leaves the unnormalised
accumulator and the rows' max and sum in a float32 workspace; after the
kernel, ``kernels/stream_k.py`` merges each cut unit's pieces into out and
lse (with the sink and the remainder's code).

The walk lives in the kernels (``kernels/fwd_hopper_load._work``); this
module gives the launcher its numbers, the workspace, the combine's launch
and :func:`pieces`, the same walk in Python (tests build partials with it).
"""
from __future__ import annotations

import torch

from ..configs import HopperFwdConfig
from . import runtime


def tail(cfg: HopperFwdConfig, causal: bool, units: int, programs: int,
         key_tiles: int) -> tuple[int, int, int] | None:
    """(whole units, tail units, tail key tiles) where ``cfg.stream_k``
    (persistent, non-causal) has a partial last wave to cut; None where the
    walk has none (the units a multiple of the programs), no whole wave
    (fewer units than programs) or units of one key tile.  The tail is the
    partial wave and the whole wave before it."""
    if not (cfg.stream_k and cfg.persistent) or causal or key_tiles < 2:
        return None
    waves, rest = divmod(units, programs)
    if waves == 0 or rest == 0:
        return None
    return (waves - 1) * programs, rest + programs, (rest + programs) * key_tiles


def pieces(programs: int, whole: int, sk_tiles: int, key_tiles: int) -> list[tuple[int, int, int, int, int, int]]:
    """The tail's pieces as the kernel walks them: (program, k, tail unit i,
    first key tile j0, tiles n, workspace slot or -1 for a piece that is its
    whole unit); program p's range of the ``sk_tiles`` tail tiles is
    [p S / P, (p + 1) S / P), its k-th piece (k = 0, 1, 2) the part in unit
    lo // T + k."""
    out = []
    for p in range(programs):
        lo, hi = p * sk_tiles // programs, (p + 1) * sk_tiles // programs
        for k in range(3):
            i = lo // key_tiles + k
            start, end = max(lo, i * key_tiles), min(hi, (i + 1) * key_tiles)
            if end > start:
                n = end - start
                out.append((p, k, i, start - i * key_tiles, n, 3 * p + k if n < key_tiles else -1))
    return out


def workspace(programs: int, block_m: int, dv: int, device) -> dict:
    """The pieces' float32 workspace: three slots a program, each the two
    warpgroups' unnormalised accumulators (block_m x dv, ``ws_o``) and their
    rows' max and sum (``ws_ml``), by the names a launch plan gives them."""
    return dict(ws_o=torch.empty(programs * 3 * 2 * block_m * dv, device=device, dtype=torch.float32),
                ws_ml=torch.empty(programs * 3 * 2 * 2 * block_m, device=device, dtype=torch.float32))


def combine(o, o_lo, lse, sinks, ws_o, ws_ml, n_m_tiles: int, heads: int, tail_: tuple[int, int, int],
            programs: int, key_tiles: int, block_m: int) -> None:
    """Merge the tail's pieces into ``o``, ``lse`` (and ``o_lo``, the
    remainder's code, where given): a program per (tail unit, warpgroup)."""
    from ..kernels.stream_k import _stream_k_combine_kernel
    whole, n_tail, sk_tiles = tail_
    runtime.run(_stream_k_combine_kernel, (n_tail, 2), dict(num_warps=4), dict(
        WS_O=ws_o, WS_ML=ws_ml, O=o, O_LO=o if o_lo is None else o_lo, LSE=lse,
        SINKS=lse if sinks is None else sinks.float().contiguous(),
        stride_ob=o.stride(0), stride_oh=o.stride(1), stride_om=o.stride(2),
        stride_lb=lse.stride(0), stride_lh=lse.stride(1),
        N_Q=o.shape[2], N_HEADS=heads, N_M_TILES=n_m_tiles, TOTAL=whole, SK_TILES=sk_tiles, T=key_tiles,
        P=programs, BLOCK_M=block_m, HEAD_DIM_V=o.shape[3], HAS_SINKS=sinks is not None,
        WRITE_REMAINDER=o_lo is not None))
