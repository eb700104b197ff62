"""The stream-K tail of the persistent Hopper forward (``HopperFwdConfig.stream_k``).

Why: a non-causal persistent forward walks U units (a query tile of 128
rows each, every unit T key tiles) over P programs, one an SM.  When U is
not a multiple of P the last wave is partial: at the FA2 protocol's shapes
U = 2,048 (d = 128) or 4,096 (d = 64) on 132 SMs, so 68 or 4 units run
while the other SMs idle, and the call takes 16 (32) units' time for 15.5
(31.03) units of work: 3 % of every non-causal call.  Stream-K cuts the
tail's key tiles instead: each program first runs U // P whole units, then
an even share of the last U mod P units' key tiles, one contiguous range
(at most T tiles, so it meets at most two units).  A piece short of its unit
leaves the unnormalised accumulator and the rows' max and sum in a float32
workspace; after the kernel, ``kernels/stream_k.py`` merges each tail
unit's pieces into out and lse (with the sink and the remainder's code).

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
    (fewer units than programs) or units of one key tile."""
    if not (cfg.stream_k and cfg.persistent) or causal or key_tiles < 2:
        return None
    waves, rest = divmod(units, programs)
    if waves == 0 or rest == 0:
        return None
    return waves * programs, rest, rest * key_tiles


def pieces(programs: int, whole: int, sk_tiles: int, key_tiles: int) -> list[tuple[int, int, int, int, int, int]]:
    """The tail's pieces as the kernel walks them: (program, k, tail unit i,
    first key tile j0, tiles n, workspace slot or -1 for a piece that is its
    whole unit); program p's range of the ``sk_tiles`` tail tiles is
    [p S / P, (p + 1) S / P), its k-th piece (k = 0, 1) the part in one unit."""
    out = []
    for p in range(programs):
        lo, hi = p * sk_tiles // programs, (p + 1) * sk_tiles // programs
        end0 = min(hi, (lo // key_tiles + 1) * key_tiles)
        for k, (start, end) in enumerate(((lo, end0), (end0, hi))):
            if end > start:
                i = start // key_tiles
                n = end - start
                out.append((p, k, i, start - i * key_tiles, n, 2 * p + k if n < key_tiles else -1))
    return out


def workspace(programs: int, block_m: int, dv: int, device) -> dict:
    """The pieces' float32 workspace: two slots a program, each the two
    warpgroups' unnormalised accumulators (block_m x dv, ``WS_O``) and their
    rows' max and sum (``WS_ML``)."""
    return dict(WS_O=torch.empty(programs * 2 * 2 * block_m * dv, device=device, dtype=torch.float32),
                WS_ML=torch.empty(programs * 2 * 2 * 2 * block_m, device=device, dtype=torch.float32))


def combine(o, o_lo, lse, sinks, ws_o, ws_ml, n_m_tiles: int, heads: int, tail_: tuple[int, int, int],
            programs: int, key_tiles: int, block_m: int) -> None:
    """Merge the tail's pieces into ``o``, ``lse`` (and ``o_lo``, the
    remainder's code, where given): a program per (tail unit, warpgroup).
    The workspace is no tensor a launch plan names, so such calls make no
    plan (``runtime.end_record``)."""
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
