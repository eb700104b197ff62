"""Pieces shared by the forward and backward kernels: tile loads and the
causal block bounds.  Pure ``@triton.jit`` code, no torch.

Causal masking is bottom-right aligned: query row ``i`` sees key ``j`` iff
``j <= i + (N_K - N_Q)``.  docs/design.md derives the block bounds below.
"""
import triton
import triton.language as tl


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
def load_rows(src, off_b, off_h, start, n_rows, stride_n, stride_d, BLOCK_R: tl.constexpr,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr,
              USE_TMA: tl.constexpr):
    """Rows [start, start + BLOCK_R) of one head, zero past the edges."""
    if USE_TMA:
        # the (1, 1, R, D) box is rank-reduced by the compiler: no data movement
        x = src.load([off_b, off_h, start, 0]).reshape([BLOCK_R, BLOCK_D])
    else:
        rows = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, BLOCK_D)
        ptrs = src + tl.cast(start, tl.int64) * stride_n + (rows[:, None] * stride_n + offs_d[None, :] * stride_d)
        x = load_tile(ptrs, start + rows < n_rows, offs_d < HEAD_DIM, CHECK_ROWS, HEAD_DIM != BLOCK_D)
    return x


@triton.jit
def store_rows(dst, off_b, off_h, start, x, n_rows, stride_n, stride_d, BLOCK_R: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """Store rows [start, start + BLOCK_R) of x into one head, clipped at the edges."""
    if USE_TMA:
        dst.store([off_b, off_h, start, 0], x.to(dst.dtype).reshape([1, 1, BLOCK_R, BLOCK_D]))
    else:
        rows = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, BLOCK_D)
        ptrs = dst + tl.cast(start, tl.int64) * stride_n + (rows[:, None] * stride_n + offs_d[None, :] * stride_d)
        store_tile(ptrs, x.to(dst.dtype.element_ty), start + rows < n_rows, offs_d < HEAD_DIM,
                   HEAD_DIM != BLOCK_D)


@triton.jit
def head_base(ptr, off_b, off_h, stride_b, stride_h):
    """Pointer to the (off_b, off_h) slice of a (B, H, N, D) tensor.  The
    offset is 64-bit: B*H*N*D may exceed 2**31 elements."""
    return ptr + off_b.to(tl.int64) * stride_b + off_h.to(tl.int64) * stride_h
