"""The fix-up of a persistent backward's split tail (``bwd_hopper_persistent.py``
with ``SPLIT_TAIL``): the work items from ``MAIN`` on, each a key block of
``KEYS`` keys whose query tiles were cut into pieces, left their partial
dK (already scaled) and dV added into float32 workspace slots; this kernel
rounds each item's slot into its rows of dK and dV (keys past N_K dropped).

Items are the persistent walk's (non-causal): item i is key block
i % N_BLOCKS of kv head (i // N_BLOCKS) % N_ROWS of batch element
i // (N_BLOCKS N_ROWS); workspace slot t holds item MAIN + t, dK in
``WS[t]`` and dV in ``WS[TAIL + t]`` (``TAIL`` items, KEYS x HEAD_DIM each).

Pure ``@triton.jit`` code, no torch: it runs under the interpreter too.
"""
import triton
import triton.language as tl


@triton.jit
def _bwd_tail_kernel(WS, DK, DV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                     MAIN, TAIL, N_BLOCKS, N_ROWS, N_K, KEYS: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """Program t: workspace slot t (item MAIN + t) into dK and dV."""
    t = tl.program_id(0)
    item = MAIN + t
    j = item % N_BLOCKS
    off_hk = (item // N_BLOCKS) % N_ROWS
    off_b = item // (N_BLOCKS * N_ROWS)
    rows = tl.arange(0, KEYS)
    cols = tl.arange(0, BLOCK_D)
    keys = j * KEYS + rows
    ok = (keys < N_K)[:, None] & (cols < HEAD_DIM)[None, :]
    slot = rows[:, None] * HEAD_DIM + cols[None, :]
    dk = tl.load(WS + t.to(tl.int64) * (KEYS * HEAD_DIM) + slot, mask=ok, other=0.0)
    dv = tl.load(WS + (TAIL + t).to(tl.int64) * (KEYS * HEAD_DIM) + slot, mask=ok, other=0.0)
    k64 = keys.to(tl.int64)[:, None]
    tl.store(DK + off_b.to(tl.int64) * stride_dkb + off_hk.to(tl.int64) * stride_dkh + k64 * stride_dkn
             + cols[None, :], dk.to(DK.dtype.element_ty), mask=ok)
    tl.store(DV + off_b.to(tl.int64) * stride_dvb + off_hk.to(tl.int64) * stride_dvh + k64 * stride_dvn
             + cols[None, :], dv.to(DV.dtype.element_ty), mask=ok)

