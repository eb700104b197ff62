"""Launcher of the Hopper decoding kernel for the absorbed MLA cache
(``kernels/decode_hopper.py``), its rules and its sm_90a compile report.

Which calls run it (:func:`eligible`): a shared cache (``v_cache =
k_cache[..., :512]``, D = 576: the absorbed layout), a CUDA device of compute
capability 9.0 with Gluon, fp16 or bf16, at most ``MAX_GROUP_ROWS`` packed
query rows a kv head (group size x Nq; a program takes 16 or 32 of them,
:func:`block_rows`), no softcap or ALiBi,
a contiguous cache or pages of a multiple of ``BLOCK_N`` tokens, cache
views the copy engine can address.  Everything else runs the portable
partial kernel.  ``TILEATTN_HOPPER_DECODE=0`` (or
``dispatch.HOPPER_DECODE = False``) turns the path off.

Its split count (``launch/decode.py`` applies it): the portable rule with
one program an SM (``PROGRAMS_PER_SM``: a program holds two 72 KB key tiles
in shared memory, so two do not fit) and splits of at least ``MIN_KEYS``
(two tiles).  The partial outputs are the portable
kernel's, merged by the same combine.
"""
from __future__ import annotations

import torch

from .. import dispatch
from .._env import env, interpreter_active
from . import runtime
from .runtime import LOG2E, tma_strides

BLOCK_N = 64            # keys a tile (a warpgroup MMA's M)
NUM_STAGES = 2          # key tiles in shared memory (2 x 73,728 B at 576 channels)
MAX_ROWS = 32           # packed rows a program (the MMAs' N; Oᵀ is 4 x 128 x rows float32)
MAX_GROUP_ROWS = 128    # packed rows a kv head (group size x Nq) the path takes, in blocks of MAX_ROWS
HEAD_DIMS = (576, 512)  # (QK, V) head dims the kernel is built for
NUM_WARPS = 4           # the softmax warpgroup (the load partition adds one warp)
PROGRAMS_PER_SM = 1     # the split rule's programs an SM can hold
MIN_KEYS = 2 * BLOCK_N  # the split rule's fewest keys a split


def enabled() -> bool:
    """The path's switches (a launch plan's key holds this)."""
    return dispatch.HOPPER_DECODE and env("TILEATTN_HOPPER_DECODE", "1") != "0"


def block_rows(rows: int) -> int:
    """Packed rows a program (the MMAs' N) for ``rows`` = group size x Nq:
    16, else 32; more than 32 run in blocks of 32, each block reading the
    cache (the blocks of one split run side by side, so their second reads
    come from L2)."""
    return 16 if rows <= 16 else MAX_ROWS


def eligible(q: torch.Tensor, k_hi: torch.Tensor, v_lo: torch.Tensor, block_table, softcap, alibi_slopes) -> bool:
    """Whether a shared-cache call runs the Hopper kernel; ``k_hi`` and
    ``v_lo`` are the cache's last and first channels as the launcher passes
    them (``k_cache[..., 512:]``, ``k_cache[..., :512]``)."""
    if not enabled() or runtime.FORCE_POINTER_PATH:
        return False
    if (q.shape[3], v_lo.shape[3]) != HEAD_DIMS or k_hi.shape[3] != HEAD_DIMS[0] - HEAD_DIMS[1]:
        return False
    if softcap is not None or alibi_slopes is not None or q.shape[1] // k_hi.shape[1] * q.shape[2] > MAX_GROUP_ROWS:
        return False
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16) or interpreter_active():
        return False
    if not dispatch.hopper_device(q.device):
        return False
    if block_table is not None and k_hi.shape[2] % BLOCK_N:
        return False
    if q.shape[0] > dispatch.MAX_GRID_YZ:
        return False
    return dispatch.tma_addressable(k_hi) and dispatch.tma_addressable(v_lo)


def _descriptor(t: torch.Tensor, cols: int):
    """A rank-4 (batch or page, kv head, row, channel) descriptor with a
    (1, 1, BLOCK_N, cols) box; rows past the cache read as zeros."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    runtime.register_descriptor_type(TensorDescriptor)   # (launch plans may hold this call's launch)
    block = (1, 1, BLOCK_N, cols)
    dtype = "bfloat16" if t.dtype == torch.bfloat16 else "float16"
    return TensorDescriptor(t, list(t.shape), tma_strides(t, 3), list(block), runtime.shared_layout(block, dtype))


def kernel_args(q, k_hi, v_lo, cache_seqlens, block_table, o_part, l_part, *, n_new: int, capacity: int,
                scale: float, window, lead_permille: int, block_m: int) -> dict:
    """The kernel's keyword arguments.  ``o_part`` / ``l_part``: (B, Hq, Nq, S,
    Dv) and (B, Hq, Nq, S) partial outputs, or the output and lse themselves
    (B, Hq, Nq, Dv) / (B, Hq, Nq) for one split."""
    paged = block_table is not None
    split_dim = o_part.dim() == 5
    so = o_part.stride()
    sl = l_part.stride()
    left, right = window
    return dict(
        lo_desc=_descriptor(v_lo, 128), hi_desc=_descriptor(k_hi, k_hi.shape[3]), Q=q, SEQLENS=cache_seqlens,
        BLOCK_TABLE=block_table if paged else cache_seqlens, O=o_part, LSE=l_part,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_qn=q.stride(2), stride_qd=q.stride(3),
        stride_tb=block_table.stride(0) if paged else 0, stride_tn=block_table.stride(1) if paged else 0,
        stride_ob=so[0], stride_oh=so[1], stride_on=so[2], stride_os=so[3] if split_dim else 0,
        stride_od=so[4] if split_dim else so[3],
        stride_lb=sl[0], stride_lh=sl[1], stride_ln=sl[2], stride_ls=sl[3] if split_dim else 0,
        N_Q=q.shape[2], N_NEW=n_new, N_KV_HEADS=k_hi.shape[1], GROUP_SIZE=q.shape[1] // k_hi.shape[1],
        CAPACITY=capacity, NUM_PAGES=k_hi.shape[0] if paged else 1,
        qk_scale=scale * LOG2E, window_left=max(left, 0), window_right=max(right, 0), lead_permille=lead_permille,
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, NUM_STAGES=NUM_STAGES, PAGE_SIZE=k_hi.shape[2] if paged else 0,
        HEAD_DIM_V=v_lo.shape[3], HEAD_DIM_HI=k_hi.shape[3], HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0)


def launch(q, k_hi, v_lo, cache_seqlens, block_table, o_part, l_part, *, n_new: int, capacity: int, scale: float,
           window, num_splits: int, lead_permille: int, block_m: int, m_blocks: int) -> None:
    """The partial kernel on the Hopper path (the caller combines the splits)."""
    from ..kernels.decode_hopper import _decode_absorbed_hopper_kernel
    args = kernel_args(q, k_hi, v_lo, cache_seqlens, block_table, o_part, l_part, n_new=n_new, capacity=capacity,
                       scale=scale, window=window, lead_permille=lead_permille, block_m=block_m)
    grid = (k_hi.shape[1] * m_blocks, q.shape[0], num_splits)
    runtime.run(_decode_absorbed_hopper_kernel, grid, dict(num_warps=NUM_WARPS), args)


def compile_sm90(block_m: int = 16, paged: bool = False, dtype: str = "bf16", causal: bool = False):
    """Compile the kernel for sm_90a without a GPU (Triton bundles ptxas); not
    under ``TRITON_INTERPRET`` (see ``launch.hopper_compile.compile_sm90``)."""
    from ..kernels.decode_hopper import _decode_absorbed_hopper_kernel as kernel
    from .hopper_compile import compile_gluon
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    d, dv = HEAD_DIMS
    cache = torch.empty(2, 1, 256, d, dtype=torch_dtype)
    q = torch.empty(2, block_m, 1, d, dtype=torch_dtype)
    seqlens = torch.zeros(2, dtype=torch.int32)
    table = torch.zeros(2, 4, dtype=torch.int32) if paged else None
    o = torch.empty(2, block_m, 1, 2, dv)
    lse = torch.empty(2, block_m, 1, 2)
    args = kernel_args(q, cache[..., dv:], cache[..., :dv], seqlens, table, o, lse, n_new=0, capacity=256,
                       scale=1.0, window=(-1, 0 if causal else -1), lead_permille=0, block_m=block_m)
    const = {"BLOCK_M", "BLOCK_N", "NUM_STAGES", "PAGE_SIZE", "HEAD_DIM_V", "HEAD_DIM_HI", "HAS_LEFT", "HAS_RIGHT"}
    return compile_gluon(kernel, args, const, dict(num_warps=NUM_WARPS))


def compile_report(block_m: int = 16, paged: bool = False, dtype: str = "bf16", causal: bool = False) -> dict:
    """Shared memory, warpgroup MMAs, copy-engine loads and spills of one
    sm_90a compile."""
    compiled = compile_sm90(block_m, paged, dtype, causal)
    ptx = compiled.asm["ptx"]
    return {"shared": int(compiled.metadata.shared), "wgmma": ptx.count("wgmma.mma_async"),
            "tma": "cp.async.bulk.tensor" in ptx, "local": ".local" in ptx}
