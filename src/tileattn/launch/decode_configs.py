"""Which config a decoding launch runs (``launch/decode.py``): the tables of
``configs.py``, the partial kernel's shared-memory estimates, the
accumulator's registers, the loop structure, first fit or autotuning.
"""
from __future__ import annotations

import torch
import triton

from .. import configs
from .._env import env
from ..configs import DecodeConfig
from ..kernels.decode import _decode_partial_kernel
from . import runtime, tuning
from .runtime import smem_limit

def decode_smem_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int, num_stages: int,
                      paged: bool = False, descriptors: bool = True, head_dim_v: int | None = None,
                      shared_kv: bool = False) -> int:
    """Shared memory of a partial program: the Q tile, the K and V tiles
    buffered by the pipeliner, the probabilities, and with descriptors in
    three loops one more tile that the masked tiles are staged through (they
    are zeroed in registers past n_k; in one loop, :func:`one_loop`, the edge
    tile is moved back instead); the pointer path buffers the page numbers
    instead (sm_90 compiles, triton 3.6: at most 1 KB above the compiler's
    figure).  ``head_dim_v``: V's head dim (default ``head_dim``);
    ``shared_kv``: one (BLOCK_N, Dv + D - Dv) key tile a stage and no V tile
    (:func:`shared_smem_bytes`)."""
    if shared_kv:
        return shared_smem_bytes(block_m, block_n, head_dim, head_dim_v, elem_bytes, num_stages, paged,
                                 descriptors)
    d = configs.block_d(head_dim)
    dv = d if head_dim_v is None else configs.block_d(head_dim_v)
    buffers = configs.decode_pipeline_buffers(num_stages, paged)
    staged = max(d, dv) if descriptors and not one_loop(descriptors, paged) else 0
    pages = 4 * buffers * block_n if paged and not descriptors else 0
    return (elem_bytes * (d * block_m + (buffers * (d + dv) + staged) * block_n + block_m * block_n)
            + pages + 1024)


def shared_smem_bytes(block_m: int, block_n: int, head_dim: int, head_dim_v: int, elem_bytes: int,
                      num_stages: int, paged: bool, descriptors: bool) -> int:
    """:func:`decode_smem_bytes` of a shared cache (V = K's first Dv
    channels): Q and each buffered key tile are Dv + (D - Dv) wide (two
    power-of-2 pieces).  With 64 or more packed rows of a 16-bit cache the
    products are warpgroup MMAs (sm_90), which read their operands from
    shared memory while the next tile loads: the pipeliner then keeps
    ``num_stages`` key tiles (``(num_stages + 1) // 2`` on a paged cache),
    and P stays in registers (sm_90 compiles, triton 3.6, D = 576,
    Dv = 512: the estimate is at most 1 KB above the compiler's figure)."""
    width = configs.block_d(head_dim_v) + configs.block_d(head_dim - head_dim_v)
    if configs.decode_uses_wgmma(block_m, elem_bytes):
        buffers, probs = (num_stages + 1) // 2 if paged else num_stages, 0
    else:
        buffers, probs = configs.decode_pipeline_buffers(num_stages, paged), block_m * block_n
    staged = 1 if descriptors and not one_loop(descriptors, paged) else 0
    pages = 4 * buffers * block_n if paged and not descriptors else 0
    return elem_bytes * (width * (block_m + (buffers + staged) * block_n) + probs) + pages + 1024


def one_loop(descriptors: bool, paged: bool) -> bool:
    """Whether the partial kernel runs its tiles in one loop, every tile
    masked (``ONE_LOOP``), instead of a masked head, an unmasked body and a
    masked tail, each loop with a prologue of its own.  One loop lets the
    pipeline run on through a ragged last tile.  H200, graph replay
    (docs/perf-notes.md, v9): a contiguous cache by descriptor, 4095 keys,
    66.0 -> 64.0 us, full caches level; 16-token pages by pointer, 4095 keys,
    66.0 -> 64.9 us, full caches level; but a contiguous cache by pointer lost
    up to 0.7 % on full caches (every row's load masked), and on a paged cache
    by descriptor an edge tile must be zeroed in registers (the rows past the
    length are in the page), so those two keep three loops."""
    return descriptors != paged


def _prune(configs_in, named_args, **kwargs):
    args = {**named_args, **kwargs}
    limit = smem_limit(args["Q"].device)
    elem = args["K"].element_size()
    keep = [c for c in configs_in
            if _usable(_LAYOUT_OF[c], args["BLOCK_M"], args["HEAD_DIM"], elem, args["PAGE_SIZE"],
                       args["USE_TMA"], limit, args["HEAD_DIM_V"], args["HEAD_DIM_HI"] > 0)]
    return keep or [min(configs_in, key=lambda c: c.kwargs["BLOCK_N"] * c.num_stages)]


def _usable(c: DecodeConfig, block_m: int, head_dim: int, elem: int, page_size: int, descriptors: bool,
            limit: int, head_dim_v: int | None = None, shared_kv: bool = False) -> bool:
    """Whether ``c`` is a candidate for this launch: made for the cache's
    layout, no tile across a page boundary where pages are at least a tile
    (page lookups per row for nothing), an accumulator of at most
    ``configs.MAX_ACC_REGS`` float32 registers a thread, and within shared
    memory."""
    paged = page_size > 0
    if not c.serves(paged) or (page_size % c.block_n and page_size >= c.block_n):
        return False
    if configs.decode_acc_regs(block_m, head_dim if head_dim_v is None else head_dim_v,
                               c.num_warps) > configs.MAX_ACC_REGS:
        return False
    return decode_smem_bytes(block_m, c.block_n, head_dim, elem, c.num_stages, paged, descriptors, head_dim_v,
                             shared_kv) <= limit


# the DecodeConfig behind each autotuner config (its layouts), by identity
_LAYOUT_OF: dict = {}

_TUNE_KEY = ["HEAD_DIM", "HEAD_DIM_V", "HEAD_DIM_HI", "BLOCK_M", "PAGE_SIZE", "USE_TMA", "DOT_PRECISION",
             "SOFTCAP", "HAS_ALIBI"]


def _set_boxes(args) -> None:
    """Give the K/V descriptors the box of the config: (1, 1, BLOCK_N, width),
    V's width BLOCK_DV, K's BLOCK_D (BLOCK_DHI, K's last channels, on a shared
    cache)."""
    if args["USE_TMA"]:
        args["K_DESC"].block_shape = [1, 1, args["BLOCK_N"], args["BLOCK_DHI"] or args["BLOCK_D"]]
        args["V_DESC"].block_shape = [1, 1, args["BLOCK_N"], args["BLOCK_DV"]]


def _table(shared_kv: bool) -> tuple:
    return configs.DECODE_SHARED_CONFIGS if shared_kv else configs.DECODE_CONFIGS


def _build_tuned_partial(shared_kv: bool = False):
    cfgs = []
    for c in _table(shared_kv):
        cfgs.append(triton.Config(c.as_meta(), num_warps=c.num_warps, num_stages=c.num_stages,
                                  pre_hook=_set_boxes))
        _LAYOUT_OF[cfgs[-1]] = c
    return triton.autotune(configs=cfgs, key=_TUNE_KEY,
                           prune_configs_by={"early_config_prune": _prune})(_decode_partial_kernel)


def _tuned_partial(shared_kv: bool = False):
    """The autotuned partial kernel over the table of the cache's kind (built
    on first use, GPU only)."""
    if shared_kv:
        return tuning.autotuner("decode-shared", lambda: _build_tuned_partial(True))
    return tuning.autotuner("decode", _build_tuned_partial)


def decode_autotune_enabled(block_m: int, elem_bytes: int) -> bool:
    """Whether a decoding launch autotunes over configs.DECODE_CONFIGS instead of
    taking the first that fits.  Never with TILEATTN_AUTOTUNE=0;
    TILEATTN_DECODE_AUTOTUNE=1 always, =0 never.  Unset: only outside the
    class the table's order was measured for (16-bit caches, one block of at
    most 16 packed query rows, i.e. Nq x group size <= 16).  Outside it the
    first fitting config can spill registers (sm_90 compiles: up to ~1 KB a
    thread for head dim 256 with 64 packed rows, tens of KB in float32), and
    timing the candidates is worth its first-call cost."""
    if not runtime.autotune_enabled():
        return False
    switch = env("TILEATTN_DECODE_AUTOTUNE", "")
    if switch in ("0", "1"):
        return switch == "1"
    return not (elem_bytes == 2 and block_m <= 16)


def _first_fitting(block_m: int, head_dim: int, elem: int, page_size: int, device: torch.device,
                   descriptors: bool, head_dim_v: int | None = None, shared_kv: bool = False) -> DecodeConfig:
    limit = smem_limit(device)
    table = _table(shared_kv)
    return next((c for c in table
                 if _usable(c, block_m, head_dim, elem, page_size, descriptors, limit, head_dim_v, shared_kv)),
                table[-1])
