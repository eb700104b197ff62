"""Launcher of the persistent d = 64 backward (``kernels/bwd_hopper_persistent.py``)
and its split tail's fix-up (``kernels/bwd_tail.py``): the walk's work items,
programs and cut, and the tail's float32 workspace, which a caller may
allocate beforehand (:func:`bwd_workspace`) so that a launch plan can name it."""
from __future__ import annotations

import torch
import triton

from . import grid_order, runtime
from .runtime import sm_count


def walk(k, causal: bool, cfg, sms: int) -> tuple[int, int, int, int, int]:
    """(key blocks, items, programs, MAIN, SPLIT) of the walk over ``k``'s
    key blocks: an item is a block of 2 * block_n keys of one kv head
    (causal: a mirror-image pair of them); one program an SM at most; with
    ``cfg.split_tail`` (non-causal) one an SM and the last round's items cut
    (``grid_order.tail_split``: the leftover items, or all of them where
    there are at most half as many as SMs)."""
    n_blocks = triton.cdiv(k.shape[2], 2 * cfg.block_n)
    total = (triton.cdiv(n_blocks, 2) if causal else n_blocks) * k.shape[1] * k.shape[0]
    cut = cfg.split_tail and not causal
    programs = max(1, sms if cut else min(total, sms))   # cut: fewer items than SMs are cut too
    main, split = grid_order.tail_split(total, programs) if cut else (total, 1)
    return n_blocks, total, programs, main, split


def workspace_elements(k, causal: bool, cfg, sms: int) -> int:
    """The split tail's workspace in float32 elements: a slot of dK then dV
    (2 * block_n keys x D each) a cut item; 0 where nothing is cut."""
    _, total, _, main, _ = walk(k, causal, cfg, sms)
    return _slots(total - main, k, cfg)


def _slots(items: int, k, cfg) -> int:
    return items * 2 * 2 * cfg.block_n * k.shape[3]


def bwd_workspace(k, causal: bool, cfg) -> dict:
    """``{"ws": zeroed float32 workspace}`` for a call of ``cfg`` that runs
    the persistent kernel with a cut tail, else ``{}``."""
    if not cfg.persistent:
        return {}
    size = workspace_elements(k, causal, cfg, sm_count(k.device))
    return {"ws": torch.zeros(size, device=k.device, dtype=torch.float32)} if size else {}


def persistent_bwd_args(args: dict, k, causal: bool, cfg, sms: int, workspace=None) -> tuple:
    """(grid, keyword arguments) of the persistent kernel: ``args``, the
    one-program-a-block kernel's (``hopper._bwd_args``; those it takes), with
    the key blocks, kv heads and :func:`walk`'s items and cut, and the zeroed
    float32 workspace ``WS`` of a cut tail (``workspace``:
    :func:`bwd_workspace`'s tensor, else allocated here)."""
    n_blocks, total, programs, main, split = walk(k, causal, cfg, sms)
    ws = None
    if main < total:
        size = _slots(total - main, k, cfg)
        ws = workspace if workspace is not None else torch.zeros(size, device=k.device, dtype=torch.float32)
        if ws.numel() != size or ws.dtype != torch.float32:
            raise ValueError(f"workspace: the split tail needs {size} float32 elements, got {ws.numel()} {ws.dtype}")
    from ..kernels.bwd_hopper_persistent import _attn_bwd_hopper_persistent_kernel as kernel
    args = {name: x for name, x in args.items() if name in kernel.arg_names}
    return (programs,), dict(args, N_BLOCKS=n_blocks, N_ROWS=k.shape[1], TOTAL=total, MAIN=main, SPLIT=split, WS=ws,
                             SPLIT_TAIL=ws is not None)


def bwd_persistent(args: dict, k, dk, dv, causal: bool, cfg, workspace=None) -> None:
    """The persistent walk (``args``: as :func:`persistent_bwd_args` takes
    them), then the cut items' float32 sums rounded into their dK and dV rows."""
    from ..kernels.bwd_hopper_persistent import _attn_bwd_hopper_persistent_kernel as kernel
    from ..kernels.bwd_tail import _bwd_tail_kernel
    grid, args = persistent_bwd_args(args, k, causal, cfg, sm_count(k.device), workspace)
    runtime.run(kernel, grid, dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg), args)
    if args["SPLIT_TAIL"]:
        tail = args["TOTAL"] - args["MAIN"]
        runtime.run(_bwd_tail_kernel, (tail,), dict(num_warps=4), dict(
            WS=args["WS"], DK=dk, DV=dv, stride_dkb=dk.stride(0), stride_dkh=dk.stride(1), stride_dkn=dk.stride(2),
            stride_dvb=dv.stride(0), stride_dvh=dv.stride(1), stride_dvn=dv.stride(2), MAIN=args["MAIN"], TAIL=tail,
            N_BLOCKS=args["N_BLOCKS"], N_ROWS=args["N_ROWS"], N_K=k.shape[2], KEYS=2 * cfg.block_n,
            HEAD_DIM=k.shape[3], BLOCK_D=triton.next_power_of_2(k.shape[3])))
