"""Launchers for the KV-cache decoding kernels (``kernels/decode.py``):
allocate outputs, pick the config and the split count, compute the grid and
call the kernels by keyword.  No validation here (``decode.py`` validates
before anything reaches this module); the config choice is in
``decode_configs.py``.

V may have its own head dim Dv: the output and the partial outputs are Dv
wide.  A shared cache (``v_cache = k_cache[..., :Dv]``, the absorbed MLA
layout) is launched with K pointing at the keys' last D - Dv channels
(``k_cache[..., Dv:]``) and V at their first Dv, and the kernel's
HEAD_DIM_HI = D - Dv: each key tile is read once, as two pieces, and V is
never loaded on its own; the append then writes k_new alone.

Split count (``num_splits=0``), :func:`choose_num_splits`:

* ``base`` = programs per split = batch x kv heads x query blocks.
* A cache is not split if one split already gives at least ``ONE_WAVE``
  (90%) of the SMs a program: each program then streams its whole cache at
  full bandwidth, and splitting only adds partial outputs and the combine
  (H200, B=16, Hkv=8, d=128, 16k / 64k keys: one split 254 / 956 us on a
  contiguous cache, 254 / 961 us on 256-token pages, against 2 splits'
  307 / 971 and 263 / 972 us; docs/perf-notes.md, v5).  Paged caches need
  the deeper pipelines of their configs for that (configs.DECODE_CONFIGS): with one
  K/V tile buffered, as the contiguous configs give them, 2 splits were
  faster.
* Otherwise the GPU should hold at least ``PROGRAMS_PER_SM`` (2) programs per SM, so
  that one program's memory stalls overlap another's: ``slots = 2 x SMs``.
* A split count ``s`` fills ``base * s / slots`` waves; its efficiency is
  that over the next whole number of waves (the last wave partly idle).
* Each split keeps at least ``MIN_KEYS_PER_SPLIT`` (256) keys of the cache
  capacity, and there are at most ``MAX_SPLITS`` (64): short caches gain
  nothing from splitting and each split costs a partial output and a term of
  the combine.
* The smallest ``s`` whose efficiency is within 5% of the best allowed one
  wins.  E.g. B=1, Hkv=8 at 32k keys on 132 SMs: s=32 (256 programs);
  B=16, Hkv=8 (base 128 >= 0.9 x 132): no split.

Leading split (:func:`choose_lead`, :func:`choose_splits` puts the two
together): where the rule above gives one split and that split is one wave
(``ONE_WAVE x SMs <= base <= SMs``), the cache holds at least
``LEAD_MIN_KEYS`` (32k) keys of capacity and the tiles load by descriptor
(Hopper copy engine; contiguous caches or pages of at least ``LEAD_MIN_PAGE``
(128) tokens), the call launches ``LEAD_SPLITS`` (4) splits of which split 0
takes ``LEAD_PERMILLE`` (94%) of each cache's tiles and the other three a
third of the rest each.  Per-program clocks showed that SMs do not stream
at one speed: on an H200 (16k-128k keys) a tenth of the one-split programs
finished 7-11% before the last, largely on the same SMs at every length,
with 4 SMs idle throughout.  The split-0 programs are dispatched first (the
split is the slowest grid dimension); the small trailing programs then run on the idle
SMs and on those whose leading program finished first.  Measured on two
H200s (docs/perf-notes.md, v7; CUDA-graph replay, ratio to SDPA-cuDNN):
32k / 64k / 128k keys 0.985 / 0.987 / 0.989x -> 1.002 / 1.005 / 1.006x on
one, 0.995 / 0.996 -> 0.998 / 0.999x on the other; at 16k and below the
combine costs more than it gains, and on 16-token pages (rows gathered by
pointer) it lost up to 3% on one of the two machines.

On Hopper a call on the absorbed MLA cache (``decode_hopper.eligible``)
runs its own partial kernel, 16 or 32 packed rows a program
(``kernels/decode_hopper.py``): the same splits of whole 64-key tiles, the
same partial outputs and combine, with ``decode_hopper.PROGRAMS_PER_SM`` (1)
and ``decode_hopper.MIN_KEYS`` (128) in the split rule.

The rules use the cache *capacity* (contiguous: its max_seqlen; paged:
max_blocks x page_size), not the actual lengths, so the host never waits for
the GPU and the call can be captured in a CUDA graph.  Each batch element's
key range is divided between the splits in the kernel by its own length.
"""
from __future__ import annotations

import math

import torch
import triton

from .. import configs
from ..configs import DecodeConfig
from ..kernels.decode import _append_kv_kernel, _decode_combine_kernel, _decode_partial_kernel
from . import decode_hopper, runtime, tuning
# (re-exported: the launcher's config choice, in its own module)
from .decode_configs import (  # noqa: F401
    _TUNE_KEY, _first_fitting, _set_boxes, _tuned_partial, decode_autotune_enabled, decode_smem_bytes, one_loop,
    shared_smem_bytes)
from .runtime import LOG2E, descriptor, dot_precision, output_f32, output_like, strides4

PROGRAMS_PER_SM = 2
# leading split (choose_lead; docs/perf-notes.md, v7)
LEAD_SPLITS = 4
LEAD_PERMILLE = 940
LEAD_MIN_KEYS = 32768
LEAD_MIN_PAGE = 128
POINTER_PAGE_SIZE = 16
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 64
_EFFICIENCY_SLACK = 0.95
ONE_WAVE = 0.9

# combine: splits loaded at once (a chunk), at most this many rows per program,
# and (rows x chunk) <= _COMBINE_ELEMS (a load is rows x chunk x channels
# floats), and at most _COMBINE_FLOATS of them (128 a thread: V of 512);
# channels a program at most _COMBINE_COLS (wider heads in several blocks), and
# fewer rows a program while the grid is under _COMBINE_MIN_PROGRAMS (a small
# batch's merge is latency, not bandwidth: spread it over the SMs)
_COMBINE_SPLITS = 16
_COMBINE_ROWS = 16
_COMBINE_ELEMS = 64
_COMBINE_FLOATS = 64 * 256
_COMBINE_COLS = 128
_COMBINE_MIN_PROGRAMS = 256
# append: new rows per program
_APPEND_ROWS = 16


def choose_num_splits(programs_per_split: int, capacity: int, num_sms: int,
                      programs_per_sm: int = PROGRAMS_PER_SM, min_keys: int = MIN_KEYS_PER_SPLIT,
                      max_splits: int = MAX_SPLITS) -> int:
    """The split count for ``num_splits=0`` (the rule is in this module's docstring)."""
    if programs_per_split <= 0 or capacity <= 0:
        return 1
    if programs_per_split >= ONE_WAVE * num_sms:
        return 1
    limit = max(1, min(max_splits, capacity // min_keys))
    slots = max(1, num_sms * programs_per_sm)

    def efficiency(s: int) -> float:
        waves = programs_per_split * s / slots
        return waves / math.ceil(waves)

    best = max(efficiency(s) for s in range(1, limit + 1))
    return next(s for s in range(1, limit + 1) if efficiency(s) >= _EFFICIENCY_SLACK * best)


def choose_splits(programs_per_split: int, capacity: int, num_sms: int, descriptor_tiles: bool,
                  programs_per_sm: int = PROGRAMS_PER_SM, min_keys: int = MIN_KEYS_PER_SPLIT) -> tuple[int, int]:
    """(split count, leading split's share in 1/1000) for ``num_splits=0``:
    :func:`choose_num_splits` (with the partial kernel's programs an SM and
    fewest keys a split), and where that is one split, :func:`choose_lead`."""
    splits = choose_num_splits(programs_per_split, capacity, num_sms, programs_per_sm, min_keys)
    if splits == 1:
        lead = choose_lead(programs_per_split, capacity, num_sms, descriptor_tiles)
        if lead:
            return LEAD_SPLITS, lead
    return splits, 0


def descriptor_tiles(k_cache: torch.Tensor, v_cache: torch.Tensor, paged: bool) -> bool:
    """Whether :func:`choose_lead` counts the cache's tiles as loaded by
    descriptor: the copy engine can read it, and a paged cache's pages hold
    at least ``LEAD_MIN_PAGE`` tokens."""
    return runtime.use_tma(k_cache, v_cache) and (not paged or k_cache.shape[2] >= LEAD_MIN_PAGE)


def choose_lead(programs_per_split: int, capacity: int, num_sms: int, descriptor_tiles: bool) -> int:
    """The leading split's share (1/1000 of the tiles) for ``num_splits=0``
    where ``choose_num_splits`` chose one split, or 0 for that single split
    (the rule is in this module's docstring)."""
    if (descriptor_tiles and ONE_WAVE * num_sms <= programs_per_split <= num_sms
            and capacity >= LEAD_MIN_KEYS):
        return LEAD_PERMILLE
    return 0


def _max_offset(t: torch.Tensor) -> int:
    """The largest element offset from ``t``'s first element."""
    return sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 0)


def append_kv(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, capacity: int) -> None:
    """In-place append of k_new/v_new at cache_seqlens (one launch for K and
    V); v_new None appends k_new alone (a shared cache, whose V is K's first
    channels)."""
    b, hkv, n_new, d = k_new.shape
    dv = 0 if v_new is None else v_new.shape[3]
    if v_new is None:
        v_new, v_cache = k_new, k_cache   # (not written: HEAD_DIM_V = 0)
    if b == 0 or n_new == 0:
        return
    paged = block_table is not None
    bt = block_table if paged else cache_seqlens
    grid = (triton.cdiv(n_new, _APPEND_ROWS), hkv, b)
    runtime.run(_append_kv_kernel, grid, {}, dict(
        K_NEW=k_new, V_NEW=v_new, K=k_cache, V=v_cache, SEQLENS=cache_seqlens, BLOCK_TABLE=bt,
        **strides4(k_new, "kn"), **strides4(v_new, "vn"),
        **strides4(k_cache, "k"), **strides4(v_cache, "v"),
        stride_tb=bt.stride(0) if paged else 0, stride_tn=bt.stride(1) if paged else 0,
        N_NEW=n_new, CAPACITY=capacity, NUM_PAGES=k_cache.shape[0] if paged else 1,
        HEAD_DIM=d, BLOCK_D=configs.block_d(d), BLOCK_T=_APPEND_ROWS,
        PAGE_SIZE=k_cache.shape[2] if paged else 0, HEAD_DIM_V=dv, BLOCK_DV=configs.block_d(dv) if dv else 0))


def kvcache_attention(q, k_cache, v_cache, cache_seqlens, block_table, *, n_new: int, capacity: int,
                      scale: float, window=(-1, -1), softcap=None, alibi_slopes=None, num_splits: int = 0,
                      lead_permille: int | None = None, config: DecodeConfig | None = None,
                      k_new=None, v_new=None, shared_kv: bool = False, call_key=None):
    """Split-KV attention over the cache, after appending ``k_new``/``v_new``
    (when given; else the append is already done and ``n_new`` counts the
    rows it added).  ``window`` has causal folded in (right = 0).
    ``shared_kv``: ``v_cache`` is ``k_cache[..., :Dv]`` (checked by the
    caller): each key tile is read once, V taken from it, and only k_new is
    appended (``v_new`` is ignored).
    ``lead_permille``: the leading split's share of the tiles in 1/1000 (0:
    even splits; None: :func:`choose_lead` decides when ``num_splits`` is 0,
    even splits otherwise).  ``call_key``: a hashable key of the whole
    validated call (``decode._call_key``: every tensor's shape, strides,
    dtype, device and alignment, and every argument), which then keys the
    launch plan instead of the tensors being read again.  Returns (out
    (B, Hq, Nq, Dv) in q's dtype, lse float32 (B, Hq, Nq))."""
    b, hq, n_q, d = q.shape
    hkv, dv = k_cache.shape[1], v_cache.shape[3]
    group = hq // hkv
    block_m = configs.decode_block_m(group, n_q)
    if k_new is not None and (k_new.shape[0] == 0 or k_new.shape[2] == 0):
        k_new = v_new = None   # nothing to append
    if shared_kv:
        v_new = None
    # the keys' tiles: on a shared cache K's source is its last D - Dv channels
    # (v_cache is the first Dv)
    k_src = k_cache[..., dv:] if shared_kv else k_cache
    # a launch plan (runtime.py) for repeated calls of one shape: a decoding
    # loop calls this with the same shapes every step; the plan holds the
    # append's launch too
    plan_key = None
    if config is None and q.is_cuda and b > 0 and n_q > 0 and capacity > 0:
        autotuned = decode_autotune_enabled(block_m, k_cache.element_size())
        switches = (autotuned, shared_kv, shared_kv and decode_hopper.enabled())
        if call_key is not None:
            plan_key = runtime.plan_key("decode-call", (), call_key, lead_permille, *switches)
        else:
            plan_key = runtime.plan_key("decode", (q, k_cache, v_cache, cache_seqlens, block_table, alibi_slopes,
                                                   k_new, v_new),
                                        int(n_new), int(capacity), float(scale), tuple(window), softcap,
                                        num_splits, lead_permille, *switches)
        plan = runtime.PLANS.get(plan_key) if plan_key is not None else None
        splits = _PLAN_SPLITS.get(plan_key) if plan is not None else None
        if splits is not None:   # (a plan without its split count is recorded again below)
            out, lse = _output(q, dv), output_f32((b, hq, n_q), q.device)
            tensors = _decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table, alibi_slopes, out, lse,
                                      k_new, v_new, k_src)
            if splits > 1:
                tensors["o_part"] = output_f32((b, hq, n_q, splits, dv), q.device)
                tensors["l_part"] = output_f32((b, hq, n_q, splits), q.device)
            if runtime.aligned(*(tensors[k] for k in _DECODE_OUTPUTS if k in tensors)):
                runtime.replay(plan, tensors)
                return out, lse
            plan_key = None
    if plan_key is not None:
        runtime.begin_record()
    try:
        out, lse = _kvcache_first_call(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, k_src,
                                       n_new=n_new, capacity=capacity, scale=scale,
                                       window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                       num_splits=num_splits, lead_permille=lead_permille, config=config,
                                       block_m=block_m, plan_key=plan_key)
    except BaseException:
        runtime.abandon_record()
        raise
    return out, lse


def _kvcache_first_call(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, k_src, *, n_new, capacity,
                        scale, window, softcap, alibi_slopes, num_splits, lead_permille, config, block_m, plan_key):
    """The launches of :func:`kvcache_attention` without a plan to replay;
    records one under ``plan_key`` when it is not None."""
    b, hq, n_q, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    hopper = (k_src is not k_cache and config is None
              and decode_hopper.eligible(q, k_src, v_cache, block_table, softcap, alibi_slopes))
    if hopper:
        block_m = decode_hopper.block_rows(group * n_q)
    m_blocks = triton.cdiv(group * n_q, block_m)
    if num_splits == 0:
        if hopper:   # tiles by descriptor; one program an SM, two tiles a split at least
            by_descriptor, rule = True, dict(programs_per_sm=decode_hopper.PROGRAMS_PER_SM,
                                             min_keys=decode_hopper.MIN_KEYS)
        else:
            by_descriptor, rule = (descriptor_tiles(k_src, v_cache, block_table is not None)
                                   and not _shared_pages_by_pointer(k_src is not k_cache, block_table is not None,
                                                                    block_m, k_cache.element_size())), {}
        num_splits, lead = choose_splits(b * hkv * m_blocks, capacity, runtime.sm_count(q.device), by_descriptor,
                                         **rule)
        lead_permille = lead if lead_permille is None else lead_permille
    lead_permille = lead_permille or 0
    if lead_permille and num_splits < 2:   # (before the append writes the cache)
        raise ValueError(f"a leading split needs num_splits >= 2, got {num_splits}")
    if k_new is not None:
        append_kv(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, capacity)
    out = _output(q, v_cache.shape[3])
    lse = output_f32((b, hq, n_q), q.device)
    if b == 0 or n_q == 0:
        return out, lse
    if capacity == 0:   # a cache of no rows: every row sees no key (no kernel takes an empty tile)
        return out.zero_(), lse.fill_(float("-inf"))
    o_part, l_part = _kvcache_launch(q, k_src, v_cache, cache_seqlens, block_table, out, lse,
                                     n_new=n_new, capacity=capacity, scale=scale, window=window,
                                     softcap=softcap, alibi_slopes=alibi_slopes, num_splits=num_splits,
                                     lead_permille=lead_permille, block_m=block_m, m_blocks=m_blocks,
                                     config=config, shared_kv=k_src is not k_cache, hopper=hopper)
    if plan_key is not None:
        tensors = _decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table, alibi_slopes, out, lse,
                                  k_new, v_new, k_src)
        if num_splits > 1:
            tensors.update(o_part=o_part, l_part=l_part)
        runtime.end_record(plan_key, tensors)
        if plan_key in runtime.PLANS:
            if len(_PLAN_SPLITS) >= runtime.PLANS_MAX:
                _PLAN_SPLITS.clear()
            _PLAN_SPLITS[plan_key] = num_splits
    return out, lse


# the split count each decode plan was recorded with (its partial outputs' shape)
_PLAN_SPLITS: dict = {}
_DECODE_OUTPUTS = ("out", "lse", "o_part", "l_part")


def _shared_pages_by_pointer(shared_kv: bool, paged: bool, block_m: int, elem: int) -> bool:
    """A shared cache's pages at 64+ packed rows load by pointer: by
    descriptor the three loops' edge tiles, zeroed in registers, spilled
    ~850 bytes a thread (sm_90, D = 576, 8 warps; by pointer, in one loop,
    4 bytes)."""
    return shared_kv and paged and configs.decode_uses_wgmma(block_m, elem)


def _output(q: torch.Tensor, dv: int) -> torch.Tensor:
    """The output: q's batch, heads and rows, V's head dim (q's layout when Dv = D)."""
    if dv == q.shape[3]:
        return output_like(q)
    out = torch.empty((*q.shape[:3], dv), device=q.device, dtype=q.dtype)
    if runtime.POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def _decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table, alibi_slopes, out, lse, k_new=None,
                    v_new=None, k_src=None) -> dict:
    """The per-call tensors of a decode launch, by name (optional ones only
    when given; ``k_src``, K's last channels, only when it is not ``k_cache``)."""
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "seqlens": cache_seqlens, "out": out, "lse": lse}
    if k_src is not None and k_src is not k_cache:
        tensors["k_src"] = k_src
    if k_new is not None:
        tensors["k_new"] = k_new
    if v_new is not None:
        tensors["v_new"] = v_new
    if block_table is not None:
        tensors["block_table"] = block_table
    if alibi_slopes is not None:
        tensors["slopes"] = alibi_slopes
    return tensors


def _kvcache_launch(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, *, n_new, capacity, scale, window,
                    softcap, alibi_slopes, num_splits, lead_permille, block_m, m_blocks, config, shared_kv=False,
                    hopper=False):
    """The partial kernel (and, for several splits, the combine).  Returns the
    partial outputs (``out``, ``lse`` themselves for one split).  With
    ``shared_kv``, ``k_cache`` is the keys' last D - Dv channels and
    ``v_cache`` their first Dv (the kernel's HEAD_DIM_HI); with ``hopper``
    (``decode_hopper.eligible``) the partial kernel is the Hopper one."""
    b, hq, n_q, d = q.shape
    hkv, dv = k_cache.shape[1], v_cache.shape[3]
    group = hq // hkv
    paged = block_table is not None

    page_size = k_cache.shape[2] if paged else 0
    # pages of POINTER_PAGE_SIZE rows or fewer load through pointers.  Only
    # 16-row tiles could use a descriptor on such pages (a tile must lie in
    # one page); larger tiles gather rows by pointer either way, and the
    # 16-row descriptor tiles (N16, 9 and 13 stages, 1 or 2 splits) ran at
    # 0.38-0.62x SDPA-cuDNN (H200, 16k / 64k keys,
    # docs/results/h200/v5/cfg_sweep) against 0.97x for the gathered 128-row
    # tiles.  With v4's configs the setting was 0.086 against 0.130 ms at 4k
    tma = (runtime.use_tma(k_cache, v_cache) and not (paged and page_size <= POINTER_PAGE_SIZE)
           and not _shared_pages_by_pointer(shared_kv, paged, block_m, k_cache.element_size()))

    if num_splits == 1:
        o_part, l_part = out, lse
        o_strides = dict(stride_ob=out.stride(0), stride_oh=out.stride(1), stride_on=out.stride(2),
                         stride_os=0, stride_od=out.stride(3))
        l_strides = dict(stride_lb=lse.stride(0), stride_lh=lse.stride(1), stride_ln=lse.stride(2), stride_ls=0)
    else:
        o_part = output_f32((b, hq, n_q, num_splits, dv), q.device)
        l_part = output_f32((b, hq, n_q, num_splits), q.device)
        o_strides = dict(zip(("stride_ob", "stride_oh", "stride_on", "stride_os", "stride_od"), o_part.stride()))
        l_strides = dict(zip(("stride_lb", "stride_lh", "stride_ln", "stride_ls"), l_part.stride()))

    if hopper:
        decode_hopper.launch(q, k_cache, v_cache, cache_seqlens, block_table, o_part, l_part, n_new=n_new,
                             capacity=capacity, scale=scale, window=window, num_splits=num_splits,
                             lead_permille=lead_permille, block_m=block_m, m_blocks=m_blocks)
        if num_splits > 1:
            combine_splits(o_part, l_part, out, lse)
        return o_part, l_part

    left, right = window
    args = dict(
        Q=q, K=k_cache, V=v_cache,
        K_DESC=descriptor(k_cache) if tma else k_cache, V_DESC=descriptor(v_cache) if tma else v_cache,
        SEQLENS=cache_seqlens, BLOCK_TABLE=block_table if paged else cache_seqlens,
        SLOPES=alibi_slopes if alibi_slopes is not None else lse, O=o_part, LSE=l_part,
        **strides4(q, "q"), **strides4(k_cache, "k"), **strides4(v_cache, "v"),
        stride_tb=block_table.stride(0) if paged else 0, stride_tn=block_table.stride(1) if paged else 0,
        stride_sb=(alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0),
        stride_sh=(alibi_slopes.stride(-1) if alibi_slopes is not None else 0),
        **o_strides, **l_strides,
        N_Q=n_q, N_NEW=n_new, N_KV_HEADS=hkv, GROUP_SIZE=group, CAPACITY=capacity,
        NUM_PAGES=k_cache.shape[0] if paged else 1,
        qk_scale=scale * LOG2E,
        softcap_scale=(scale / softcap) if softcap else 1.0,
        softcap_log2=(softcap * LOG2E) if softcap else 1.0,
        window_left=max(left, 0), window_right=max(right, 0), lead_permille=lead_permille,
        HEAD_DIM=d, BLOCK_D=configs.block_d(dv if shared_kv else d), BLOCK_M=block_m,
        HEAD_DIM_V=dv, BLOCK_DV=configs.block_d(dv), HEAD_DIM_HI=d - dv if shared_kv else 0,
        BLOCK_DHI=configs.block_d(d - dv) if shared_kv else 0, PAGE_SIZE=page_size,
        HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, SOFTCAP=softcap is not None,
        HAS_ALIBI=alibi_slopes is not None,
        DOT_PRECISION=dot_precision(q.dtype), USE_TMA=tma,
        SAME_KV_STRIDES=k_cache.stride() == v_cache.stride(),
        OFFSETS_32=_max_offset(k_cache) < 2 ** 31 and _max_offset(v_cache) < 2 ** 31,
        ONE_LOOP=one_loop(tma, paged),
    )
    grid = (hkv * m_blocks, b, num_splits)
    elem = k_cache.element_size()

    def first_fit():
        if decode_autotune_enabled(block_m, elem):
            return None
        return _first_fitting(block_m, d, elem, page_size, q.device, tma, dv, shared_kv)

    tuning.launch("decode-shared" if shared_kv else "decode", _decode_partial_kernel, grid, args, config=config,
                  interpreter_config=configs.INTERPRETER_DECODE, first_fit=first_fit,
                  build_autotuner=lambda: _tuned_partial(shared_kv),
                  key=(q.device, q.dtype, *(args[name] for name in _TUNE_KEY)), set_boxes=_set_boxes)

    if num_splits > 1:
        combine_splits(o_part, l_part, out, lse)
    return o_part, l_part


def combine_splits(o_part: torch.Tensor, l_part: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Merge partial outputs o_part (B, Hq, Nq, S, D) and their lse l_part
    (B, Hq, Nq, S), both contiguous float32, into out (B, Hq, Nq, D) and lse
    (B, Hq, Nq)."""
    b, hq, n_q, num_splits, d = o_part.shape
    n_rows = b * hq * n_q
    block_s = max(2, min(_COMBINE_SPLITS, triton.next_power_of_2(num_splits)))
    cols = min(configs.block_d(d), _COMBINE_COLS)
    col_blocks = triton.cdiv(d, cols)
    block_r = max(1, min(_COMBINE_ROWS, _COMBINE_ELEMS // block_s, _COMBINE_FLOATS // (block_s * cols)))
    while block_r > 1 and triton.cdiv(n_rows, block_r) * col_blocks < _COMBINE_MIN_PROGRAMS:
        block_r //= 2
    combine = dict(
        O_PART=o_part, LSE_PART=l_part, O=out, LSE=lse,
        **strides4(out, "o"),
        stride_lb=lse.stride(0), stride_lh=lse.stride(1), stride_ln=lse.stride(2),
        N_ROWS=n_rows, N_HEADS=hq, N_Q=n_q, NUM_SPLITS=num_splits,
        HEAD_DIM=d, BLOCK_D=cols, BLOCK_R=block_r, BLOCK_S=block_s)
    runtime.run(_decode_combine_kernel, (triton.cdiv(n_rows, block_r), col_blocks), {}, combine)
