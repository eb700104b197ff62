"""Hopper decoding kernel for the absorbed MLA cache (Gluon): split-KV
partial attention of a few packed query rows over one shared 576-wide cache.

The absorbed layout (DeepSeek's MLA at decode time): one kv head, each key
``HEAD_DIM_V + HEAD_DIM_HI`` (512 + 64) channels wide, whose first
``HEAD_DIM_V`` channels are also its value (``v_cache = k_cache[..., :512]``).
With one query token and 16 query heads (one tensor-parallel rank's share)
a program has 16 packed rows (``BLOCK_M``): below a warpgroup MMA's 64, so
the products run transposed, keys in the MMA's M and the packed rows in its
N (8 to 32 wide):

    Sᵀ (BLOCK_N x BLOCK_M) = K (BLOCK_N x 576) · Qᵀ,   Oᵀ (512 x BLOCK_M) += Vᵀ · Pᵀ

Both read the key tile straight from shared memory (Vᵀ as a transposed view
of the same bytes), so each cache byte crosses HBM once and shared memory
twice; Qᵀ and Pᵀ are the small operands.  Oᵀ is four 128 x BLOCK_M float32
accumulators (64 registers a thread at 16 rows).

Two partitions share a CTA:

* the **load partition** (one warp) copies each key tile of the program's
  split with the copy engine (TMA) into a ring of ``NUM_STAGES`` slots: four
  128-wide pieces of the value channels and the 64-wide tail, one barrier
  ``ready[s]`` completed by their bytes, one ``empty[s]`` the softmax
  partition arrives on when the tile's products are done; on a paged cache
  it looks up each tile's page (clamped into range) first;
* the **softmax partition** (one warpgroup) loads the packed query rows by
  pointer into shared memory, then for every tile issues Sᵀ, masks and runs
  the online softmax per packed row (a column of Sᵀ: the max and sum run
  over the tile's keys), stores Pᵀ to shared memory and issues Oᵀ += Vᵀ Pᵀ.

A tile that reaches past the cache length ``n_k`` (its rows there may hold
anything, NaN included) has its value rows there zeroed in shared memory
before Vᵀ Pᵀ reads them; scores past the split's end, ``n_k`` and the
window are masked.  The split rule, the masks (bottom-right aligned, as in
``kernels/decode.py``), the partial outputs and their lse are the portable
partial kernel's, so the same combine merges them.

This module imports Gluon at load time: only the Hopper decode launcher
imports it, lazily, so a CPU install never does.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)
CHUNK: gl.constexpr = gl.constexpr(128)       # value channels per copy box and per Oᵀ accumulator


@gluon.jit
def _split_range(SEQLENS, off_b, m_block, split, num_splits, N_Q, N_NEW, GROUP_SIZE, CAPACITY,
                 window_left, window_right, lead_permille,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """(start, end, n_tiles, n_k): this split's keys [start, end), in
    ``n_tiles`` tiles from ``start``, of the keys some packed row of the block
    sees, and the cache length after the append (the portable partial
    kernel's rule)."""
    n_k = gl.minimum(gl.load(SEQLENS + off_b) + N_NEW, CAPACITY)
    n_k = gl.maximum(n_k, 0)
    diag = n_k - N_Q
    i_min = (m_block * BLOCK_M) // GROUP_SIZE
    i_max = gl.minimum((m_block * BLOCK_M + BLOCK_M - 1) // GROUP_SIZE, N_Q - 1)
    lo_any = n_k * 0
    hi_any = n_k
    if HAS_LEFT:
        lo_any = gl.maximum(i_min + diag - window_left, 0)
    if HAS_RIGHT:
        hi_any = gl.minimum(i_max + diag + window_right + 1, n_k)
    first = (lo_any // BLOCK_N) * BLOCK_N
    n_all = gl.maximum((hi_any - first + BLOCK_N - 1) // BLOCK_N, 0)
    if lead_permille > 0:
        lead = (n_all * lead_permille) // 1000
        per_split = (n_all - lead + num_splits - 2) // (num_splits - 1)
        if split == 0:
            t0 = 0
            count = lead
        else:
            t0 = lead + (split - 1) * per_split
            count = per_split
    else:
        count = (n_all + num_splits - 1) // num_splits
        t0 = split * count
    start = first + t0 * BLOCK_N
    end = gl.maximum(gl.minimum(start + count * BLOCK_N, hi_any), start)
    return start, end, (end - start + BLOCK_N - 1) // BLOCK_N, n_k


@gluon.jit
def _load_partition(lo_desc, hi_desc, lo_smem, hi_smem, ready, empty, BLOCK_TABLE, stride_tb, stride_tn, NUM_PAGES,
                    off_b, off_hk, start, n_tiles,
                    BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
                    N_CHUNKS: gl.constexpr):
    for t in range(n_tiles):
        s = t % NUM_STAGES
        # a slot starts empty: the first wait on each passes (phase 1)
        mbarrier.wait(empty.index(s), ((t // NUM_STAGES) & 1) ^ 1)
        row = start + t * BLOCK_N
        if PAGE_SIZE > 0:
            # the tile lies in one page (BLOCK_N divides PAGE_SIZE); an entry
            # outside [0, NUM_PAGES) reads the last page
            entry = gl.load(BLOCK_TABLE + off_b.to(gl.int64) * stride_tb + (row // PAGE_SIZE) * stride_tn)
            outer = gl.where((entry < 0) | (entry >= NUM_PAGES), NUM_PAGES - 1, entry)
            row = row % PAGE_SIZE
        else:
            outer = off_b
        bar = ready.index(s)
        mbarrier.expect(bar, N_CHUNKS * lo_desc.block_type.nbytes + hi_desc.block_type.nbytes)
        for c in gl.static_range(N_CHUNKS):
            tma.async_copy_global_to_shared(lo_desc, [outer, off_hk, row, c * CHUNK], bar,
                                            lo_smem.index(s * N_CHUNKS + c))
        tma.async_copy_global_to_shared(hi_desc, [outer, off_hk, row, 0], bar, hi_smem.index(s))


@gluon.jit
def _load_queries(Q, q_smem, qhi_smem, off_b, off_hk, m_block, stride_qb, stride_qh, stride_qn, stride_qd, N_Q,
                  GROUP_SIZE, BLOCK_M: gl.constexpr, HEAD_DIM_V: gl.constexpr, HEAD_DIM_HI: gl.constexpr,
                  N_CHUNKS: gl.constexpr):
    """The block's packed query rows (query-major: row r is query r // GROUP_SIZE
    of head off_hk * GROUP_SIZE + r % GROUP_SIZE; rows past the group read as
    zeros) into shared memory, as the K-major operand Qᵀ of Sᵀ."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    rows = m_block * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    row_ok = rows < GROUP_SIZE * N_Q
    off_h = off_hk * GROUP_SIZE + rows % GROUP_SIZE
    base = Q + off_b.to(gl.int64) * stride_qb + off_h.to(gl.int64) * stride_qh + (rows // GROUP_SIZE) * stride_qn
    cols = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, layout))
    for c in gl.static_range(N_CHUNKS):
        x = gl.load(base[:, None] + (c * CHUNK + cols)[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
        q_smem.index(c).store(x)
    hi_cols = gl.arange(0, HEAD_DIM_HI, layout=gl.SliceLayout(0, layout))
    x = gl.load(base[:, None] + (HEAD_DIM_V + hi_cols)[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
    qhi_smem.store(x)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _zero_rows_past(lo_smem, s, key0, n_k, BLOCK_N: gl.constexpr, N_CHUNKS: gl.constexpr):
    """Zero a tile's value rows at and past n_k in shared memory (what the
    cache holds there is not ours to multiply by a zero probability)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    keep = (key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout)) < n_k)[:, None]
    for c in gl.static_range(N_CHUNKS):
        buf = lo_smem.index(s * N_CHUNKS + c).reshape([BLOCK_N, CHUNK])
        buf.store(gl.where(keep, buf.load(layout), 0.0))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _store_chunk(O, acc, row_off, row_ok, c, stride_od, BLOCK_M: gl.constexpr):
    """One 128-channel piece of the output rows (Oᵀ's rows are channels)."""
    layout: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])
    x = gl.convert_layout(acc, layout)
    ch = c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
    ptrs = O + gl.convert_layout(row_off, gl.SliceLayout(0, layout))[None, :] + (ch * stride_od)[:, None]
    gl.store(ptrs, x.to(O.dtype.element_ty), mask=gl.convert_layout(row_ok, gl.SliceLayout(0, layout))[None, :])


@gluon.jit
def _softmax_partition(lo_smem, hi_smem, q_smem, qhi_smem, p_smem, ready, empty, Q, O, LSE,
                       stride_qb, stride_qh, stride_qn, stride_qd,
                       stride_ob, stride_oh, stride_on, stride_os, stride_od,
                       stride_lb, stride_lh, stride_ln, stride_ls,
                       off_b, off_hk, m_block, split, start, end, n_tiles, n_k, N_Q, GROUP_SIZE,
                       qk_scale, window_left, window_right,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                       HEAD_DIM_V: gl.constexpr, HEAD_DIM_HI: gl.constexpr, N_CHUNKS: gl.constexpr,
                       HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    # Sᵀ (keys x rows) and each Oᵀ piece (channels x rows): one layout, so a
    # packed row's vector (SliceLayout 0) serves both
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BLOCK_M, 16])
    col_layout: gl.constexpr = gl.SliceLayout(0, layout)
    _load_queries(Q, q_smem, qhi_smem, off_b, off_hk, m_block, stride_qb, stride_qh, stride_qn, stride_qd, N_Q,
                  GROUP_SIZE, BLOCK_M, HEAD_DIM_V, HEAD_DIM_HI, N_CHUNKS)
    rows = m_block * BLOCK_M + gl.arange(0, BLOCK_M, layout=col_layout)
    q_pos = rows // GROUP_SIZE + n_k - N_Q
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, col_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, col_layout)
    o0 = gl.zeros([CHUNK, BLOCK_M], gl.float32, layout)
    o1 = gl.zeros([CHUNK, BLOCK_M], gl.float32, layout)
    o2 = gl.zeros([CHUNK, BLOCK_M], gl.float32, layout)
    o3 = gl.zeros([CHUNK, BLOCK_M], gl.float32, layout)
    gl.static_assert(N_CHUNKS == 4, "Oᵀ is four 128-channel accumulators (V head dim 512)")
    p_buf = p_smem.permute([1, 0])
    for t in range(n_tiles):
        s = t % NUM_STAGES
        mbarrier.wait(ready.index(s), (t // NUM_STAGES) & 1)
        st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout)
        for c in gl.static_range(N_CHUNKS):
            st = warpgroup_mma(lo_smem.index(s * N_CHUNKS + c).reshape([BLOCK_N, CHUNK]),
                               q_smem.index(c).permute([1, 0]), st, is_async=True)
        st = warpgroup_mma(hi_smem.index(s).reshape([BLOCK_N, HEAD_DIM_HI]), qhi_smem.permute([1, 0]), st,
                           is_async=True)
        st = warpgroup_mma_wait(0, deps=[st])
        key0 = start + t * BLOCK_N
        keys = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
        st = gl.where((keys < end)[:, None], st, float("-inf"))
        if HAS_RIGHT:
            st = gl.where(keys[:, None] <= (q_pos + window_right)[None, :], st, float("-inf"))
        if HAS_LEFT:
            st = gl.where(keys[:, None] >= (q_pos - window_left)[None, :], st, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(st, 0) * qk_scale)
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(st * qk_scale - m_ref[None, :])
        alpha = gl.exp2(m_i - m_ref)
        l_i = l_i * alpha + gl.sum(p, 0)
        m_i = m_new
        if key0 + BLOCK_N > n_k:
            _zero_rows_past(lo_smem, s, key0, n_k, BLOCK_N, N_CHUNKS)
        p_smem.store(gl.permute(p.to(p_smem.dtype), [1, 0]))
        fence_async_shared()
        gl.thread_barrier()
        a = alpha[None, :]
        o0 = warpgroup_mma(lo_smem.index(s * N_CHUNKS + 0).reshape([BLOCK_N, CHUNK]).permute([1, 0]), p_buf,
                           o0 * a, is_async=True)
        o1 = warpgroup_mma(lo_smem.index(s * N_CHUNKS + 1).reshape([BLOCK_N, CHUNK]).permute([1, 0]), p_buf,
                           o1 * a, is_async=True)
        o2 = warpgroup_mma(lo_smem.index(s * N_CHUNKS + 2).reshape([BLOCK_N, CHUNK]).permute([1, 0]), p_buf,
                           o2 * a, is_async=True)
        o3 = warpgroup_mma(lo_smem.index(s * N_CHUNKS + 3).reshape([BLOCK_N, CHUNK]).permute([1, 0]), p_buf,
                           o3 * a, is_async=True)
        o0, o1, o2, o3 = warpgroup_mma_wait(0, deps=[o0, o1, o2, o3])
        mbarrier.arrive(empty.index(s), count=1)

    # rows (or splits) that saw no key: output 0, lse -inf
    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    lse = gl.where(empty_row, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    row_ok = rows < GROUP_SIZE * N_Q
    off_h = off_hk * GROUP_SIZE + rows % GROUP_SIZE
    off_i = rows // GROUP_SIZE
    gl.store(LSE + off_b.to(gl.int64) * stride_lb + off_h.to(gl.int64) * stride_lh + off_i * stride_ln
             + split * stride_ls, lse, mask=row_ok)
    row_off = off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh + off_i * stride_on + split * stride_os
    inv = (1.0 / l_safe)[None, :]
    _store_chunk(O, o0 * inv, row_off, row_ok, 0, stride_od, BLOCK_M)
    _store_chunk(O, o1 * inv, row_off, row_ok, 1, stride_od, BLOCK_M)
    _store_chunk(O, o2 * inv, row_off, row_ok, 2, stride_od, BLOCK_M)
    _store_chunk(O, o3 * inv, row_off, row_ok, 3, stride_od, BLOCK_M)


@gluon.jit
def _decode_absorbed_hopper_kernel(
    lo_desc, hi_desc, Q, SEQLENS, BLOCK_TABLE, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_tb, stride_tn,
    stride_ob, stride_oh, stride_on, stride_os, stride_od,
    stride_lb, stride_lh, stride_ln, stride_ls,
    N_Q, N_NEW, N_KV_HEADS, GROUP_SIZE, CAPACITY, NUM_PAGES,
    qk_scale, window_left, window_right, lead_permille,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
    HEAD_DIM_V: gl.constexpr, HEAD_DIM_HI: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
):
    """Grid (kv heads x row blocks, batch, splits), as the portable partial
    kernel's.  ``lo_desc``: the cache's first HEAD_DIM_V channels (the values)
    with a (1, 1, BLOCK_N, 128) box; ``hi_desc``: its last HEAD_DIM_HI, a
    (1, 1, BLOCK_N, HEAD_DIM_HI) box; both indexed (batch or page, kv head,
    row, channel).  O / LSE: the output and lse (one split) or the partial
    outputs and their lse, with a split stride."""
    N_CHUNKS: gl.constexpr = HEAD_DIM_V // CHUNK
    off_hk = gl.program_id(0) % N_KV_HEADS
    m_block = gl.program_id(0) // N_KV_HEADS
    off_b = gl.program_id(1)
    split = gl.program_id(2)
    start, end, n_tiles, n_k = _split_range(SEQLENS, off_b, m_block, split, gl.num_programs(2), N_Q, N_NEW,
                                            GROUP_SIZE, CAPACITY, window_left, window_right, lead_permille,
                                            BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)

    dtype: gl.constexpr = lo_desc.dtype
    lo_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES * N_CHUNKS] + lo_desc.block_type.shape, lo_desc.layout)
    hi_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + hi_desc.block_type.shape, hi_desc.layout)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, CHUNK], dtype)
    qhi_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM_HI], dtype)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [N_CHUNKS, BLOCK_M, CHUNK], q_layout)
    qhi_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM_HI], qhi_layout)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], p_layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)

    gl.warp_specialize([
        (_softmax_partition, (lo_smem, hi_smem, q_smem, qhi_smem, p_smem, ready, empty, Q, O, LSE,
                              stride_qb, stride_qh, stride_qn, stride_qd,
                              stride_ob, stride_oh, stride_on, stride_os, stride_od,
                              stride_lb, stride_lh, stride_ln, stride_ls,
                              off_b, off_hk, m_block, split, start, end, n_tiles, n_k, N_Q, GROUP_SIZE,
                              qk_scale, window_left, window_right,
                              BLOCK_M, BLOCK_N, NUM_STAGES, HEAD_DIM_V, HEAD_DIM_HI, N_CHUNKS, HAS_LEFT, HAS_RIGHT)),
        (_load_partition, (lo_desc, hi_desc, lo_smem, hi_smem, ready, empty, BLOCK_TABLE, stride_tb, stride_tn,
                           NUM_PAGES, off_b, off_hk, start, n_tiles, BLOCK_N, NUM_STAGES, PAGE_SIZE, N_CHUNKS)),
    ], [1], [24])

    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
