"""KV-cache decoding kernels (flash-decoding): split-KV partial attention, the
combine step, and the in-place append of new keys/values.  Pure
``@triton.jit`` code, no torch.

``_decode_partial_kernel``: one program per (kv head x query block, batch,
split); the split is the slowest grid dimension, so every split-0 program is
dispatched before any other split's.  The query heads that share a kv head
are packed into the rows of one tile, query-major: packed row r holds query
``r // GROUP_SIZE`` of head ``kv_head * GROUP_SIZE + r % GROUP_SIZE``, so each
K/V byte of the cache is read once per kv head, not once per query head.  A
batch element's visible key range is cut into ``num_programs(2)`` splits of
whole BLOCK_N tiles: evenly, or with ``lead_permille`` > 0 split 0 takes that
share (in 1/1000) of the tiles and the other splits divide the rest evenly
(a *leading split*: the small trailing programs then go to whichever SMs
finish their leading program first).  Each split runs the online softmax over
its tiles and writes a partial output with its log-sum-exp.  With one split
the partial *is* the result and the kernel writes the output directly.

V has a head dim of its own, ``HEAD_DIM_V`` (tile ``BLOCK_DV``; the
accumulator's and the output's), next to Q's and K's ``HEAD_DIM``.  With
``HEAD_DIM_HI`` > 0 the cache is *shared* (the absorbed MLA layout: V is the
first HEAD_DIM_V channels of every key, ``v_cache = k_cache[..., :Dv]``):
each key tile is loaded once, as two power-of-2 pieces through V's and K's
sources -- V's source addresses the first HEAD_DIM_V channels (the ``lo``
piece, which is also the value tile), K's the last HEAD_DIM_HI channels (the
launcher points K at ``k_cache[..., Dv:]``) -- and
S = Q[:, :Dv] K_lo^T + Q[:, Dv:] K_hi^T, O += P K_lo: V is never loaded on
its own, and each piece is padded to its own power of 2 (576 = 512 + 64,
not one 1024-wide tile).

``_decode_combine_kernel`` merges the splits of each row by their lse:
out = sum_s exp(lse_s - lse) out_s with lse = log sum_s exp(lse_s), up to
16 splits of a row in one load.

A split's tiles run in three pipelined loops (a masked head at a left
window edge, an unmasked body, a masked tail at the diagonal and the n_k
edge; an empty head or tail is skipped by a branch) or, with ONE_LOOP, in
one loop of masked tiles, so that the pipeline runs on through a ragged last
tile.  ONE_LOOP on descriptor loads of a contiguous cache moves a split's
last tile back to end at the split's end: every tile then holds cache rows
below n_k only (rows below 0 come as zeros from the copy engine) and the
scores alone are masked; on the pointer path the loads are masked as well.

Masks (all bottom-right aligned against n_k, the cache length after the
append; ``q_pos = i + n_k - N_Q`` is row i's diagonal key):
key j is visible to row i iff j < n_k, j >= q_pos - WINDOW_LEFT (when
HAS_LEFT) and j <= q_pos + WINDOW_RIGHT (when HAS_RIGHT; causal is
WINDOW_RIGHT = 0).  Scores are s = scale * q.k, or softcap * tanh(s / softcap)
with SOFTCAP, plus -slope * |q_pos - j| with HAS_ALIBI; all kept in log2
units (scaled by log2(e)) so that every exponential is an exp2.

Cache addressing: a contiguous cache is (B, Hkv, capacity, D); a paged one is
(num_pages, Hkv, PAGE_SIZE, D) with key j of batch element b in page
``block_table[b, j // PAGE_SIZE]`` at row ``j % PAGE_SIZE`` (PAGE_SIZE = 0
marks a contiguous cache).  On the tensor-descriptor (TMA) path both are read
through a host-built 4-D descriptor, one (BLOCK_N, D) box per tile, indexed
(batch or page, kv head, row, 0); a paged tile must then lie in one page
(BLOCK_N divides PAGE_SIZE), otherwise, and on the portable path, rows are
loaded by pointer: one page lookup per tile when the tile lies in one page,
else one per row.  Rows at or past n_k are zeroed
in the masked tiles: the cache memory there may hold anything.  Page numbers
are clamped into range (an entry outside [0, num_pages) reads the last page)
so that an unchecked bad table can never address memory outside the cache.
Row offsets inside a (batch, kv head) are 32-bit, as in the training kernels;
a gathered row's page offset is 64-bit unless OFFSETS_32 says the whole cache
is addressable in 32 bits, and SAME_KV_STRIDES lets V's tile reuse K's row
offsets (the launcher sets both from the tensors' shapes and strides).
"""
import triton
import triton.language as tl

from .common import (LN2, LOG2E, STAGE_MASKED, accumulate, head_base, load_tile, online_softmax_step, pair_visible,
                     scores)


@triton.jit
def _page_numbers(entries, ok, num_pages, MASKED: tl.constexpr):
    """Block-table entries (a pointer or a tensor of pointers), read only
    where ``ok`` when MASKED, clamped into [0, num_pages) so that an unchecked
    bad table never addresses memory outside the cache: one unsigned min, so
    negative entries (huge as unsigned) become the last page, like entries
    past it."""
    if MASKED:
        pages = tl.load(entries, mask=ok, other=0)
    else:
        pages = tl.load(entries)
    last = tl.full([], num_pages - 1, tl.uint32)   # (num_pages may be the constexpr 1)
    return tl.minimum(pages.to(tl.uint32, bitcast=True), last).to(tl.int32, bitcast=True)


@triton.jit
def _kv_tile(src, cache, start_n, n_k,
             BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr, USE_TMA: tl.constexpr,
             OFFSETS_32: tl.constexpr):
    """Keys (or values) [start_n, start_n + BLOCK_N) of one (batch, kv head),
    zero at and past n_k when MASKED (MASKED=False: the whole tile is < n_k).
    OFFSETS_32: every element offset of the cache fits in int32, so per-row
    page offsets are computed in 32 bits.  ``src``: (tensor descriptor,
    base pointer, strides (b, h, n, d)) of the cache; ``cache``: (block-table
    row, number of pages, batch index, kv head, block-table stride)."""
    desc, base, strides = src
    stride_b, stride_h, stride_n, stride_d = strides
    bt_row, num_pages, off_b, off_hk, stride_tn = cache
    offs_n = start_n + tl.arange(0, BLOCK_N)
    in_seq = offs_n < n_k
    if USE_TMA and PAGE_SIZE % BLOCK_N == 0:
        if PAGE_SIZE > 0:
            # the tile lies in one page: one page lookup, one box
            page = _page_numbers(bt_row + (start_n // PAGE_SIZE) * stride_tn, None, num_pages, False)
            x = desc.load([page, off_hk, start_n % PAGE_SIZE, 0])
        else:
            x = desc.load([off_b, off_hk, start_n, 0])
        # the (1, 1, BLOCK_N, BLOCK_D) box is rank-reduced: no data movement
        x = x.reshape([BLOCK_N, BLOCK_D])
        if MASKED:
            x = tl.where(in_seq[:, None], x, 0.0)
    else:
        # start_n is a multiple of BLOCK_N (every loop of the partial kernel
        # starts on a tile boundary), so a row's page and its place in the
        # page split into a per-tile part and a loop-invariant one
        offs_d = tl.arange(0, BLOCK_D)
        i = tl.arange(0, BLOCK_N)
        if PAGE_SIZE > 0:
            if PAGE_SIZE % BLOCK_N == 0:
                # the tile lies in one page: one page lookup
                page = _page_numbers(bt_row + (start_n // PAGE_SIZE) * stride_tn, start_n < n_k, num_pages, MASKED)
                rows = page.to(tl.int64) * stride_b + (start_n % PAGE_SIZE + i) * stride_n
            else:
                if BLOCK_N % PAGE_SIZE == 0:
                    entries = bt_row + (start_n // PAGE_SIZE + i // PAGE_SIZE) * stride_tn
                    in_page = (i % PAGE_SIZE) * stride_n
                else:
                    entries = bt_row + (offs_n // PAGE_SIZE) * stride_tn
                    in_page = (offs_n % PAGE_SIZE) * stride_n
                pages = _page_numbers(entries, in_seq, num_pages, MASKED)
                if OFFSETS_32:
                    rows = pages * stride_b + in_page
                else:
                    rows = pages.to(tl.int64) * stride_b + in_page
        else:
            rows = off_b.to(tl.int64) * stride_b + offs_n * stride_n
        # one 64-bit address per row; the columns are the same small offsets
        # on every row and tile
        row_ptrs = base + off_hk.to(tl.int64) * stride_h + rows
        ptrs = row_ptrs[:, None] + (offs_d * stride_d)[None, :]
        x = load_tile(ptrs, in_seq, offs_d < HEAD_DIM, MASKED, HEAD_DIM != BLOCK_D)
    return x


@triton.jit
def _decode_stage(acc, l_i, m_i, q, q_hi, q_pos, slopes, k_src, v_src, cache, stage, n_k, var,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, HEAD_DIM_HI: tl.constexpr,
                  BLOCK_DHI: tl.constexpr,
                  PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  USE_TMA: tl.constexpr, OFFSETS_32: tl.constexpr, HAS_LEFT: tl.constexpr,
                  HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                  SHIFT_LAST: tl.constexpr):
    """The online softmax over the tiles [lo, hi) of ``stage``, MASKED or
    not.  ``k_src``/``v_src``, ``cache``: see :func:`_kv_tile`; ``var``: the
    scale and the variants' runtime parameters; ``q_hi``: with HEAD_DIM_HI
    (a shared cache) the query's last HEAD_DIM_HI channels, ``q`` its first
    HEAD_DIM_V (see the module docstring).  With SHIFT_LAST
    (descriptor loads of a contiguous cache) the last tile is moved back to
    end at hi, so that every tile holds only cache rows below n_k (rows below
    0 come as zeros from the copy engine) and needs no zeroing; the scores of
    its keys before the tile's own start (done by the tile before) are
    masked instead."""
    lo, hi = stage
    qk_scale, softcap_scale, softcap_log2, win_left, win_right = var
    ZERO_ROWS: tl.constexpr = MASKED and not SHIFT_LAST
    for lo_n in range(lo, hi, BLOCK_N):
        if SHIFT_LAST:
            start_n = tl.minimum(lo_n, hi - BLOCK_N)
        else:
            start_n = lo_n
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if HEAD_DIM_HI > 0:
            # one read of each key: its first HEAD_DIM_V channels are the value tile
            v = _kv_tile(v_src, cache, start_n, n_k, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM_V, BLOCK_D=BLOCK_DV,
                         PAGE_SIZE=PAGE_SIZE, MASKED=ZERO_ROWS, USE_TMA=USE_TMA, OFFSETS_32=OFFSETS_32)
            k_hi = _kv_tile(k_src, cache, start_n, n_k, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM_HI, BLOCK_D=BLOCK_DHI,
                            PAGE_SIZE=PAGE_SIZE, MASKED=ZERO_ROWS, USE_TMA=USE_TMA, OFFSETS_32=OFFSETS_32)
            qk = tl.dot(q, tl.trans(v), input_precision=DOT_PRECISION)
            qk = tl.dot(q_hi, tl.trans(k_hi), qk, input_precision=DOT_PRECISION)
        else:
            k = _kv_tile(k_src, cache, start_n, n_k, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                         PAGE_SIZE=PAGE_SIZE, MASKED=ZERO_ROWS, USE_TMA=USE_TMA, OFFSETS_32=OFFSETS_32)
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s, _ = scores(qk, q_pos[:, None], offs_n[None, :], 0, qk_scale, softcap_scale, softcap_log2,
                      slopes[:, None], HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            visible = (offs_n < n_k)[None, :]
            if SHIFT_LAST:
                visible = visible & (offs_n >= lo_n)[None, :]
            if HAS_LEFT or HAS_RIGHT:
                visible = visible & pair_visible(q_pos[:, None], offs_n[None, :], 0, win_left, win_right,
                                                 HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT)
            s = tl.where(visible, s, float("-inf"))
        p, alpha, l_i, m_new = online_softmax_step(s, m_i, l_i, MASKED)
        if HEAD_DIM_HI == 0:
            v = _kv_tile(v_src, cache, start_n, n_k, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM_V, BLOCK_D=BLOCK_DV,
                         PAGE_SIZE=PAGE_SIZE, MASKED=ZERO_ROWS, USE_TMA=USE_TMA, OFFSETS_32=OFFSETS_32)
        acc = accumulate(acc, p, alpha, v, DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _decode_partial_kernel(
    Q, K, V, K_DESC, V_DESC, SEQLENS, BLOCK_TABLE, SLOPES, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_tb, stride_tn,
    stride_sb, stride_sh,
    stride_ob, stride_oh, stride_on, stride_os, stride_od,
    stride_lb, stride_lh, stride_ln, stride_ls,
    N_Q, N_NEW, N_KV_HEADS, GROUP_SIZE, CAPACITY, NUM_PAGES,
    qk_scale, softcap_scale, softcap_log2, window_left, window_right, lead_permille,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, HEAD_DIM_HI: tl.constexpr, BLOCK_DHI: tl.constexpr,
    SAME_KV_STRIDES: tl.constexpr = False, OFFSETS_32: tl.constexpr = False, ONE_LOOP: tl.constexpr = False,
):
    off_hk = tl.program_id(0) % N_KV_HEADS
    m_block = tl.program_id(0) // N_KV_HEADS
    off_b = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    # packed rows: query-major, the GROUP_SIZE heads of one query side by side
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP_SIZE * N_Q
    off_i = rows // GROUP_SIZE
    off_h = off_hk * GROUP_SIZE + rows % GROUP_SIZE
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    if HEAD_DIM_HI > 0:
        # a shared cache: the query's first HEAD_DIM_V channels and its last HEAD_DIM_HI
        q_rows = Q + off_b.to(tl.int64) * stride_qb + (off_h.to(tl.int64) * stride_qh + off_i * stride_qn)[:, None]
        offs_lo = tl.arange(0, BLOCK_DV)
        q = tl.load(q_rows + offs_lo[None, :] * stride_qd, mask=row_ok[:, None] & (offs_lo < HEAD_DIM_V)[None, :],
                    other=0.0)
        offs_hi = tl.arange(0, BLOCK_DHI)
        q_hi = tl.load(q_rows + (HEAD_DIM_V + offs_hi)[None, :] * stride_qd,
                       mask=row_ok[:, None] & (offs_hi < HEAD_DIM_HI)[None, :], other=0.0)
    else:
        q_ptrs = (Q + off_b.to(tl.int64) * stride_qb
                  + (off_h.to(tl.int64) * stride_qh + off_i * stride_qn)[:, None] + offs_d[None, :] * stride_qd)
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        q_hi = q

    # cache length after the append (clamped: an unchecked length cannot run past the cache)
    n_k = tl.minimum(tl.load(SEQLENS + off_b) + N_NEW, CAPACITY)
    n_k = tl.maximum(n_k, 0)
    diag = n_k - N_Q
    q_pos = off_i + diag
    i_min = (m_block * BLOCK_M) // GROUP_SIZE
    i_max = tl.minimum((m_block * BLOCK_M + BLOCK_M - 1) // GROUP_SIZE, N_Q - 1)

    # keys visible to some row of the tile [lo_any, hi_any), to every row [lo_all, hi_all)
    lo_any = tl.zeros_like(n_k)
    lo_all = tl.zeros_like(n_k)
    hi_any = n_k
    hi_all = n_k
    if HAS_LEFT:
        lo_any = tl.maximum(i_min + diag - window_left, 0)
        lo_all = tl.maximum(i_max + diag - window_left, 0)
    if HAS_RIGHT:
        hi_any = tl.minimum(i_max + diag + window_right + 1, n_k)
        hi_all = tl.minimum(i_min + diag + window_right + 1, n_k)

    # this split's share of the tiles covering [lo_any, hi_any): tiles
    # [t0, t0 + count), evenly or behind a leading split 0
    first = (lo_any // BLOCK_N) * BLOCK_N
    n_tiles = tl.maximum(tl.cdiv(hi_any - first, BLOCK_N), 0)
    if lead_permille > 0:
        lead = (n_tiles * lead_permille) // 1000
        per_split = tl.cdiv(n_tiles - lead, num_splits - 1)
        t0 = tl.where(split == 0, 0, lead + (split - 1) * per_split)
        count = tl.where(split == 0, lead, per_split)
    else:
        count = tl.cdiv(n_tiles, num_splits)
        t0 = split * count
    start = first + t0 * BLOCK_N
    end = tl.minimum(start + count * BLOCK_N, hi_any)
    end = tl.maximum(end, start)
    # whole tiles inside [lo_all, hi_all) need no mask
    full_a = tl.minimum(tl.maximum(tl.cdiv(lo_all, BLOCK_N) * BLOCK_N, start), end)
    full_b = tl.minimum(tl.maximum((hi_all // BLOCK_N) * BLOCK_N, full_a), end)

    bt_row = BLOCK_TABLE + off_b.to(tl.int64) * stride_tb

    if HAS_ALIBI:
        slopes = tl.load(SLOPES + off_b.to(tl.int64) * stride_sb + off_h * stride_sh, mask=row_ok, other=0.0)
        slopes = slopes.to(tl.float32) * LOG2E
    else:
        slopes = tl.zeros([BLOCK_M], dtype=tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # masked head (left window edge), unmasked body, masked tail (diagonal,
    # n_k edge); with ONE_LOOP the tail takes every tile, so that the
    # pipeline runs on through the edge tiles without a prologue of their
    # own: masked by the scores alone on descriptor loads of a contiguous
    # cache (a ragged last tile moved back, SHIFT_LAST), by the load masks too
    # on the pointer path (rows at and past n_k load as zeros).  Without a
    # left window the head is always empty (full_a == start): not compiled
    if ONE_LOOP:
        full_b = start
    stages = ((start, full_a), (full_a, full_b), (full_b, end))
    HAS_STAGE: tl.constexpr = (HAS_LEFT and not ONE_LOOP, not ONE_LOOP, True)
    k_strides = (stride_kb, stride_kh, stride_kn, stride_kd)
    if SAME_KV_STRIDES:
        # V's tiles then reuse K's row offsets (the same values, computed once)
        v_strides = k_strides
    else:
        v_strides = (stride_vb, stride_vh, stride_vn, stride_vd)
    k_src = (K_DESC, K, k_strides)
    v_src = (V_DESC, V, v_strides)
    cache = (bt_row, NUM_PAGES, off_b, off_hk, stride_tn)
    var = (qk_scale, softcap_scale, softcap_log2, window_left, window_right)
    for i in tl.static_range(3):
        # each pipelined loop sets up its own barriers and prologue even when
        # it runs no tile: an empty masked stage is skipped by a branch
        if HAS_STAGE[i] and (not STAGE_MASKED[i] or stages[i][1] > stages[i][0]):
            acc, l_i, m_i = _decode_stage(
                acc, l_i, m_i, q, q_hi, q_pos, slopes, k_src, v_src, cache, stages[i], n_k, var,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, HEAD_DIM_V=HEAD_DIM_V, BLOCK_DV=BLOCK_DV,
                HEAD_DIM_HI=HEAD_DIM_HI, BLOCK_DHI=BLOCK_DHI, PAGE_SIZE=PAGE_SIZE,
                MASKED=STAGE_MASKED[i], DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, OFFSETS_32=OFFSETS_32,
                HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                SHIFT_LAST=i == 2 and ONE_LOOP and USE_TMA)

    # rows (or splits) that saw no key: output 0, lse -inf
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    row_off = (off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh + off_i * stride_on
               + split * stride_os)
    offs_dv = tl.arange(0, BLOCK_DV)
    o_ptrs = O + row_off[:, None] + offs_dv[None, :] * stride_od
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_dv < HEAD_DIM_V)[None, :])
    l_ptrs = (LSE + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh + off_i * stride_ln
              + split * stride_ls)
    tl.store(l_ptrs, lse, mask=row_ok)


@triton.jit
def _decode_combine_kernel(
    O_PART, LSE_PART, O, LSE,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_lb, stride_lh, stride_ln,
    N_ROWS, N_HEADS, N_Q, NUM_SPLITS,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Rows are (b, h, i) flattened; O_PART is (rows, NUM_SPLITS, HEAD_DIM) and
    LSE_PART (rows, NUM_SPLITS), both contiguous float32.  A program merges
    BLOCK_R rows over BLOCK_D of their channels (grid axis 1: the channel
    blocks; every block reads the rows' lse, block 0 stores the merged one),
    BLOCK_S splits of them per load (a running max rescales what earlier
    chunks summed): with NUM_SPLITS <= BLOCK_S, as the launcher arranges for
    up to 16 splits, the step waits on one round of loads, not one per
    split."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < N_ROWS
    rows64 = rows.to(tl.int64)
    pid_d = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        splits = s0 + tl.arange(0, BLOCK_S)
        ok = row_ok[:, None] & (splits < NUM_SPLITS)[None, :]
        part = rows64[:, None] * NUM_SPLITS + splits[None, :]
        lse_c = tl.load(LSE_PART + part, mask=ok, other=float("-inf"))
        o_c = tl.load(O_PART + part[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                      mask=ok[:, :, None] & d_ok[None, None, :], other=0.0)
        m_new = tl.maximum(m, tl.max(lse_c, 1))
        # splits that saw no key have lse -inf and weight 0; so far no key at all: reference 0
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2((m - m_ref) * LOG2E)
        w = tl.math.exp2((lse_c - m_ref[:, None]) * LOG2E)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o_c, 1)
        total = total * alpha + tl.sum(w, 1)
        m = m_new
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    empty = total == 0.0
    t_safe = tl.where(empty, 1.0, total)
    out = acc / t_safe[:, None]
    lse = tl.where(empty, float("-inf"), m_ref + tl.log(t_safe))
    off_b = rows64 // (N_HEADS * N_Q)
    off_h = (rows64 // N_Q) % N_HEADS
    off_i = rows64 % N_Q
    o_ptrs = O + (off_b * stride_ob + off_h * stride_oh + off_i * stride_on)[:, None] + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + off_b * stride_lb + off_h * stride_lh + off_i * stride_ln, lse, mask=row_ok & (pid_d == 0))


@triton.jit
def _append_kv_kernel(
    K_NEW, V_NEW, K, V, SEQLENS, BLOCK_TABLE,
    stride_knb, stride_knh, stride_knn, stride_knd,
    stride_vnb, stride_vnh, stride_vnn, stride_vnd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_tb, stride_tn,
    N_NEW, CAPACITY, NUM_PAGES,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
    PAGE_SIZE: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """Rows t of k_new/v_new[b, h] go to cache position cache_seqlens[b] + t;
    HEAD_DIM_V = 0 writes k_new alone (a shared cache: v_cache is k_cache's
    first channels)."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    pos = tl.load(SEQLENS + off_b) + t
    ok = (t < N_NEW) & (pos >= 0) & (pos < CAPACITY)
    offs_d = tl.arange(0, BLOCK_D)
    mask = ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    if PAGE_SIZE > 0:
        page = _page_numbers(BLOCK_TABLE + off_b.to(tl.int64) * stride_tb + (pos // PAGE_SIZE) * stride_tn,
                             ok, NUM_PAGES, True).to(tl.int64)
        k_rows = page * stride_kb + (pos % PAGE_SIZE) * stride_kn
        v_rows = page * stride_vb + (pos % PAGE_SIZE) * stride_vn
    else:
        k_rows = off_b.to(tl.int64) * stride_kb + pos * stride_kn
        v_rows = off_b.to(tl.int64) * stride_vb + pos * stride_vn
    k_dst = K + off_h.to(tl.int64) * stride_kh + k_rows[:, None] + offs_d[None, :] * stride_kd
    k_src = head_base(K_NEW, off_b, off_h, stride_knb, stride_knh) + t[:, None] * stride_knn + offs_d[None, :] * stride_knd
    tl.store(k_dst, tl.load(k_src, mask=mask), mask=mask)
    if HEAD_DIM_V > 0:
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_v = ok[:, None] & (offs_dv < HEAD_DIM_V)[None, :]
        v_dst = V + off_h.to(tl.int64) * stride_vh + v_rows[:, None] + offs_dv[None, :] * stride_vd
        v_src = (head_base(V_NEW, off_b, off_h, stride_vnb, stride_vnh) + t[:, None] * stride_vnn
                 + offs_dv[None, :] * stride_vnd)
        tl.store(v_dst, tl.load(v_src, mask=mask_v), mask=mask_v)
