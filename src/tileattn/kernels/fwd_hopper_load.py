"""The Hopper forward's load side (Gluon; the kernel is ``fwd_hopper.py``):
the key tiles a query tile visits, the load warp that copies each query
tile's Q and its K/V tiles into the ring, a persistent program's walk of
its work units, and the coordinates of a program of the one-program-a-block
grids (this forward's and the backward kernels', plain or grouped by
``launch/grid_order.py``).

A persistent program takes every ``num_programs``-th unit, head-major.  A
unit is one query tile, or with ``IS_CAUSAL`` a head's k-th heaviest and
k-th lightest query tiles (one tile for the middle of an odd count), so that
every causal unit costs about the same number of key tiles: with one tile a
unit, a program whose units fell on the heavy end of the heads would run up
to twice the others' work (H200, d = 128, causal 16k: max/mean SM load 1.57,
-26 %; perf-notes v19).  The loader and every softmax warpgroup walk the
same sequence.

This module imports Gluon at load time: only the Hopper kernels import it.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def _grid_coords(N_ROWS, GROUPED: gl.constexpr):
    """(block, grid row, batch element, blocks) of this program in a
    one-program-a-block grid (the backward's key blocks, the forward's query
    tiles).  Plain: the grid is (blocks, ``N_ROWS`` rows, batch).
    ``GROUPED`` (causal; ``launch/grid_order.py``): it is (G, blocks, groups),
    so that in launch order the programs take the blocks of G (row, batch)
    pairs at a time; program (i, j, g) has pair g * G + i of the batch-major
    pairs.  (Plain coordinates are program ids: they cost the partitions no
    registers.)"""
    if GROUPED:
        pair = gl.program_id(2) * gl.num_programs(0) + gl.program_id(0)
        off_b = pair // N_ROWS
        coords = gl.program_id(1), pair - off_b * N_ROWS, off_b, gl.num_programs(1)
    else:
        coords = gl.program_id(0), gl.program_id(1), gl.program_id(2), gl.num_programs(0)
    return coords


@gluon.jit
def _sequence(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, N_Q, N_K, IS_VARLEN: gl.constexpr):
    """(batch coordinate of the descriptors, first query row, query rows,
    first key row, key rows) of grid batch index ``off_b``: packed sequences
    (``IS_VARLEN``: the (1, H, total, D) tensors, ``off_b`` a sequence) start
    at their cumulative lengths; a dense batch element at row 0 of its own."""
    if IS_VARLEN:
        q_base = gl.load(CU_SEQLENS_Q + off_b)
        k_base = gl.load(CU_SEQLENS_K + off_b)
        span = off_b * 0, q_base, gl.load(CU_SEQLENS_Q + off_b + 1) - q_base, k_base, \
            gl.load(CU_SEQLENS_K + off_b + 1) - k_base
    else:
        span = off_b, 0, N_Q, 0, N_K
    return span


@gluon.jit
def _key_tiles(start_m, N_Q, N_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(n_full, n_tiles) for the query tile at ``start_m``: key tiles
    [0, n_full) need no mask, [n_full, n_tiles) need the key-edge and/or
    causal mask, later ones are hidden from every row (bottom-right causal:
    row i sees key j iff j <= i + N_K - N_Q)."""
    n_even = N_K // BLOCK_N
    if IS_CAUSAL:
        diag = N_K - N_Q
        hi = gl.maximum(gl.minimum(start_m + BLOCK_M + diag, N_K), 0)
        first_row_end = gl.maximum(start_m + diag + 1, 0)
        n_full = gl.minimum(first_row_end // BLOCK_N, n_even)
    else:
        hi = N_K
        n_full = n_even
    n_tiles = (hi + BLOCK_N - 1) // BLOCK_N
    return n_full, n_tiles


@gluon.jit
def _window_tiles(start_m, N_Q, N_K, WIN_LEFT, WIN_RIGHT, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(lo, full_lo, full_end, hi) key tiles of the query rows [start_m,
    start_m + BLOCK_M) under a sliding window (``kernels.common.window_key_bounds``
    in tiles: row i sees keys [i + diag - WIN_LEFT, i + diag + WIN_RIGHT],
    both ends growing with i, so the first and last rows decide): tiles
    [full_lo, full_end) need no mask, [lo, full_lo) and [full_end, hi) the
    window's (and N_K's), none outside [lo, hi) is loaded."""
    diag = N_K - N_Q
    last = gl.minimum(start_m + BLOCK_M, N_Q) - 1
    lo = gl.minimum(gl.maximum(start_m + diag - WIN_LEFT, 0), N_K) // BLOCK_N
    hi = (gl.minimum(gl.maximum(last + diag + WIN_RIGHT + 1, 0), N_K) + BLOCK_N - 1) // BLOCK_N
    hi = gl.maximum(hi, lo)
    full_lo = (gl.maximum(last + diag - WIN_LEFT, 0) + BLOCK_N - 1) // BLOCK_N
    full_lo = gl.minimum(gl.maximum(full_lo, lo), hi)
    full_end = gl.minimum(gl.maximum(start_m + diag + WIN_RIGHT + 1, 0) // BLOCK_N, N_K // BLOCK_N)
    full_end = gl.minimum(gl.maximum(full_end, full_lo), hi)
    return lo, full_lo, full_end, hi


@gluon.jit
def _tile_range(start_m, N_Q, N_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                WIN_LEFT=None, WIN_RIGHT=None):
    """(first key tile, key tiles) a query tile of BLOCK_M rows from
    ``start_m`` runs: from 0 (:func:`_key_tiles`), or under a sliding window
    (``WIN_LEFT`` not None) the window's [lo, hi) (:func:`_window_tiles`)."""
    if WIN_LEFT is None:
        _, n_tiles = _key_tiles(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
        j0 = 0
    else:
        j0, _, _, hi = _window_tiles(start_m, N_Q, N_K, WIN_LEFT, WIN_RIGHT, BLOCK_M, BLOCK_N)
        n_tiles = hi - j0
    return j0, n_tiles


@gluon.jit
def _edge_descriptor(desc, X, stride_h, stride_n, head, rows_end):
    """A descriptor like ``desc`` over the tensor at ``X`` (row and head
    strides ``stride_n``, ``stride_h``) whose rows end at ``rows_end`` and
    heads after ``head``: made on the device, so that a packed sequence's
    last tile reads zeros past the sequence (``desc`` would read the next
    sequence's rows, whose NaN or infinity a zero weight does not cancel)."""
    return tma.make_tensor_descriptor(X, [1, head + 1, rows_end, desc.block_type.shape[3]],
                                      [stride_n, stride_h, stride_n, 1], desc.block_type.shape, desc.layout)


@gluon.jit
def _load_rows(desc, tail_desc, coords, bar, smem, tail_smem, TAIL_DIM: gl.constexpr):
    """One tile of Q or K: its first HEAD_DIM - TAIL_DIM columns through
    ``desc`` and, with a tail, the last TAIL_DIM through ``tail_desc`` (a
    copy box is a power of two wide), both completing ``bar``."""
    if TAIL_DIM > 0:
        mbarrier.expect(bar, desc.block_type.nbytes + tail_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, coords, bar, smem)
        tma.async_copy_global_to_shared(tail_desc, coords, bar, tail_smem)
    else:
        mbarrier.expect(bar, desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, coords, bar, smem)


@gluon.jit
def _unit_size(unit, N_M_TILES, IS_CAUSAL: gl.constexpr):
    """(batch x head index, k, tiles) of a persistent program's work unit:
    head-major, the heaviest causal tiles first; causal units hold tiles
    N_M_TILES - 1 - k and k (one where those are the same)."""
    if IS_CAUSAL:
        per_head = (N_M_TILES + 1) // 2
        bh = unit // per_head
        k = unit - bh * per_head
        return bh, k, gl.where(2 * k + 1 == N_M_TILES, 1, 2)
    else:
        bh = unit // N_M_TILES
        return bh, unit - bh * N_M_TILES, unit * 0 + 1


@gluon.jit
def _n_work(TOTAL, STREAM_K: gl.constexpr):
    """How many works a persistent program walks: its units ``program_id``,
    + ``num_programs``, ... below ``TOTAL``, and with ``STREAM_K`` three
    pieces of the tail after them (:func:`_work`; an empty one is skipped)."""
    pid = gl.program_id(0)
    n = (TOTAL - pid + gl.num_programs(0) - 1) // gl.num_programs(0)
    if STREAM_K:
        n += 3
    return n


@gluon.jit
def _work(w, TOTAL, SK_TILES, N_K, BLOCK_N: gl.constexpr, STREAM_K: gl.constexpr):
    """(unit, j0, n, slot): a persistent program's ``w``-th work.  Its
    whole units first (key tiles from j0 = 0, n = -1: all of them, slot -1).
    ``STREAM_K`` (non-causal): the units from ``TOTAL`` on are the tail (the
    last partial wave and one whole wave before it: ``launch/stream_k.py``),
    their ``SK_TILES`` key tiles (T = cdiv(N_K, BLOCK_N) a unit, in unit
    order) cut into one contiguous range a program, program p's
    [p S / P, (p + 1) S / P) of S = SK_TILES over P programs: between T and
    2 T tiles, so it meets at most three units and a unit at most two
    ranges.  Works k = 0, 1, 2 after the whole units are the range's pieces:
    unit TOTAL + i (i = lo // T + k), tiles [j0, j0 + n) of it; a piece
    short of its unit keeps its partial softmax in workspace slot 3 p + k
    for the combine (``kernels/stream_k.py``), a whole one (slot -1) ends as
    any unit; n = 0: no such piece."""
    pid = gl.program_id(0)
    n_units = (TOTAL - pid + gl.num_programs(0) - 1) // gl.num_programs(0)
    unit = pid + w * gl.num_programs(0)
    if STREAM_K:
        T = (N_K + BLOCK_N - 1) // BLOCK_N
        lo = pid * SK_TILES // gl.num_programs(0)
        hi = (pid + 1) * SK_TILES // gl.num_programs(0)
        k = w - n_units
        i = lo // T + k
        start = gl.maximum(lo, i * T)
        n = gl.maximum(gl.minimum(hi, (i + 1) * T) - start, 0)
        tail = k >= 0
        return (gl.where(tail, TOTAL + i, unit), gl.where(tail, start - i * T, 0), gl.where(tail, n, -1),
                gl.where(tail & (n < T), 3 * pid + k, -1))
    else:
        return unit, 0, -1, -1


@gluon.jit
def _unit_tile(bh, k, half, N_M_TILES, N_HEADS, N_Q, N_K, TILE_M: gl.constexpr, BLOCK_N: gl.constexpr,
               IS_CAUSAL: gl.constexpr, WIN_LEFT=None, WIN_RIGHT=None):
    """(off_b, off_h, start_m, key tiles, first key tile) of tile ``half``
    of a unit (``_unit_size``) of ``TILE_M``-row query tiles: the one step of the walk the loader and the
    softmax warpgroups share.  The first key tile is 0 but under a sliding
    window (``WIN_LEFT`` not None: :func:`_window_tiles`)."""
    start_m = gl.where(half == 0, N_M_TILES - 1 - k, k) * TILE_M
    j0, n_tiles = _tile_range(start_m, N_Q, N_K, TILE_M, BLOCK_N, IS_CAUSAL, WIN_LEFT, WIN_RIGHT)
    return bh // N_HEADS, bh % N_HEADS, start_m, n_tiles, j0


@gluon.jit
def _load_tile(q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars,
               k_ready, v_ready, k_empty, v_empty, off_b, off_h, off_hk, start_m, n_tiles, qb, kc,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, TAIL_DIM: gl.constexpr,
               j0=0, q_base=0, k_base=0, V=None, stride_vh=0, stride_vn=0, N_K=0, NUM_WG: gl.constexpr = 2):
    """One query tile's copies: its NUM_WG Q tiles (one of BLOCK_M rows per
    softmax warpgroup) into Q buffers NUM_WG qb, +1, ..., then its key and
    value tiles j0, ..., j0 + n_tiles - 1 into the ring, whose count is at
    ``kc``; a packed sequence's rows from ``q_base`` / ``k_base``
    (:func:`_sequence`), its last value tile through a descriptor that ends
    with it (``V`` not None: :func:`_edge_descriptor`; keys past it are
    masked, but a value row meets its zero weight in the P V product)."""
    for wg in gl.static_range(NUM_WG):
        qi = NUM_WG * qb + wg
        _load_rows(q_desc, qt_desc, [off_b, off_h, q_base + start_m + wg * BLOCK_M, 0], q_bars.index(qi),
                   q_smem.index(qi), qt_smem.index(qi), TAIL_DIM)
    for j in range(n_tiles):
        s = (kc + j) % NUM_STAGES
        # a slot starts empty: the first wait on each passes (phase 1)
        phase = (((kc + j) // NUM_STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(s), phase)
        _load_rows(k_desc, kt_desc, [off_b, off_hk, k_base + (j0 + j) * BLOCK_N, 0], k_ready.index(s),
                   k_smem.index(s), kt_smem.index(s), TAIL_DIM)
        mbarrier.wait(v_empty.index(s), phase)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        v_coords = [off_b, off_hk, k_base + (j0 + j) * BLOCK_N, 0]
        if V is None:
            tma.async_copy_global_to_shared(v_desc, v_coords, v_ready.index(s), v_smem.index(s))
        elif (j0 + j + 1) * BLOCK_N > N_K:
            v_edge = _edge_descriptor(v_desc, V, stride_vh, stride_vn, off_hk, k_base + N_K)
            tma.async_copy_global_to_shared(v_edge, v_coords, v_ready.index(s), v_smem.index(s))
        else:
            tma.async_copy_global_to_shared(v_desc, v_coords, v_ready.index(s), v_smem.index(s))


@gluon.jit
def _load_unit(q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready,
               v_ready, k_empty, v_empty, q_empty, unit, j0, n_sk, kc, it, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, TAIL_DIM: gl.constexpr, GROUP_SIZE, N_Q, N_K,
               N_M_TILES, N_HEADS, IS_CAUSAL: gl.constexpr, WIN_LEFT=None, WIN_RIGHT=None,
               NUM_WG: gl.constexpr = 2):
    """A persistent program's copies for one work (:func:`_work`: key tiles
    [j0, j0 + n_sk) of the unit, all of them where n_sk < 0; a sliding
    window's from :func:`_unit_tile`), each query tile's Q into the set of
    buffers ``it % 2`` once every warpgroup released its own; returns the
    ring's and the items' counts after it."""
    bh, k, n_half = _unit_size(unit, N_M_TILES, IS_CAUSAL)
    for half in range(n_half):
        t_b, t_h, t_m, t_n, t_j0 = _unit_tile(bh, k, half, N_M_TILES, N_HEADS, N_Q, N_K, NUM_WG * BLOCK_M, BLOCK_N,
                                              IS_CAUSAL, WIN_LEFT, WIN_RIGHT)
        t_n = gl.where(n_sk >= 0, n_sk, t_n)
        if WIN_LEFT is None:
            t_first = j0
        else:
            t_first = t_j0
        qb = it % 2
        for wg in gl.static_range(NUM_WG):   # a set of buffers starts empty: the first wait passes
            mbarrier.wait(q_empty.index(NUM_WG * qb + wg), ((it // 2) & 1) ^ 1)
        _load_tile(q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem, kt_smem,
                   q_bars, k_ready, v_ready, k_empty, v_empty, t_b, t_h, t_h // GROUP_SIZE, t_m, t_n, qb, kc,
                   BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_DIM, t_first, NUM_WG=NUM_WG)
        kc += t_n
        it += 1
    return kc, it


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars,
                    k_ready, v_ready, k_empty, v_empty, turns, off_b, off_h, off_hk, start_m, n_tiles,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, TAIL_DIM: gl.constexpr,
                    q_empty, GROUP_SIZE, N_Q, N_K, N_M_TILES, N_HEADS, TOTAL, IS_CAUSAL: gl.constexpr,
                    PERSISTENT: gl.constexpr, SK_TILES=0, STREAM_K: gl.constexpr = False, j0=0, WIN_LEFT=None,
                    WIN_RIGHT=None, q_base=0, k_base=0, V=None, stride_vh=0, stride_vn=0, NUM_WG: gl.constexpr = 2):
    """The load warp: the program's query tile (its key tiles from ``j0``,
    a packed sequence's rows from ``q_base`` / ``k_base``),
    or with ``PERSISTENT`` each of its works in turn (:func:`_work`), the
    next one's Q into the other set of Q buffers once every warpgroup
    released its own (``q_empty``), its K and V tiles into the ring behind the
    previous item's."""
    if PERSISTENT:
        kc = gl.program_id(0) * 0
        it = kc
        if STREAM_K:
            for w in range(_n_work(TOTAL, STREAM_K)):
                unit, j0, n_sk, _ = _work(w, TOTAL, SK_TILES, N_K, BLOCK_N, STREAM_K)
                if n_sk != 0:
                    kc, it = _load_unit(q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem,
                                        kt_smem, q_bars, k_ready, v_ready, k_empty, v_empty, q_empty, unit, j0, n_sk,
                                        kc, it, BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_DIM, GROUP_SIZE, N_Q, N_K,
                                        N_M_TILES, N_HEADS, IS_CAUSAL, NUM_WG=NUM_WG)
        else:
            for unit in range(gl.program_id(0), TOTAL, gl.num_programs(0)):
                kc, it = _load_unit(q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem,
                                    kt_smem, q_bars, k_ready, v_ready, k_empty, v_empty, q_empty, unit, 0, -1, kc, it,
                                    BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_DIM, GROUP_SIZE, N_Q, N_K, N_M_TILES,
                                    N_HEADS, IS_CAUSAL, WIN_LEFT, WIN_RIGHT, NUM_WG)
    else:
        _load_tile(q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars,
                   k_ready, v_ready, k_empty, v_empty, off_b, off_h, off_hk, start_m, n_tiles, 0, 0,
                   BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_DIM, j0, q_base, k_base, V, stride_vh, stride_vn, N_K, NUM_WG)
