"""Pieces shared by the forward and backward kernels: tile loads, the
causal and sliding-window block bounds, and the score variants (softcap,
ALiBi).  Pure ``@triton.jit`` code, no torch.

Causal masking is bottom-right aligned: query row ``i`` sees key ``j`` iff
``j <= i + (N_K - N_Q)``.  A sliding window ``(left, right)`` keeps
``i + N_K - N_Q - left <= j <= i + N_K - N_Q + right`` (the launcher folds
causal into ``right = 0`` and gives unbounded sides a bound past the
sequence).  docs/design.md derives the causal block bounds; docs/variants.md
the window ones.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def load_tile(ptrs, row_ok, d_ok, CHECK_ROWS: tl.constexpr, CHECK_D: tl.constexpr):
    """Load a (rows, BLOCK_D) tile, masking only what the constexprs ask for, so
    that interior tiles of an aligned head dim issue plain unmasked loads."""
    if CHECK_ROWS:
        if CHECK_D:
            x = tl.load(ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    else:
        if CHECK_D:
            x = tl.load(ptrs, mask=d_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def store_tile(ptrs, x, row_ok, d_ok, CHECK_D: tl.constexpr):
    if CHECK_D:
        tl.store(ptrs, x, mask=row_ok[:, None] & d_ok[None, :])
    else:
        tl.store(ptrs, x, mask=row_ok[:, None])


@triton.jit
def causal_key_bounds(start_m, N_Q, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      IS_CAUSAL: tl.constexpr):
    """For the query block starting at ``start_m``: (full_end, hi).

    Key tiles [0, full_end) are visible to every row of the block and inside
    N_K: they need no mask.  Tiles [full_end, hi) need the causal and/or the
    N_K boundary mask.  Tiles at or beyond ``hi`` are hidden from every row
    and are never loaded.
    """
    n_even_end = (N_K // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        diag = N_K - N_Q
        # last key the last row of the block may see, plus one
        hi = tl.minimum(start_m + BLOCK_M + diag, N_K)
        hi = tl.maximum(hi, 0)
        # first row sees keys < start_m + diag + 1: whole tiles below that need no mask
        first_row_end = tl.maximum(start_m + diag + 1, 0)
        full_end = tl.minimum((first_row_end // BLOCK_N) * BLOCK_N, n_even_end)
        full_end = tl.minimum(full_end, hi)
    else:
        hi = N_K
        full_end = n_even_end
    return full_end, hi


@triton.jit
def causal_query_bounds(start_n, N_Q, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        IS_CAUSAL: tl.constexpr):
    """For the key block starting at ``start_n``: (lo, full_start).

    Query tiles [lo, full_start) see part of the key block (causal mask needed),
    tiles [full_start, N_Q) see all of it, tiles before ``lo`` see none of it.
    """
    if IS_CAUSAL:
        diag = N_K - N_Q
        # first row that sees key start_n: i >= start_n - diag
        lo = tl.maximum(start_n - diag, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
        # first row that sees the whole key block: i >= start_n + BLOCK_N - 1 - diag
        full = tl.maximum(start_n + BLOCK_N - 1 - diag, 0)
        full_start = ((full + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
        full_start = tl.maximum(tl.minimum(full_start, N_Q), lo)
    else:
        lo = 0
        full_start = 0
    return lo, full_start


@triton.jit
def tile_source(arg, off_b, off_h, stride_b, stride_h, USE_TMA: tl.constexpr):
    """Where the tiles of the (off_b, off_h) head of a (B, H, N, D) tensor come
    from.  With ``USE_TMA`` the kernel argument is a host-built tensor
    descriptor over the whole 4-D tensor (the Hopper copy engine moves whole
    tiles, zero-fills rows/columns past the edge of each head, and no thread
    holds addresses or builds descriptors); it is returned as is and indexed
    with (off_b, off_h) at each load.  Otherwise the argument is the tensor's
    base pointer and the head's base pointer is returned."""
    if USE_TMA:
        src = arg
    else:
        src = head_base(arg, off_b, off_h, stride_b, stride_h)
    return src


@triton.jit
def load_rows(head, start, end, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              CHECK_ROWS: tl.constexpr, USE_TMA: tl.constexpr, PACKED: tl.constexpr = False):
    """Rows [start, start + BLOCK_R) of one head, zero past the edges.
    ``head`` is (tile source, batch index, head index, stride_n, stride_d):
    the tile source is a tensor descriptor with ``USE_TMA`` (see
    :func:`tile_source`), else the head's base pointer.  ``end`` is the
    first row past the data (with ``CHECK_ROWS``).  ``PACKED``: rows of a
    packed (1, H, total, D) tensor; a tensor descriptor would return the
    next sequence's rows from ``end`` on, and a NaN or inf in another
    sequence must not reach this one (0 * NaN in a matmul), so they are
    zeroed."""
    src, off_b, off_h, stride_n, stride_d = head
    if USE_TMA:
        # the (1, 1, R, D) box is rank-reduced by the compiler: no data movement
        x = src.load([off_b, off_h, start, 0]).reshape([BLOCK_R, BLOCK_D])
        if PACKED and CHECK_ROWS:
            rows = start + tl.arange(0, BLOCK_R)
            x = tl.where((rows < end)[:, None], x, tl.zeros_like(x))
    else:
        rows = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, BLOCK_D)
        ptrs = src + tl.cast(start, tl.int64) * stride_n + (rows[:, None] * stride_n + offs_d[None, :] * stride_d)
        x = load_tile(ptrs, start + rows < end, offs_d < HEAD_DIM, CHECK_ROWS, HEAD_DIM != BLOCK_D)
    return x


@triton.jit
def store_rows(head, start, x, end, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               USE_TMA: tl.constexpr):
    """Store rows [start, start + BLOCK_R) of x into one head (``head`` as in
    :func:`load_rows`), clipped at the edges (rows from ``end`` on are
    never written)."""
    dst, off_b, off_h, stride_n, stride_d = head
    if USE_TMA:
        dst.store([off_b, off_h, start, 0], x.to(dst.dtype).reshape([1, 1, BLOCK_R, BLOCK_D]))
    else:
        rows = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, BLOCK_D)
        ptrs = dst + tl.cast(start, tl.int64) * stride_n + (rows[:, None] * stride_n + offs_d[None, :] * stride_d)
        store_tile(ptrs, x.to(dst.dtype.element_ty), start + rows < end, offs_d < HEAD_DIM,
                   HEAD_DIM != BLOCK_D)


@triton.jit
def add_rows(head, start, x, end, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             USE_TMA: tl.constexpr):
    """Atomically add x into rows [start, start + BLOCK_R) of one head of a
    float32 tensor (``head`` as in :func:`load_rows`), clipped at the edges
    (rows from ``end`` on are never touched).  With ``USE_TMA`` the tile
    source is a tensor descriptor and the add is one bulk reduce of the copy
    engine, clipped at the tensor's edges only."""
    dst, off_b, off_h, stride_n, stride_d = head
    if USE_TMA:
        dst.atomic_add([off_b, off_h, start, 0], x.reshape([1, 1, BLOCK_R, BLOCK_D]))
    else:
        rows = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, BLOCK_D)
        ptrs = dst + tl.cast(start, tl.int64) * stride_n + (rows[:, None] * stride_n + offs_d[None, :] * stride_d)
        ok = (start + rows < end)[:, None]
        if HEAD_DIM != BLOCK_D:
            ok = ok & (offs_d < HEAD_DIM)[None, :]
        tl.atomic_add(ptrs, x, mask=ok, sem="relaxed")


@triton.jit
def head_base(ptr, off_b, off_h, stride_b, stride_h):
    """Pointer to the (off_b, off_h) slice of a (B, H, N, D) tensor.  The
    offset is 64-bit: B*H*N*D may exceed 2**31 elements."""
    return ptr + off_b.to(tl.int64) * stride_b + off_h.to(tl.int64) * stride_h


@triton.jit
def window_key_bounds(start_m, N_Q, N_K, win_left, win_right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the query block starting at ``start_m`` under a sliding window:
    (lo, full_lo, full_end, hi).

    Key tiles [full_lo, full_end) lie inside the window of every row of the
    block and inside N_K: no mask.  Tiles [lo, full_lo) and [full_end, hi)
    need the window (and N_K) mask.  Tiles outside [lo, hi) are hidden from
    every row and never loaded.  Row i sees keys [i + diag - left, i + diag +
    right]: both ends grow with i, so the block's first and last rows decide.
    """
    diag = N_K - N_Q
    last = tl.minimum(start_m + BLOCK_M, N_Q) - 1
    hi = tl.minimum(tl.maximum(last + diag + win_right + 1, 0), N_K)
    lo = tl.minimum(tl.maximum(start_m + diag - win_left, 0), N_K)
    lo = (lo // BLOCK_N) * BLOCK_N
    # every row's window starts at or before the last row's start
    full_lo = tl.maximum(last + diag - win_left, 0)
    full_lo = ((full_lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    # ... and ends at or after the first row's end
    full_end = (tl.maximum(start_m + diag + win_right + 1, 0) // BLOCK_N) * BLOCK_N
    full_end = tl.minimum(full_end, (N_K // BLOCK_N) * BLOCK_N)
    full_end = tl.minimum(tl.maximum(full_end, full_lo), hi)
    return lo, full_lo, full_end, hi


@triton.jit
def window_query_bounds(start_n, N_Q, N_K, win_left, win_right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the key block starting at ``start_n`` under a sliding window:
    (lo, full_lo, full_end, hi) over query rows, as :func:`window_key_bounds`
    (key j is seen by rows [j - diag - right, j - diag + left]).  Rows past
    N_Q need no mask (their lse is +inf, so P = 0)."""
    diag = N_K - N_Q
    last_n = tl.minimum(start_n + BLOCK_N, N_K) - 1
    lo = tl.minimum(tl.maximum(start_n - diag - win_right, 0), N_Q)
    lo = (lo // BLOCK_M) * BLOCK_M
    hi = tl.minimum(tl.maximum(last_n - diag + win_left + 1, 0), N_Q)
    full_lo = tl.maximum(last_n - diag - win_right, 0)
    full_lo = ((full_lo + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_end = (tl.maximum(start_n - diag + win_left + 1, 0) // BLOCK_M) * BLOCK_M
    full_end = tl.minimum(tl.maximum(full_end, full_lo), hi)
    return lo, full_lo, full_end, hi


@triton.jit
def pair_visible(rows, cols, diag, win_left, win_right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr = True):
    """Pairs (query row i, key j) that the mask leaves visible, aligned
    bottom-right (row i's diagonal key is i + diag, ``diag = N_K - N_Q``):
    j >= i + diag - win_left with ``HAS_LEFT``, j <= i + diag + win_right
    with ``HAS_RIGHT`` (``win_right`` None: the causal bound, right = 0);
    at least one of the two.  Broadcastable index tiles in, a boolean tile
    out.  The one definition of the mask for the forward, dK/dV, dQ and
    decoding kernels (the training kernels: ``HAS_LEFT`` = a sliding
    window, else causal)."""
    pos = rows + diag
    if HAS_LEFT and HAS_RIGHT:
        rel = cols - pos
        visible = (rel >= -win_left) & (rel <= win_right)
    elif HAS_LEFT:
        visible = cols >= pos - win_left
    elif win_right is None:
        visible = cols <= pos
    else:
        visible = cols <= pos + win_right
    return visible


@triton.jit
def mask_keys(x, fill, rows, cols, N_Q, N_K, win_left, win_right, IS_CAUSAL: tl.constexpr,
              HAS_WINDOW: tl.constexpr):
    """A masked stage's (query rows ``rows``, key columns ``cols``) tile x
    of the forward and dQ kernels, ``fill`` where the key is past N_K or
    hidden by the causal / window mask (:func:`pair_visible`)."""
    visible = (cols < N_K)[None, :]
    if HAS_WINDOW or IS_CAUSAL:
        visible = visible & pair_visible(rows[:, None], cols[None, :], N_K - N_Q, win_left, win_right,
                                         HAS_LEFT=HAS_WINDOW)
    return tl.where(visible, x, fill)


@triton.jit
def sequence_span(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, N_Q, N_K, IS_VARLEN: tl.constexpr):
    """Where batch element ``off_b`` lies: (batch index into the tensors,
    first query row, query count, first key row, key count).  Packed
    sequences (``IS_VARLEN``) are the (1, H, total, D) views with rows
    offset by the cumulative lengths; the dense case is the same with batch
    ``off_b``, offsets 0 and lengths N_Q, N_K."""
    if IS_VARLEN:
        q_row0 = tl.load(CU_SEQLENS_Q + off_b)
        n_q = tl.load(CU_SEQLENS_Q + off_b + 1) - q_row0
        k_row0 = tl.load(CU_SEQLENS_K + off_b)
        n_k = tl.load(CU_SEQLENS_K + off_b + 1) - k_row0
        return tl.zeros_like(off_b), q_row0, n_q, k_row0, n_k
    else:
        return off_b, 0, N_Q, 0, N_K


@triton.jit
def query_block_program(CU_SEQLENS_Q, CU_SEQLENS_K, N_Q, N_K, GROUP_SIZE, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Which query block a program of the forward or dQ grid (query block,
    head, batch) owns: (start_m, its rows offs_m, the key-tile columns
    offs_n, off_h, off_hk, off_b), then the batch element's
    :func:`sequence_span`.  The heaviest causal blocks (last rows) go
    first: better tail balance."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    off_hk = off_h // GROUP_SIZE
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    t_b, q_row0, n_q, k_row0, n_k = sequence_span(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, N_Q, N_K, IS_VARLEN)
    return start_m, offs_m, offs_n, off_h, off_hk, off_b, t_b, q_row0, n_q, k_row0, n_k


# A program walks its tiles in three stages: a masked head, an unmasked body
# and a masked tail.  The stage helpers return the three (lo, hi) ranges (or
# (lo, hi, block list) with a block-sparse layout); which stages exist is a
# constexpr tuple decided by the kernel, and a stage that does not exist is
# never compiled (its range is a placeholder).
STAGE_MASKED = tl.constexpr((True, False, True))


@triton.jit
def key_stages(start_m, n_q, n_k, win_left, win_right, layout, off_b, off_h, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
               BLOCK_SPARSE: tl.constexpr, MASK_BLOCK_Q: tl.constexpr, MASK_BLOCK_K: tl.constexpr,
               COUNTS_FIRST: tl.constexpr = False):
    """The key-tile stages of the query block at ``start_m``, the one key
    walk of the forward and dQ kernels: the window's left edge (no head
    without a window), the tiles every row sees whole, the diagonal /
    window's right edge / N_K edge; with BLOCK_SPARSE the block lists of the
    query block's row of the layout (``layout``: the kernels' block-sparse
    arguments, counts, lists and strides, in their order; ``COUNTS_FIRST``:
    see :func:`sparse_stages`)."""
    if BLOCK_SPARSE:
        FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, s_nb, s_nh, s_ib, s_ih, s_ir = layout
        stages = sparse_stages(FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, (s_nb, s_nh, s_ib, s_ih, s_ir), off_b, off_h,
                               start_m // MASK_BLOCK_Q, MASK_BLOCK_K // BLOCK_N, COUNTS_FIRST)
    else:
        if HAS_WINDOW:
            lo, full_lo, full_end, hi = window_key_bounds(start_m, n_q, n_k, win_left, win_right, BLOCK_M, BLOCK_N)
        else:
            lo = 0
            full_lo = 0
            full_end, hi = causal_key_bounds(start_m, n_q, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        stages = (lo, full_lo), (full_lo, full_end), (full_end, hi)
    return stages


@triton.jit
def query_stages(start_n, n_q, n_k, win_left, win_right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, IS_VARLEN: tl.constexpr):
    """The query-tile stages of the key block at ``start_n`` (dK/dV): the
    causal diagonal / window's lower edge, the rows that see the whole key
    block, the window's upper edge / a packed sequence's last, partial tile
    (whose masked loads zero the rows past the sequence)."""
    if HAS_WINDOW:
        lo, full_start, full_end, hi = window_query_bounds(start_n, n_q, n_k, win_left, win_right, BLOCK_M,
                                                           BLOCK_N)
    else:
        lo, full_start = causal_query_bounds(start_n, n_q, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        full_end = n_q
        hi = n_q
    if IS_VARLEN:
        full_end = tl.maximum(tl.minimum(full_end, (n_q // BLOCK_M) * BLOCK_M), full_start)
    return (lo, full_start), (full_start, full_end), (full_end, hi)


@triton.jit
def sparse_stages(FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, strides, off_b, off_h, line,
                  TILES_PER_BLOCK: tl.constexpr, COUNTS_FIRST: tl.constexpr = False):
    """The stages of a block-sparse walk along ``line`` (a row of the layout
    for the forward and dQ, a column for dK/dV): no head, the full blocks
    (unmasked), the partial ones (masked), as (0, tile count, list, offset
    into the lists); each listed block holds TILES_PER_BLOCK tiles.  With
    ``COUNTS_FIRST`` (the forward) both tile counts are read here, before
    the walk; otherwise a stage holds (count array, offset) and
    :func:`stage_walk` reads its count where the stage starts.
    ``strides``: those of the count arrays (b, h) and of the lists (b, h,
    line)."""
    stride_nb, stride_nh, stride_ib, stride_ih, stride_ir = strides
    nb = off_b * stride_nb + off_h * stride_nh + line
    ib = off_b.to(tl.int64) * stride_ib + off_h * stride_ih + line * stride_ir
    if COUNTS_FIRST:
        n_full = tl.load(FULL_NUM + nb) * TILES_PER_BLOCK
        n_part = tl.load(PART_NUM + nb) * TILES_PER_BLOCK
    else:
        n_full = (FULL_NUM, nb)
        n_part = (PART_NUM, nb)
    return (0, 0, FULL_IDX, ib), (0, n_full, FULL_IDX, ib), (0, n_part, PART_IDX, ib)


@triton.jit
def stage_walk(stage, TILES_PER_BLOCK: tl.constexpr, BLOCK_SPARSE: tl.constexpr,
               COUNTS_FIRST: tl.constexpr = False):
    """(lo, hi, block list) of a stage: its range (the list a placeholder,
    unused), or with BLOCK_SPARSE the entries [0, tile count) of its block
    list (count and list as :func:`sparse_stages` left them: read and formed
    here, where the stage starts, unless ``COUNTS_FIRST`` read the count
    already)."""
    if BLOCK_SPARSE:
        if COUNTS_FIRST:
            hi = stage[1]
        else:
            counts, nb = stage[1]
            hi = tl.load(counts + nb) * TILES_PER_BLOCK
        blocks = stage[2] + stage[3]
    else:
        hi = stage[1]
        blocks = stage[0]
    return stage[0], hi, blocks


@triton.jit
def stage_tile_start(it, blocks, BLOCK: tl.constexpr, MASK_BLOCK: tl.constexpr, BLOCK_SPARSE: tl.constexpr):
    """First row of the tile of step ``it`` of a stage: ``it`` itself on a
    range (the loop steps by BLOCK), else the ``it``-th sub-tile of the
    stage's block list ``blocks`` (the loop steps by 1)."""
    if BLOCK_SPARSE:
        sub = it % (MASK_BLOCK // BLOCK)
        start = tl.load(blocks + it // (MASK_BLOCK // BLOCK)) * MASK_BLOCK + sub * BLOCK
    else:
        start = it
    return start


@triton.jit
def alibi_slope_log2(ALIBI, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI: tl.constexpr):
    """The ALiBi slope of (batch, query head) in log2 units (0 without ALiBi)."""
    if HAS_ALIBI:
        return tl.load(ALIBI + off_b * stride_ab + off_h * stride_ah) * LOG2E
    else:
        return 0.0


@triton.jit
def online_softmax_step(s, m_i, l_i, MASKED: tl.constexpr):
    """One key tile of the running softmax, in log2 units: the new row max,
    the tile's probabilities ``p`` against it, the factor ``alpha`` that
    rescales what was accumulated against the old max, and the new row sum.
    With ``MASKED`` a row that has seen no visible key keeps max -inf and
    subtracts 0 instead, so exp2 gives 0, not NaN.  Returns (p, alpha, l_i,
    m_new); the caller rescales its accumulator by ``alpha``.  Shared by the
    forward and the decoding kernels."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    p = tl.math.exp2(s - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new


@triton.jit
def accumulate(acc, p, alpha, v, DOT_PRECISION: tl.constexpr):
    """acc * alpha + P V: the output accumulator after one key tile of the
    running softmax (:func:`online_softmax_step`)."""
    acc = acc * alpha[:, None]
    return tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)


@triton.jit
def tanh(x):
    """tanh in float32 from exp2 (no libdevice: the same code runs under the
    interpreter).  (1 - e) / (1 + e) with e = exp(-2|x|) loses relative
    accuracy as |x| -> 0; there an odd Taylor series to x^9 is exact to
    float32 rounding (error < 1e-8 at |x| = 0.25)."""
    ax = tl.abs(x)
    e = tl.math.exp2(-2.8853900817779268 * ax)   # exp(-2|x|)
    big = (1.0 - e) / (1.0 + e)
    x2 = ax * ax
    small = ax * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
        -0.05396825396825397 + x2 * 0.021869488536155203))))
    t = tl.where(ax < 0.25, small, big)
    return tl.where(x < 0, -t, t)


@triton.jit
def scores(qk, rows, cols, diag, qk_scale, softcap_scale, softcap_log2, alibi_log2,
           HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Scores in log2 units of a tile of q.k products, with the variants:
    softcap c * tanh(scale * qk / c) (``softcap_scale = scale / c``,
    ``softcap_log2 = c * log2(e)``), then the ALiBi bias -slope * |i + diag - j|
    (``alibi_log2 = slope * log2(e)``; ``rows``/``cols`` broadcastable query
    and key index tiles).  Returns (s, t) with t = tanh(...) for the softcap's
    derivative 1 - t^2 (t = qk, unused, without softcap)."""
    if HAS_SOFTCAP:
        t = tanh(qk * softcap_scale)
        s = t * softcap_log2
    else:
        t = qk
        s = qk * qk_scale
    if HAS_ALIBI:
        s = s - alibi_log2 * tl.abs(rows + diag - cols).to(tl.float32)
    return s, t
