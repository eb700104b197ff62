"""Launchers of the Hopper kernels (Gluon): the forward (``kernels/fwd_hopper.py``)
and the backward's dK/dV kernels with the float32 dQ sum (``kernels/bwd_hopper.py``;
``bwd_hopper_wide.py`` for V narrower than QK, ``bwd_hopper_split.py`` for d = 256;
the persistent d = 64 walk's launcher is ``hopper_persistent.py``)
(their sm_90a compiles without a GPU: ``hopper_compile.py``).

Which calls run them is ``dispatch.hopper_fwd_eligible`` /
``hopper_bwd_eligible``'s decision (a CUDA device of compute capability 9.0,
fp16 or bf16, a head dim the kernel is built for, no variant, tensors the
copy engine can address; the backward only for ``deterministic=False``);
everything else runs the portable Triton kernels.  Gluon is imported on
first use, so a CPU install never imports it.  ``TILEATTN_HOPPER_FWD=0`` /
``TILEATTN_HOPPER_BWD=0`` (or ``dispatch.HOPPER_FWD`` / ``HOPPER_BWD = False``) turn the paths off.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import triton

from .. import configs
from .._env import env
from ..configs import HopperBwdConfig, HopperFwdConfig
from ..dispatch import tma_addressable
from ..sinks import remainder_like
from . import grid_order, runtime, stream_k
from .hopper_descriptors import _descriptor, _dq_descriptor, _row_descriptor, stats_rows  # noqa: F401
from .runtime import LOG2E, sm_count


def _qk_descriptors(q: torch.Tensor, k: torch.Tensor, dv: int, cfg: HopperFwdConfig) -> dict:
    """Q's and K's descriptors: whole rows where the head dim is V's, else
    the first ``dv`` columns and the rest as a tail (``TAIL_DIM``) through
    descriptors of their own (a copy box is a power of two wide: QK 192 with
    V 128 is 128 + 64)."""
    d = q.shape[-1]
    if d == dv:
        return dict(q_desc=_descriptor(q, cfg.block_m), k_desc=_descriptor(k, cfg.block_n))
    return dict(q_desc=_descriptor(q[..., :dv], cfg.block_m), k_desc=_descriptor(k[..., :dv], cfg.block_n),
                qt_desc=_descriptor(q[..., dv:], cfg.block_m), kt_desc=_descriptor(k[..., dv:], cfg.block_n),
                TAIL_DIM=d - dv)


def defers_o(cfg: HopperFwdConfig) -> bool:
    """Whether a persistent forward leaves O's (and the remainder's) copy to the next item (``cfg.defer_o``)."""
    return cfg.persistent and cfg.defer_o


def check_fwd_config(cfg: HopperFwdConfig, d: int, dv: int) -> None:
    """A config the forward kernel cannot run for QK / V head dims ``d`` /
    ``dv``: a ValueError naming it, before any launch."""
    if cfg.persistent and (d != dv or d > 128):
        raise ValueError(f"config: a persistent Hopper forward takes QK = V head dims up to 128, not {d}/{dv}")
    if cfg.warpgroups not in (2, 3):
        raise ValueError(f"config: warpgroups is 2 or 3 (softmax warpgroups), not {cfg.warpgroups!r}")
    if cfg.warpgroups == 3:
        if d != dv or d > 64:
            raise ValueError(f"config: three softmax warpgroups (160 registers a thread) take QK = V head dims up "
                             f"to 64, not {d}/{dv}")
        if cfg.maxnreg > 128 or cfg.stream_k:
            raise ValueError("config: three softmax warpgroups launch at maxnreg <= 128 (four warpgroups' "
                             f"registers), without the stream-K cut; got maxnreg={cfg.maxnreg}, "
                             f"stream_k={cfg.stream_k}")


def fwd_shape(cfg: HopperFwdConfig) -> dict:
    """The kernel's NUM_WG and EARLY_P of ``cfg``, left out at their defaults
    (2, False) so that the table's builds keep their signature."""
    shape = {}
    if cfg.warpgroups != 2:
        shape["NUM_WG"] = cfg.warpgroups
    if cfg.early_p:
        shape["EARLY_P"] = True
    return shape


def tile_rows(cfg: HopperFwdConfig) -> int:
    """Query rows a program's tile holds: ``block_m`` a softmax warpgroup."""
    return cfg.warpgroups * cfg.block_m


def config_for(head_dim: int, head_dim_v: int | None = None, causal: bool = False,
               n_k: int | None = None, window_span: int | None = None) -> HopperFwdConfig:
    """The table's config for Q/K head dim ``head_dim`` and V head dim
    ``head_dim_v`` (default: the same); persistent for calls of at most
    ``configs.HOPPER_FWD_PERSISTENT_MAX_KEYS`` keys (``n_k``) where the table
    has that bound (with sinks or without), and for sliding windows of at
    most ``configs.HOPPER_FWD_WINDOW_PERSISTENT_SPAN`` keys (``window_span``:
    left + right + 1 of the kernel's bounds; ``n_k`` then unused).  Non-causal
    calls without a window take ``configs.HOPPER_FWD_NONCAUSAL``'s config
    where it has one."""
    dv = head_dim if head_dim_v is None else head_dim_v
    cfg = configs.HOPPER_FWD[(head_dim, dv)]
    if not causal and window_span is None:
        cfg = configs.HOPPER_FWD_NONCAUSAL.get((head_dim, dv), cfg)
    if window_span is not None:
        widest = configs.HOPPER_FWD_WINDOW_PERSISTENT_SPAN.get(head_dim) if dv == head_dim else None
        return _persistent(cfg) if widest is not None and window_span <= widest else cfg
    most = None if dv != head_dim else configs.HOPPER_FWD_PERSISTENT_MAX_KEYS.get((head_dim, bool(causal)))
    if most is not None and n_k is not None and n_k <= most:
        return _persistent(cfg, (head_dim, bool(causal)) in configs.HOPPER_FWD_PERSISTENT_EARLY_P)
    return cfg


def call_config(head_dim: int, head_dim_v: int, n_k: int, causal: bool, window: tuple[int, int] | None = None,
                varlen: tuple | None = None) -> HopperFwdConfig:
    """:func:`config_for` of a call: by its keys, or by a sliding window's
    span (``window``: the kernel's bounds); packed sequences take the
    table's (two-warpgroup) config, one program a tile."""
    if varlen is not None:
        return configs.HOPPER_FWD[(head_dim, head_dim_v)]
    span = None if window is None else window[0] + window[1] + 1
    return config_for(head_dim, head_dim_v, causal, None if window is not None else n_k, span)


@functools.cache
def _persistent(cfg: HopperFwdConfig, early_p: bool = False) -> HopperFwdConfig:
    """``cfg`` run persistent, with ``early_p`` where asked (made once:
    config_for is on every call's path)."""
    return dataclasses.replace(cfg, persistent=True, early_p=cfg.early_p or early_p)


def _walk(q, k, causal: bool, cfg: HopperFwdConfig) -> tuple[int, int, tuple[int, int, int] | None]:
    """A persistent call's (units, programs, stream-K tail or None): one
    program an SM (or fewer) walks the units (causal: two query tiles each)."""
    b, hq, n_q, _ = q.shape
    n_m_tiles = triton.cdiv(n_q, tile_rows(cfg))
    total = (triton.cdiv(n_m_tiles, 2) if causal else n_m_tiles) * hq * b
    programs = max(1, min(total, sm_count(q.device)))   # an empty call: one program, no item
    return total, programs, stream_k.tail(cfg, causal, total, programs, triton.cdiv(k.shape[2], cfg.block_n))


def fwd_workspace(q, k, v, causal: bool, cfg: HopperFwdConfig) -> dict:
    """The stream-K workspace a call of ``cfg`` needs ({"ws_o", "ws_ml"}), or
    {} (a launch plan names these tensors: ``hopper_calls.fwd``)."""
    if not (cfg.persistent and cfg.stream_k):
        return {}
    _, programs, tail = _walk(q, k, causal, cfg)
    return {} if tail is None else stream_k.workspace(programs, cfg.block_m, v.shape[-1], q.device)


def attn_fwd(q, k, v, causal: bool, scale: float, config: HopperFwdConfig | None = None, poison: bool = False,
             sinks: torch.Tensor | None = None, remainder: bool = False, workspace: dict | None = None,
             trace: torch.Tensor | None = None, window: tuple[int, int] | None = None, varlen: tuple | None = None):
    """Forward on the Hopper kernel. Returns (out like q, as wide as v; lse
    float32 (B, Hq, Nq)); ``sinks`` (float32 (Hq,)) enter every row's
    denominator and the lse.  ``remainder``: (out, lse, out_lo) with out_lo
    the int8 code of O - out (the float32 result's rounding remainder, in
    out's layout; ``tileattn.sinks``).  ``workspace``: :func:`fwd_workspace`'s
    tensors for a stream-K cut (made here when not given).  ``trace``: clock
    reads of a persistent config (``kernels/fwd_hopper._mark``).  ``window``:
    a sliding window's (left, right) key bounds as ``launch.attention``
    gives the portable kernels (causal folded into right, unbounded sides
    past the keys; ``causal`` then False), no stream-K cut.  ``varlen``:
    packed sequences, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k) with q, k, v the (1, H, total, D) views (one program a
    query tile, QK = V head dim, no sinks or remainder: ``attention_varlen``
    applies sinks after the kernel)."""
    b, hq, n_q, d = q.shape
    hkv, n_k, dv = k.shape[1], k.shape[2], v.shape[-1]
    cfg = config or call_config(d, dv, n_k, causal, window, varlen)
    if window is not None and (cfg.stream_k or causal):
        raise ValueError("window: the Hopper forward runs a window without the stream-K cut, causal folded into it")
    if varlen is not None and (cfg.persistent or sinks is not None or remainder or d != dv or b != 1):
        raise ValueError("varlen: the Hopper forward runs packed (1, H, total, D) sequences one program a tile, "
                         "QK = V head dim, without sinks or the output remainder")
    check_fwd_config(cfg, d, dv)
    from ..kernels.fwd_hopper import TRACE_SLOTS, _attn_fwd_hopper_kernel
    if trace is not None and not (cfg.persistent and trace.dtype == torch.int64 and trace.is_contiguous()
                                  and trace.shape == (_walk(q, k, causal, cfg)[1], TRACE_SLOTS.value)):
        raise ValueError(f"trace: a persistent config's contiguous int64 (programs, {TRACE_SLOTS.value}) tensor")
    o, lse = fwd_outputs(q, v)
    o_lo = remainder_like(o) if remainder else None
    if poison:   # NaN, and a code the remainder takes rarely (bf16: ~0.4 % of values; fp16: never)
        for t in (o, lse) if o_lo is None else (o, lse, o_lo):
            t.fill_(-128 if t is o_lo else float("nan"))
    extra = {} if o_lo is None else dict(olo_desc=_descriptor(o_lo, cfg.block_m), WRITE_REMAINDER=True)
    if window is not None:
        extra.update(WIN_LEFT=int(window[0]), WIN_RIGHT=int(window[1]))
    if even_k(n_k, causal, window, varlen, cfg):
        extra.update(EVEN_K=True)
    n_m_tiles = triton.cdiv(n_q, tile_rows(cfg))
    tail = None
    if cfg.persistent:   # one program an SM (or fewer) walks the work units: causal, two tiles each
        total, programs, tail = _walk(q, k, causal, cfg)
        grid = (programs,)
        if tail is not None:   # the last wave's units as even ranges of key tiles; partials to a workspace
            total, n_tail, sk_tiles = tail
            ws = workspace or fwd_workspace(q, k, v, causal, cfg)
            extra.update(STREAM_K=True, SK_TILES=sk_tiles, WS_O=ws["ws_o"], WS_ML=ws["ws_ml"])
        extra.update(PERSISTENT=True, N_M_TILES=n_m_tiles, N_HEADS=hq, TOTAL=total,
                     DEFER_O=defers_o(cfg), **({} if trace is None else {"TRACE": trace}))
    elif varlen is not None:   # one program a query tile of the longest sequence, a grid row a sequence
        cu_q, cu_k, max_q, _ = varlen
        grid = (triton.cdiv(max_q, tile_rows(cfg)), hq, cu_q.numel() - 1)
        extra.update(IS_VARLEN=True, CU_SEQLENS_Q=cu_q, CU_SEQLENS_K=cu_k, O=o, stride_on=o.stride(2),
                     stride_oh=o.stride(1), V=v, stride_vh=v.stride(1), stride_vn=v.stride(2))
        runtime.scratch_allocator()   # the last value tile's descriptor is made on the device
    else:   # one program a query tile, heaviest first; causal: the tiles of G (head, batch) pairs at a time
        grid, grouped = grid_order.grid(n_m_tiles, hq, b, grid_order.group_rows(causal, n_m_tiles, hq * b, cfg,
                                                                                sm_count(q.device)))
        if grouped:
            extra.update(GROUPED=True, N_HEADS=hq)
    runtime.run(_attn_fwd_hopper_kernel, grid, dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg), dict(
        **_qk_descriptors(q, k, dv, cfg), v_desc=_descriptor(v, cfg.block_n), o_desc=_descriptor(o, cfg.block_m),
        LSE=lse, SINKS=lse if sinks is None else sinks.float().contiguous(),
        stride_lb=lse.stride(0), stride_lh=lse.stride(1),
        GROUP_SIZE=hq // hkv, N_Q=n_q, N_K=n_k, qk_scale=scale * LOG2E,
        HEAD_DIM=d, HEAD_DIM_V=dv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=bool(causal),
        NUM_STAGES=cfg.num_stages, OVERLAP=cfg.overlap, PINGPONG=cfg.pingpong, ROW_TREE=cfg.row_tree,
        HAS_SINKS=sinks is not None, **fwd_shape(cfg), **extra))
    if tail is not None:
        stream_k.combine(o, o_lo, lse, sinks, ws["ws_o"], ws["ws_ml"], n_m_tiles, hq, tail, grid[0],
                         triton.cdiv(n_k, cfg.block_n), cfg.block_m)
    return (o, lse) if o_lo is None else (o, lse, o_lo)


def even_k(n_k: int, causal: bool, window, varlen, cfg: HopperFwdConfig) -> bool:
    """Whether a forward call's build leaves out the mask step (``EVEN_K``):
    non-causal, no window or packing, keys a multiple of the key tile.  Off
    unless ``TILEATTN_HOPPER_EVEN_K=1``: the build has ~40 % fewer
    instructions and no spills on the CPU's sm_90a compile, and passes its
    GPU tests, but timed without a consistent gain (H100, perf-notes v58)."""
    return (env("TILEATTN_HOPPER_EVEN_K", "0") == "1" and not causal and window is None and varlen is None
            and n_k % cfg.block_n == 0)


def fwd_outputs(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's (out, lse), not poisoned: out like q where V's head dim
    is q's and the copy engine can address that layout, else dense."""
    b, hq, n_q, d = q.shape
    dv = v.shape[-1]
    o = torch.empty_like(q) if dv == d else None
    if o is None or not tma_addressable(o):   # a V width of its own, or an unaddressable layout: a dense one
        o = torch.empty((b, hq, n_q, dv), dtype=q.dtype, device=q.device)
    return o, torch.empty((b, hq, n_q), device=q.device, dtype=torch.float32)


# A program walks its group's query heads one after the other, and causal
# programs (of different lengths) drift apart in that walk: the Q and dO the
# running programs read span the whole group.  At GQA 8, 16k, d = 128 that is
# 64 MB beside a 50 MB L2, and the dK/dV kernel read 4.9-5.5 GB from DRAM
# where MHA read 0.4 GB (perf-notes v22, v23).  Head slices bound it: grid
# rows of SLICE_HEADS heads each, adding float32 dK/dV into sums.  On the
# H200 (v23, d = 128, causal) slices of 2 heads won 5-7 % at GQA 8 from 4k
# to 16k (4k: more, shorter programs balance better) and 2 % at GQA 4, 16k;
# at d = 64 they were -2..+3 %.  Without causal the programs walk in step.
# At 2k keys the sliced default read 0.72-0.77x cuDNN at d = 128 (GQA 4, 8)
# in one run; v24's same-run timings (one launch, 2k): GQA 8 1 slice 0.97x,
# 2 0.99x, 4 1.01x; GQA 4 1 slice 1.08x, 2 0.99x; at d = 64 1 slice best.
# A rule from the grid's simulated balance lost 34 % at 1k, d = 64 (v24).
SLICE_HEADS = 2   # the most query heads a slice of a causal group walks
SLICE_MIN_KEYS = 4096   # the fewest keys at which slices were timed and won


def check_slices(cfg: HopperBwdConfig, head_dim: int, head_dim_v: int) -> None:
    """A ValueError for a ``head_slices``, ``group_rows``, ``persistent`` or ``split_tail`` the launcher cannot run."""
    if cfg.split_tail and not cfg.persistent:
        raise ValueError("config: split_tail=True cuts the persistent walk's last round: it needs persistent=True")
    if cfg.persistent and (head_dim, head_dim_v) != (64, 64):
        raise ValueError(f"config: persistent=True runs the d = 64 backward (its K and V in two buffers), "
                         f"not head dims {head_dim} / {head_dim_v}")
    if cfg.group_rows is not None and (type(cfg.group_rows) is not int or cfg.group_rows < 1):
        raise ValueError(f"config: group_rows must be None or an int >= 1, got {cfg.group_rows!r}")
    if cfg.head_slices is not None and (type(cfg.head_slices) is not int or cfg.head_slices < 1
                                        or (transposed_dq(head_dim, head_dim_v) and cfg.head_slices > 1)):
        raise ValueError(f"config: head_slices must be None or an int >= 1 (1 when V's head dim differs from "
                         f"QK's or exceeds 128: those kernels walk whole groups), got {cfg.head_slices!r}")


def head_slices(q: torch.Tensor, k: torch.Tensor, causal: bool, cfg: HopperBwdConfig) -> int:
    """How many slices the dK/dV kernel cuts each kv head's group of query
    heads into (1: none): ``cfg.head_slices`` where set (at most the group,
    a divisor of it), else for a causal call of at least ``SLICE_MIN_KEYS``
    keys the fewest whose slices have at most ``SLICE_HEADS`` heads."""
    group = q.shape[1] // k.shape[1]
    if q.shape[-1] > 128:   # the wide and split kernels walk whole groups
        return 1
    if cfg.head_slices is not None:
        return next(s for s in range(min(cfg.head_slices, group), 0, -1) if group % s == 0)
    if not causal or k.shape[2] < SLICE_MIN_KEYS or cfg.persistent:   # the persistent walk takes whole groups
        return 1
    return next(s for s in range(1, group + 1) if group % s == 0 and group // s <= SLICE_HEADS)


def dq_turns(cfg: HopperBwdConfig, ds_sum) -> bool:
    """Whether the compute warpgroups take turns forming a tile's whole dQ
    (``cfg.dq_turns``; the kernel reads it from the dQ sum's box width):
    not with dS row sums (sinks without the output remainder)."""
    return cfg.dq_turns and ds_sum is None


def _bwd_args(do, q, k, v, dq_acc, dk, dv, lse2, delta, causal, scale, cfg, ds_sum=None, paired=False, slices=1,
              window=None, sink_sums=None, sinks=None):
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    sink_args = {} if sink_sums is None else dict(SINK_SUMS=True, SINKS=sinks)
    return dict(**({} if window is None else dict(WIN_LEFT=int(window[0]), WIN_RIGHT=int(window[1]))),
        q_desc=_descriptor(q, cfg.block_m), k_desc=_descriptor(k, 2 * cfg.block_n),
        v_desc=_descriptor(v, 2 * cfg.block_n), do_desc=_descriptor(do, cfg.block_m),
        dq_desc=_dq_descriptor(dq_acc, cfg.block_m, d if dq_turns(cfg, ds_sum) else d // 2), DK=dk, DV=dv,
        LSE2=_row_descriptor(lse2, cfg.block_m) if cfg.stats_tma else lse2,
        DELTA=_row_descriptor(delta, cfg.block_m) if cfg.stats_tma else delta,
        stride_dkb=dk.stride(0), stride_dkh=dk.stride(1), stride_dkn=dk.stride(2),
        stride_dvb=dv.stride(0), stride_dvh=dv.stride(1), stride_dvn=dv.stride(2),
        GROUP_SIZE=hq // hkv, N_HEADS=hq, N_Q=n_q, N_K=n_k, qk_scale=scale * LOG2E, sm_scale=scale,
        DS_SUM=sink_sums if sink_sums is not None else delta if ds_sum is None else ds_sum, SUM_DS=ds_sum is not None,
        HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=bool(causal), NUM_STAGES=cfg.num_stages,
        DK_FROM_SMEM=cfg.dk_from_smem, DEFER_SUMS=cfg.defer_sums, PAIRED=paired, STATS_TMA=cfg.stats_tma,
        HEADS=hq // hkv // slices, ADD_DKDV=slices > 1, **sink_args)


def bwd_config_for(head_dim: int, head_dim_v: int | None = None) -> HopperBwdConfig:
    """The table's backward config for Q/K head dim ``head_dim`` and V head
    dim ``head_dim_v`` (default: the same)."""
    return configs.HOPPER_BWD[(head_dim, head_dim if head_dim_v is None else head_dim_v)]


def bwd_call_config(q, k, v, causal: bool, plain: bool) -> HopperBwdConfig:
    """The default backward config of a call: the table's, run persistent
    (non-causal with its last round cut) where ``plain`` (no sinks, window or
    packed sequences), without GQA (timed on one kv head a query head only)
    and with keys in ``configs.HOPPER_BWD_PERSISTENT_KEYS``' range."""
    d = q.shape[-1]
    cfg = bwd_config_for(d, v.shape[-1])
    keys = configs.HOPPER_BWD_PERSISTENT_KEYS.get((d, bool(causal))) if d == v.shape[-1] else None
    if plain and keys is not None and keys[0] <= k.shape[2] <= keys[1] and q.shape[1] == k.shape[1]:
        return _persistent_bwd(cfg)
    return cfg


@functools.cache
def _persistent_bwd(cfg: HopperBwdConfig) -> HopperBwdConfig:
    return dataclasses.replace(cfg, persistent=True, split_tail=True)


def split_kernel(head_dim: int, head_dim_v: int) -> bool:
    """Whether the backward runs ``kernels/bwd_hopper_split.py`` (QK = V head dim above 128)."""
    return head_dim == head_dim_v and head_dim > 128


def transposed_dq(head_dim: int, head_dim_v: int) -> bool:
    """Whether the backward kernel adds dQ transposed and walks whole groups (the wide kernel, V narrower
    than QK, and the split kernel): its sum is :func:`dq_sum_transposed`'s, else ``bwd_steps.dq_accumulator``'s."""
    return head_dim_v != head_dim or split_kernel(head_dim, head_dim_v)


def dq_sum_transposed(q: torch.Tensor) -> torch.Tensor:
    """The zeroed float32 dQ sum of the wide and split kernels: stored (B, Hq, D, Nq), Nq padded to a multiple
    of 4 (a copy-engine stride is 16-byte aligned), returned as the (B, Hq, Nq, D) view the convert reads."""
    b, hq, n_q, d = q.shape
    store = torch.zeros((b, hq, d, (n_q + 3) // 4 * 4), device=q.device, dtype=torch.float32)
    return store[..., :n_q].transpose(2, 3)


def _transposed_dq_args(q, k, v, do, dq_acc, dk, dv, lse2, delta, causal, scale, cfg) -> dict:
    """What the wide and split kernels take alike: V's and dO's descriptors, the transposed dQ sum with a
    (1, 1, 64, BLOCK_M) box, dK/dV and their strides, the stats, the sizes, the scales and the tile shape."""
    hq, n_q = q.shape[1], q.shape[2]
    return dict(
        v_desc=_descriptor(v, 2 * cfg.block_n), do_desc=_descriptor(do, cfg.block_m),
        dq_desc=_dq_descriptor(dq_acc.transpose(2, 3), 64, cfg.block_m), DK=dk, DV=dv, LSE2=lse2, DELTA=delta,
        stride_dkb=dk.stride(0), stride_dkh=dk.stride(1), stride_dkn=dk.stride(2),
        stride_dvb=dv.stride(0), stride_dvh=dv.stride(1), stride_dvn=dv.stride(2),
        GROUP_SIZE=hq // k.shape[1], N_HEADS=hq, N_Q=n_q, N_K=k.shape[2], qk_scale=scale * LOG2E, sm_scale=scale,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=bool(causal), NUM_STAGES=cfg.num_stages)


def _wide_bwd_args(do, q, k, v, dq_acc, dk, dv, lse2, delta, causal, scale, cfg):
    """The wide kernel's arguments: Q and K in two pieces (V's width and the tail)."""
    d, w = q.shape[-1], v.shape[-1]
    return dict(
        _transposed_dq_args(q, k, v, do, dq_acc, dk, dv, lse2, delta, causal, scale, cfg),
        q_desc=_descriptor(q[..., :w], cfg.block_m), qt_desc=_descriptor(q[..., w:], cfg.block_m),
        k_desc=_descriptor(k[..., :w], 2 * cfg.block_n), kt_desc=_descriptor(k[..., w:], 2 * cfg.block_n),
        HEAD_DIM_V=w, TAIL_DIM=d - w, DQ_BUFS=2 if cfg.block_m <= 32 else 1)   # a staging buffer 64 x 32/64 x 4 B


def _split_bwd_args(do, q, k, v, dq_acc, dk, dv, lse2, delta, causal, scale, cfg):
    """The split kernel's arguments (d = 256): whole rows of Q and K, the
    program's 2 * BLOCK_N keys in one box."""
    return dict(
        _transposed_dq_args(q, k, v, do, dq_acc, dk, dv, lse2, delta, causal, scale, cfg),
        q_desc=_descriptor(q, cfg.block_m), k_desc=_descriptor(k, 2 * cfg.block_n), HEAD_DIM=q.shape[-1])


def _transposed_kernel(head_dim: int, head_dim_v: int):
    """(kernel, argument builder) of the split or the wide backward kernel."""
    if split_kernel(head_dim, head_dim_v):
        from ..kernels.bwd_hopper_split import _attn_bwd_hopper_split_kernel
        return _attn_bwd_hopper_split_kernel, _split_bwd_args
    from ..kernels.bwd_hopper_wide import _attn_bwd_hopper_wide_kernel
    return _attn_bwd_hopper_wide_kernel, _wide_bwd_args


def attn_bwd_dkdv(do, q, k, v, dq_acc, dk, dv, lse2, delta, causal: bool, scale: float,
                  config: HopperBwdConfig | None = None, ds_sum=None, window=None, varlen=None, sink_sums=None,
                  sinks=None, workspace=None):
    """dK, dV (written) and the float32 dQ sum (added into ``dq_acc``) on the
    Hopper backward kernel.  ``lse2``/``delta`` come from the portable
    preprocess kernel; the portable convert kernel turns ``dq_acc`` into dq.
    ``ds_sum``: a zeroed float32 (B, Hq, N_Q) tensor that gets each query
    row's sum of dS over the keys (for the sinks' gradient), or None.  With
    V narrower than Q (the wide kernel) or d > 128 (the split kernel)
    ``dq_acc`` is :func:`dq_sum_transposed`'s view and ``ds_sum`` must be None.
    ``window``: a sliding window's kernel bounds (as :func:`attn_fwd`'s; the
    d <= 128 kernel, ``causal`` False, no pairs or head slices).
    ``varlen``: packed sequences, as :func:`attn_fwd`'s (the d <= 128
    kernel, QK = V head dim, no pairs, head slices or dS sums).
    ``sink_sums``: instead of ``ds_sum``, a zeroed float32 (Hq,) tensor that
    gets each head's sum over rows of p_sink Σ_j P dP (``sinks``: the heads'
    float32 sink logits; the d <= 128 kernel, not packed;
    ``tileattn.sinks.sink_sums_grad``).  ``cfg.persistent`` (d = 64) runs
    the persistent kernel where the call has none of ``ds_sum``,
    ``sink_sums``, a window or head slices, else the one-program-a-block one
    (``workspace``: its split tail's, ``hopper_persistent.bwd_workspace``)."""
    b, hq, n_q, d = q.shape
    hkv, n_k, w = k.shape[1], k.shape[2], v.shape[-1]
    cfg = config or bwd_config_for(d, w)
    check_slices(cfg, d, w)
    if window is not None and (causal or transposed_dq(d, w) or (cfg.head_slices or 1) > 1 or cfg.pair_blocks):
        raise ValueError("window: the Hopper backward runs a window on the d <= 128 kernel, causal folded into it, "
                         "without head slices or pairs")
    if varlen is not None and (transposed_dq(d, w) or (cfg.head_slices or 1) > 1 or cfg.pair_blocks
                               or ds_sum is not None or b != 1):
        raise ValueError("varlen: the Hopper backward runs packed (1, H, total, D) sequences on the d <= 128 "
                         "kernel, QK = V head dim, without head slices, pairs or dS sums")
    if sink_sums is not None and (ds_sum is not None or varlen is not None or transposed_dq(d, w) or sinks is None):
        raise ValueError("sink_sums: the d <= 128 Hopper backward's, with sinks, not with ds_sum or packed sequences")
    if cfg.stats_tma and any(t.stride(1) % 4 or t.data_ptr() % 16 for t in (lse2, delta)):
        padded = stats_rows(b, hq, n_q, q.device)   # rows the copy engine cannot address: copies that it can
        for dst, src in zip(padded, (delta, lse2)):
            dst.copy_(src)
        delta, lse2 = padded
    n_blocks = triton.cdiv(n_k, 2 * cfg.block_n)
    if transposed_dq(d, w):
        kernel, build = _transposed_kernel(d, w)
        assert ds_sum is None, "the wide and split backward kernels do not sum dS (no sinks)"
        grid, grouped = grid_order.grid(n_blocks, hkv, b, grid_order.group_rows(causal, n_blocks, hkv * b, cfg,
                                                                            sm_count(q.device)))
        runtime.run(kernel, grid, dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg),
                    dict(build(do, q, k, v, dq_acc, dk, dv, lse2, delta, causal, scale, cfg), N_ROWS=hkv,
                         GROUPED=grouped))
        return
    from ..kernels.bwd_hopper import _attn_bwd_hopper_kernel
    if varlen is not None:   # a key block of the longest sequence a program, a grid row a sequence
        cu_q, cu_k, _, max_k = varlen
        runtime.scratch_allocator()   # the edge tiles' descriptors are made on the device
        runtime.run(_attn_bwd_hopper_kernel, (triton.cdiv(max_k, 2 * cfg.block_n), hkv, cu_q.numel() - 1),
                    dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg),
                    dict(_bwd_args(do, q, k, v, dq_acc, dk, dv, lse2, delta, causal, scale, cfg, None, False, 1,
                                   window), N_ROWS=hkv, IS_VARLEN=True, CU_SEQLENS_Q=cu_q, CU_SEQLENS_K=cu_k,
                         K=k, Q=q, DO=do, stride_kh=k.stride(1), stride_kn=k.stride(2), stride_qh=q.stride(1),
                         stride_qn=q.stride(2), stride_doh=do.stride(1), stride_don=do.stride(2)))
        return
    slices = head_slices(q, k, causal, cfg)
    if cfg.persistent and slices == 1 and window is None and ds_sum is None and sink_sums is None:
        from .hopper_persistent import bwd_persistent
        bwd_persistent(_bwd_args(do, q, k, v, dq_acc, dk, dv, lse2, delta, causal, scale, cfg), k, dk, dv, causal,
                       cfg, workspace)
        return
    pair = grid_order.paired(q, k, causal, cfg, slices)
    # paired: a program, two key blocks (equal work: one row after another)
    rows = 1 if pair else grid_order.group_rows(causal, n_blocks, hkv * slices * b, cfg, sm_count(q.device))
    grid, grouped = grid_order.grid(triton.cdiv(n_blocks, 2) if pair else n_blocks, hkv * slices, b, rows)
    # head slices: float32 dK/dV sums the slices add into, rounded below
    sums = torch.zeros((2,) + k.shape, device=k.device, dtype=torch.float32) if slices > 1 else None
    runtime.run(_attn_bwd_hopper_kernel, grid, dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg),
                dict(_bwd_args(do, q, k, v, dq_acc, dk if sums is None else sums[0], dv if sums is None else sums[1],
                               lse2, delta, causal, scale, cfg, ds_sum, pair, slices, window, sink_sums, sinks),
                     N_ROWS=hkv * slices,
                     GROUPED=grouped))
    if sums is not None:
        dk.copy_(sums[0])
        dv.copy_(sums[1])
