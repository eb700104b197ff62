"""sm_90a compiles of the Hopper kernels without a GPU (Triton bundles
ptxas): the forward's and the backward's builds of a config, what the
assembler says of them (shared memory, spills, serialized warpgroup MMAs:
``runtime.ptxas_report``), and a compile of any Gluon kernel from its
keyword arguments (``launch/decode_hopper.py``'s too).  The tests' compile
cases and ``benchmarks/ptx_identity.py`` use them.

Not under ``TRITON_INTERPRET``: Gluon cannot be compiled once the
interpreter has wrapped its library, so callers in an interpreted process
run these in a fresh one (see tests/attention/test_hopper_fwd.py).
"""
from __future__ import annotations

import torch
import triton

from ..configs import HopperBwdConfig, HopperFwdConfig
from . import grid_order, runtime
from .hopper import (_bwd_args, _descriptor, _qk_descriptors, _transposed_kernel, defers_o, dq_sum_transposed,
                     fwd_shape, split_kernel, transposed_dq)
from .hopper_persistent import persistent_bwd_args


def compile_sm90(head_dim: int, cfg: HopperFwdConfig, causal: bool, dtype: str = "bf16", sinks: bool = False,
                 head_dim_v: int | None = None, remainder: bool = False, window: bool = False, varlen: bool = False,
                 even_k: bool = False):
    """The forward kernel's build of ``cfg`` for sm_90a; ``remainder``: the
    build that also stores O's rounding remainder; ``window``: a sliding
    window's (``causal`` then False); ``varlen``: packed sequences';
    ``even_k``: the build without the mask step (``hopper.even_k``)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type
    from ..kernels.fwd_hopper import _attn_fwd_hopper_kernel as kernel
    dv = head_dim if head_dim_v is None else head_dim_v
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    t, tv = (torch.empty(1, 2, 256, w, dtype=torch_dtype) for w in (head_dim, dv))
    descs = dict(_qk_descriptors(t, t, dv, cfg), v_desc=_descriptor(tv, cfg.block_n),
                 o_desc=_descriptor(tv, cfg.block_m))
    if remainder:
        descs["olo_desc"] = _descriptor(torch.empty(tv.shape, dtype=torch.int8), cfg.block_m)
    const = dict(HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=bool(causal),
                 NUM_STAGES=cfg.num_stages, OVERLAP=cfg.overlap, PINGPONG=cfg.pingpong, ROW_TREE=cfg.row_tree,
                 HAS_SINKS=sinks,
                 HEAD_DIM_V=dv, TAIL_DIM=descs.pop("TAIL_DIM", 0), WRITE_REMAINDER=remainder,
                 PERSISTENT=cfg.persistent, DEFER_O=defers_o(cfg), TRACE=None, EVEN_K=even_k,
                 **{"NUM_WG": 2, "EARLY_P": False, **fwd_shape(cfg)})
    sig = {name: mangle_type(x) for name, x in descs.items()}
    sig.update(LSE="*fp32", SINKS="*fp32", stride_lb="i32", stride_lh="i32", GROUP_SIZE="i32", N_Q="i32",
               N_K="i32", qk_scale="fp32")
    grouped = grid_order.compiled_grouped(causal, cfg, other_grid=cfg.persistent or varlen)
    const.update(GROUPED=grouped)
    cut_tail = cfg.stream_k and cfg.persistent and not causal
    const.update(STREAM_K=cut_tail)
    if cut_tail:
        sig.update(SK_TILES="i32", WS_O="*fp32", WS_ML="*fp32")
    else:
        const.update(SK_TILES=0, WS_O=None, WS_ML=None)
    if cfg.persistent:
        sig.update(N_M_TILES="i32", N_HEADS="i32", TOTAL="i32")
    else:   # as a launch specializes them: 1 (N_HEADS: the grouped grid's heads)
        const.update(N_M_TILES=1, TOTAL=1, **({} if grouped else {"N_HEADS": 1}))
        if grouped:
            sig.update(N_HEADS="i32")
    if window:
        sig.update(WIN_LEFT="i32", WIN_RIGHT="i32")
    else:
        const.update(WIN_LEFT=None, WIN_RIGHT=None)
    if varlen:
        const.update(IS_VARLEN=True)
        sig.update(CU_SEQLENS_Q="*i32", CU_SEQLENS_K="*i32", O=sig["LSE"].replace("fp32", dtype),
                   stride_on="i32", stride_oh="i32", V=sig["LSE"].replace("fp32", dtype), stride_vh="i32",
                   stride_vn="i32")
    else:
        const.update(IS_VARLEN=False, CU_SEQLENS_Q=None, CU_SEQLENS_K=None, O=None, stride_on=0, stride_oh=0,
                     V=None, stride_vh=0, stride_vn=0)
    sig.update({name: "constexpr" for name in const})
    if dv == head_dim:   # no tail: its descriptors are None
        sig.update(qt_desc="constexpr", kt_desc="constexpr")
        const.update(qt_desc=None, kt_desc=None)
    if not remainder:
        sig.update(olo_desc="constexpr")
        const.update(olo_desc=None)
    sig = {name: sig[name] for name in kernel.arg_names}
    src = GluonASTSource(fn=kernel, signature=sig,
                         constexprs={(kernel.arg_names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg))


def compile_report(head_dim: int, cfg: HopperFwdConfig, causal: bool, dtype: str = "bf16",
                   sinks: bool = False, head_dim_v: int | None = None, remainder: bool = False,
                   window: bool = False, varlen: bool = False, even_k: bool = False) -> dict:
    """What the sm_90a compile says of one config: shared memory, the
    instructions the design relies on, local memory in the PTX, and the
    assembler's word on it (:func:`runtime.ptxas_report`)."""
    compiled = compile_sm90(head_dim, cfg, causal, dtype, sinks, head_dim_v, remainder, window, varlen, even_k)
    ptx = compiled.asm["ptx"]
    return {"shared": int(compiled.metadata.shared), "wgmma": ptx.count("wgmma.mma_async"),
            "tma": "cp.async.bulk.tensor" in ptx, "setmaxnreg": sorted(set(
                line.split()[-1].rstrip(";") for line in ptx.splitlines() if "setmaxnreg" in line)),
            "local": ".local" in ptx, **runtime.ptxas_report(ptx)}


def compile_bwd_sm90(head_dim: int, cfg: HopperBwdConfig, causal: bool, dtype: str = "bf16", sinks: bool = False,
                     head_dim_v: int | None = None, window: bool = False, varlen: bool = False):
    """:func:`compile_sm90` for the backward kernel (``sinks``: with the dS
    row sums their gradient needs, or with ``cfg.sink_sums`` the per-head
    sums; ``head_dim_v`` narrower than ``head_dim``:
    the wide kernel; QK = V head dim above 128: the split kernel; ``window``:
    a sliding window's build of the d <= 128 kernel, ``causal`` then False;
    ``varlen``: packed sequences' build of it, plain grid; ``cfg.persistent``
    without those: ``kernels/bwd_hopper_persistent.py``'s)."""
    w = head_dim if head_dim_v is None else head_dim_v
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    t, tv = (torch.empty(1, 2, 256, x, dtype=torch_dtype) for x in (head_dim, w))
    lse = torch.empty(1, 2, 256)
    if transposed_dq(head_dim, w):
        kernel, build = _transposed_kernel(head_dim, w)
        args = dict(build(tv, t, t, tv, dq_sum_transposed(t), t, tv, lse, lse, causal, 1.0, cfg), N_ROWS=16,
                    GROUPED=grid_order.compiled_grouped(causal, cfg))
        const = {"BLOCK_M", "BLOCK_N", "IS_CAUSAL", "NUM_STAGES", "GROUPED"} | (
            {"HEAD_DIM"} if split_kernel(head_dim, w) else {"HEAD_DIM_V", "TAIL_DIM", "DQ_BUFS"})
    elif cfg.persistent and not (sinks or window or varlen):   # the persistent walk (plain calls)
        from ..kernels.bwd_hopper_persistent import _attn_bwd_hopper_persistent_kernel as kernel
        f = torch.empty(1, 2, 256, head_dim, dtype=torch.float32)
        # 3 programs over the 4 items of (1, 2, 256) keys: with split_tail the fourth is cut in 3 pieces
        _, args = persistent_bwd_args(_bwd_args(t, t, t, t, f, t, t, lse, lse, causal, 1.0, cfg), t, causal, cfg, 3)
        const = {"HEAD_DIM", "BLOCK_M", "BLOCK_N", "IS_CAUSAL", "NUM_STAGES", "DK_FROM_SMEM", "STATS_TMA",
                 "SPLIT_TAIL"} | ({"WS"} if args["WS"] is None else set())
    else:
        from ..kernels.bwd_hopper import _attn_bwd_hopper_kernel as kernel
        f = torch.empty(1, 2, 256, head_dim, dtype=torch.float32)
        per_head = sinks and cfg.sink_sums   # the sinks' per-head sums, else dS's row sums
        args = _bwd_args(t, t, t, t, f, t, t, lse, lse, causal, 1.0, cfg,
                         torch.empty(1, 2, 256) if sinks and not per_head else None,
                         paired=cfg.pair_blocks is True, window=(16, 0) if window else None,
                         sink_sums=torch.empty(2) if per_head else None, sinks=torch.empty(2) if per_head else None)
        if not per_head:
            args.update(SINK_SUMS=False, SINKS=None)
        args.update(N_ROWS=16, GROUPED=grid_order.compiled_grouped(causal, cfg, other_grid=cfg.pair_blocks is True
                                                                    or varlen))
        if varlen:
            cu = torch.empty(3, dtype=torch.int32)
            args.update(IS_VARLEN=True, CU_SEQLENS_Q=cu, CU_SEQLENS_K=cu, PAIRED=False, K=t, Q=t, DO=t,
                        **{f"stride_{x}{y}": t.stride(1 if y == "h" else 2) for x in ("k", "q", "do") for y in "hn"})
        else:
            args.update(IS_VARLEN=False, CU_SEQLENS_Q=None, CU_SEQLENS_K=None, K=None, Q=None, DO=None,
                        **{f"stride_{x}{y}": 0 for x in ("k", "q", "do") for y in "hn"})
        if (cfg.head_slices or 1) > 1:   # the float32 dK/dV sums (the group's size is a run-time argument)
            args.update(DK=f, DV=f, ADD_DKDV=True)
        const = {"HEAD_DIM", "BLOCK_M", "BLOCK_N", "IS_CAUSAL", "NUM_STAGES", "DK_FROM_SMEM", "SUM_DS", "PAIRED",
                 "DEFER_SUMS", "STATS_TMA", "ADD_DKDV", "GROUPED", "IS_VARLEN", "SINK_SUMS"} | (
                     set() if per_head else {"SINKS"}) | (
                     set() if varlen else {"CU_SEQLENS_Q", "CU_SEQLENS_K", "K", "Q", "DO"} | {
                         f"stride_{x}{y}" for x in ("k", "q", "do") for y in "hn"})
        if not window:   # as a launch without one specializes them
            args.update(WIN_LEFT=None, WIN_RIGHT=None)
            const |= {"WIN_LEFT", "WIN_RIGHT"}
    return compile_gluon(kernel, args, const, dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg))


_POINTER_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32"}


def compile_gluon(kernel, args: dict, const: set, options: dict):
    """Compile a Gluon kernel for sm_90a from its keyword arguments (the
    names in ``const`` as constexprs), without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type
    sig = {}
    for name in kernel.arg_names:
        value = args[name]
        if name in const:
            sig[name] = "constexpr"
        elif isinstance(value, torch.Tensor):
            sig[name] = _POINTER_TYPES[value.dtype]
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif isinstance(value, int):
            sig[name] = "i32"
        else:
            sig[name] = mangle_type(value)
    src = GluonASTSource(fn=kernel, signature=sig, constexprs={(kernel.arg_names.index(k),): args[k] for k in const})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_bwd_report(head_dim: int, cfg: HopperBwdConfig, causal: bool, dtype: str = "bf16",
                       sinks: bool = False, head_dim_v: int | None = None, window: bool = False,
                       varlen: bool = False) -> dict:
    """:func:`compile_report` for the backward kernel, with the count of
    the copy engine's bulk reduces (dQ)."""
    compiled = compile_bwd_sm90(head_dim, cfg, causal, dtype, sinks, head_dim_v, window, varlen)
    ptx = compiled.asm["ptx"]
    return {"shared": int(compiled.metadata.shared), "wgmma": ptx.count("wgmma.mma_async"),
            "tma": "cp.async.bulk.tensor" in ptx, "reduce": ptx.count("cp.reduce.async.bulk.tensor"),
            "setmaxnreg": sorted(set(line.split()[-1].rstrip(";") for line in ptx.splitlines()
                                     if "setmaxnreg" in line)),
            "local": ".local" in ptx, **runtime.ptxas_report(ptx)}
