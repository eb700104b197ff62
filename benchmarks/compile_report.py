"""Compile the kernels ahead of time for a GPU target (no GPU needed) and print
the compiler's resource report: registers, shared memory, spills.

    python benchmarks/compile_report.py --arch 90 [--head-dim 64 128] [--dtype bf16]
"""
from __future__ import annotations

import argparse
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tileattn import configs
from tileattn.kernels.bwd import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel
from tileattn.kernels.fwd import _attn_fwd_kernel

_TY = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}


def _signature(kernel, ptr_ty, constexprs):
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.isupper() and len(name) <= 5 and not name.startswith("N_"):
            sig[name] = "*fp32" if name in ("LSE", "LSE2", "DELTA") else ptr_ty
        elif name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_one(kernel, cfg, head_dim, dtype, causal, arch):
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_D": configs.block_d(head_dim), "BLOCK_M": cfg.block_m,
                  "BLOCK_N": cfg.block_n, "IS_CAUSAL": causal,
                  "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32"}
    sig = _signature(kernel, _TY[dtype], constexprs)
    src = ASTSource(fn=kernel, signature=sig, constexprs={(kernel.arg_names.index(k),): v
                                                          for k, v in constexprs.items()})
    target = GPUTarget("cuda", arch, 32)
    ck = triton.compile(src, target=target, options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    ptx = ck.asm.get("ptx", "")
    return ck.n_regs if hasattr(ck, "n_regs") else None, ck.metadata.shared, ck.n_spills if hasattr(ck, "n_spills") else None, ("wgmma" in ptx), ck


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", default="bf16", choices=sorted(_TY))
    args = ap.parse_args()
    rows = []
    for d in args.head_dim:
        for kind, kernel, cands in (("fwd", _attn_fwd_kernel, configs.fwd_candidates(d)),
                                    ("dkdv", _attn_bwd_dkdv_kernel, configs.bwd_candidates(d)),
                                    ("dq", _attn_bwd_dq_kernel, configs.bwd_candidates(d))):
            for cfg in cands:
                for causal in (False, True):
                    try:
                        regs, smem, spills, wgmma, _ = compile_one(kernel, cfg, d, args.dtype, causal, args.arch)
                        rows.append((kind, d, cfg.name, causal, regs, smem, spills, wgmma))
                    except Exception as e:  # report and go on
                        msg = re.sub(r"\s+", " ", str(e))[:120]
                        rows.append((kind, d, cfg.name, causal, "ERR", msg, "", ""))
    print(f"{'kernel':6} {'d':>4} {'config':18} {'causal':6} {'regs':>5} {'smem':>7} {'spills':>6} wgmma")
    for r in rows:
        print(f"{r[0]:6} {r[1]:>4} {r[2]:18} {str(r[3]):6} {str(r[4]):>5} {str(r[5]):>7} {str(r[6]):>6} {r[7]}")


if __name__ == "__main__":
    main()
