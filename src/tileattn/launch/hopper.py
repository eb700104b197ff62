"""Launcher of the Hopper forward kernel (Gluon, ``kernels/fwd_hopper.py``),
and its sm_90a compile report (compiled without a GPU).

Which calls run it is ``dispatch.hopper_fwd_eligible``'s decision (a CUDA
device of compute capability 9.0, fp16 or bf16, a head dim the kernel is
built for, no variant, tensors the copy engine can address); everything else
runs the portable Triton kernels.  Gluon is imported on first use, so a CPU
install never imports it.  ``TILEATTN_HOPPER_FWD=0`` (or
``dispatch.HOPPER_FWD = False``) turns the path off.
"""
from __future__ import annotations

import torch
import triton

from .. import configs
from ..configs import HopperFwdConfig
from ..dispatch import tma_addressable
from .runtime import LOG2E, tma_strides


def _descriptor(t: torch.Tensor, rows: int):
    """A rank-4 (B, H, N, D) TMA descriptor with a (1, 1, rows, D) box.  Rows
    past N read as zeros and are clipped on stores, so a tile never reaches
    into the next head."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    shape, strides = list(t.shape), tma_strides(t, 3)   # the row dim too: a 1-row tensor
    block = [1, 1, rows, shape[3]]
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    return TensorDescriptor(t, shape, strides, block, gl.NVMMASharedLayout.get_default_for(block, dtype))


def config_for(head_dim: int) -> HopperFwdConfig:
    return configs.HOPPER_FWD[head_dim]


def attn_fwd(q, k, v, causal: bool, scale: float, config: HopperFwdConfig | None = None, poison: bool = False):
    """Forward on the Hopper kernel. Returns (out like q, lse float32 (B, Hq, Nq))."""
    from ..kernels.fwd_hopper import _attn_fwd_hopper_kernel
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    cfg = config or config_for(d)
    o = torch.empty_like(q)
    if not tma_addressable(o):   # empty_like kept an unaddressable layout: a dense one instead
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, n_q), device=q.device, dtype=torch.float32)
    if poison:
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
    grid = (triton.cdiv(n_q, 2 * cfg.block_m), hq, b)
    _attn_fwd_hopper_kernel[grid](
        q_desc=_descriptor(q, cfg.block_m), k_desc=_descriptor(k, cfg.block_n), v_desc=_descriptor(v, cfg.block_n),
        o_desc=_descriptor(o, cfg.block_m), LSE=lse, stride_lb=lse.stride(0), stride_lh=lse.stride(1),
        GROUP_SIZE=hq // hkv, N_Q=n_q, N_K=n_k, qk_scale=scale * LOG2E,
        HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=bool(causal),
        NUM_STAGES=cfg.num_stages, OVERLAP=cfg.overlap, PINGPONG=cfg.pingpong,
        num_warps=cfg.num_warps, maxnreg=cfg.maxnreg)
    return o, lse


def compile_sm90(head_dim: int, cfg: HopperFwdConfig, causal: bool, dtype: str = "bf16"):
    """Compile the kernel for sm_90a without a GPU (Triton bundles ptxas).
    Not under ``TRITON_INTERPRET``: Gluon cannot be compiled once the
    interpreter has wrapped its library, so callers in an interpreted
    process run this in a fresh one (see tests/attention/test_hopper_fwd.py)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type
    from ..kernels.fwd_hopper import _attn_fwd_hopper_kernel as kernel
    t = torch.empty(1, 2, 256, head_dim, dtype=torch.bfloat16 if dtype == "bf16" else torch.float16)
    rows = {"q_desc": cfg.block_m, "k_desc": cfg.block_n, "v_desc": cfg.block_n, "o_desc": cfg.block_m}
    sig = {name: mangle_type(_descriptor(t, r)) for name, r in rows.items()}
    sig.update(LSE="*fp32", stride_lb="i32", stride_lh="i32", GROUP_SIZE="i32", N_Q="i32", N_K="i32",
               qk_scale="fp32")
    const = dict(HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=bool(causal),
                 NUM_STAGES=cfg.num_stages, OVERLAP=cfg.overlap, PINGPONG=cfg.pingpong)
    sig.update({name: "constexpr" for name in const})
    src = GluonASTSource(fn=kernel, signature=sig,
                         constexprs={(kernel.arg_names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg))


def compile_report(head_dim: int, cfg: HopperFwdConfig, causal: bool, dtype: str = "bf16") -> dict:
    """What the sm_90a compile says of one config: shared memory, the
    instructions the design relies on, and local memory (spills)."""
    compiled = compile_sm90(head_dim, cfg, causal, dtype)
    ptx = compiled.asm["ptx"]
    return {"shared": int(compiled.metadata.shared), "wgmma": ptx.count("wgmma.mma_async"),
            "tma": "cp.async.bulk.tensor" in ptx, "setmaxnreg": sorted(set(
                line.split()[-1].rstrip(";") for line in ptx.splitlines() if "setmaxnreg" in line)),
            "local": ".local" in ptx}
