"""Compile the kernels ahead of time for a GPU target (no GPU needed) and print
the compiler's resource report: registers, shared memory, spills.  Kernel
"dkdv_atomic" is the dK/dV kernel as the atomic backward (deterministic=False)
launches it, adding dQ into a float32 accumulator.

    python benchmarks/compile_report.py --arch 90 [--head-dim 64 128] [--dtype bf16]
    python benchmarks/compile_report.py --head-dim 128 --variant varlen window   # with variants on
    python benchmarks/compile_report.py --head-dim 512 --head-dim-v 256          # V of its own head dim
    python benchmarks/compile_report.py --arch 89 --pointer-path --head-dim 512  # consumer parts (no TMA)
    python benchmarks/compile_report.py --hopper-defaults     # the Hopper configs default calls take

``--hopper-defaults`` compiles, for sm_90a, the Hopper forward and backward
configs that a default call takes at the FlashAttention-2 protocol's points
(16k tokens, hidden 2048, N = 2k-16k, causal and not; ``launch.hopper.call_config``,
``bwd_call_config``), each config once with the lengths it serves.

``compile_decode`` does the same for the decoding kernel (used by the test
of its shared-memory estimate).
"""
from __future__ import annotations

import argparse
import inspect
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tileattn import configs
from tileattn.launch import decode as launch_decode
from tileattn.launch.attention import _BOX_ROWS, _V_WIDTH
from tileattn.kernels.bwd import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel
from tileattn.kernels.fwd import _attn_fwd_kernel

_TY = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}


def _signature(kernel, ptr_ty, constexprs, boxes=None):
    """Argument types; ``boxes`` maps the descriptor arguments (TMA path) to
    their tile height."""
    sig = {}
    boxes = boxes or {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in boxes:
            elem = ptr_ty.lstrip("*")
            width = constexprs["BLOCK_DV" if name in _V_WIDTH else "BLOCK_D"]
            sig[name] = f"tensordesc<{elem}[1,1,{boxes[name]},{width}]>"
        elif name.isupper() and len(name) <= 5 and not name.startswith("N_") and name != "LSE2" or name == "LSE2":
            sig[name] = "*fp32" if name in ("LSE", "LSE2", "DELTA") else ptr_ty
        elif name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


# The variants' switches and the types of the arguments each one uses.
VARIANTS = {
    "varlen": ({"IS_VARLEN": True}, {"CU_SEQLENS_Q": "*i32", "CU_SEQLENS_K": "*i32"}),
    "window": ({"HAS_WINDOW": True}, {"win_left": "i32", "win_right": "i32"}),
    "softcap": ({"HAS_SOFTCAP": True}, {"softcap_scale": "fp32", "softcap_log2": "fp32"}),
    "alibi": ({"HAS_ALIBI": True}, {"ALIBI": "*fp32", "stride_ab": "i32", "stride_ah": "i32"}),
    "block_sparse": ({"BLOCK_SPARSE": True}, {
        **{n: "*i32" for n in ("BS_FULL_NUM", "BS_FULL_IDX", "BS_PART_NUM", "BS_PART_IDX")},
        **{n: "i32" for n in ("stride_bs_nb", "stride_bs_nh", "stride_bs_ib", "stride_bs_ih", "stride_bs_ir")}}),
}


def compile_one(kernel, cfg, head_dim, dtype, causal, arch, use_tma=True, variants=(), atomic_dq=False,
                head_dim_v=None):
    """``atomic_dq``: the dK/dV kernel as the non-deterministic backward
    launches it (kind "dkdv_atomic": it also adds dQ into a float32
    accumulator, by the copy engine's bulk reduce on the TMA path).
    ``head_dim_v``: V's head dim (default: ``head_dim``)."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_D": configs.block_d(head_dim), "HEAD_DIM_V": head_dim_v,
                  "BLOCK_DV": configs.block_d(head_dim_v), "BLOCK_M": cfg.block_m,
                  "BLOCK_N": cfg.block_n, "IS_CAUSAL": causal and "window" not in variants,
                  "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32", "USE_TMA": use_tma}
    types = {}
    for name in variants:
        constexprs.update(VARIANTS[name][0])
        types.update(VARIANTS[name][1])
    if atomic_dq:
        dq_tma = use_tma and "varlen" not in variants
        constexprs.update(ATOMIC_DQ=True, DQ_TMA=dq_tma)
        types.update({n: "i32" for n in ("stride_dqab", "stride_dqah", "stride_dqan", "stride_dqad")})
        types["DQ_ACC"] = (f"tensordesc<fp32[1,1,{cfg.block_m},{constexprs['BLOCK_D']}]>" if dq_tma else "*fp32")
    # the other variants' arguments keep their defaults (switches off, pointers None)
    constexprs.update({p.name: p.default for p in kernel.params
                       if p.name not in constexprs and p.name not in types
                       and p.default is not inspect.Parameter.empty})
    kind = {_attn_fwd_kernel: "fwd", _attn_bwd_dkdv_kernel: "dkdv", _attn_bwd_dq_kernel: "dq"}[kernel]
    boxes = {name: constexprs[rows] for name, rows in _BOX_ROWS[kind].items()} if use_tma else None
    if boxes and "varlen" in variants:  # packed sequences store through pointers
        boxes = {n: r for n, r in boxes.items() if n not in ("O", "DQ", "DK", "DV")}
    sig = _signature(kernel, _TY[dtype], constexprs, boxes)
    sig.update(types)
    src = ASTSource(fn=kernel, signature=sig, constexprs={(kernel.arg_names.index(k),): v
                                                          for k, v in constexprs.items()})
    target = GPUTarget("cuda", arch, 32)
    ck = triton.compile(src, target=target, options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    ptx = ck.asm.get("ptx", "")
    regs, spills = _ptxas_info(ptx, arch)
    return regs, ck.metadata.shared, spills, ("wgmma" in ptx), ck


def compile_decode(block_n: int, num_warps: int, num_stages: int, head_dim: int = 128, page_size: int = 0,
                   descriptors: bool = True, dtype: str = "bf16", block_m: int = 16, arch: int = 90,
                   same_kv_strides: bool = False, offsets_32: bool = False, head_dim_v: int | None = None,
                   shared_kv: bool = False, row_strides_16: bool = False, **switches):
    """The decoding partial kernel (``kernels/decode.py``) compiled for a GPU
    target, specialised as a launch from ``launch_decode`` would be (unit
    stride on the head dim, 16-byte divisible pointers and strides).
    ``head_dim_v``: V's head dim (default ``head_dim``); ``shared_kv``: the
    shared cache of the absorbed MLA layout (V = K's first ``head_dim_v``
    channels, e.g. head_dim 576, head_dim_v 512; K and V strides the same).
    ``row_strides_16``: q's and the output's row strides divisible by 16
    too, as a launch specialises them for head dims that are multiples of
    16 (then the output's stores are vectorised).
    ``switches`` override the kernel's constexpr switches (``SOFTCAP=True``,
    ``HAS_LEFT=True``, ``ONE_LOOP=False``, ...)."""
    from tileattn.kernels.decode import _decode_partial_kernel as k
    elem = _TY[dtype].lstrip("*")
    dv = head_dim if head_dim_v is None else head_dim_v
    hi = head_dim - dv if shared_kv else 0
    const = {"HEAD_DIM": head_dim, "BLOCK_D": configs.block_d(dv if shared_kv else head_dim),
             "HEAD_DIM_V": dv, "BLOCK_DV": configs.block_d(dv), "HEAD_DIM_HI": hi,
             "BLOCK_DHI": configs.block_d(hi) if hi else 0, "BLOCK_M": block_m, "BLOCK_N": block_n,
             "PAGE_SIZE": page_size, "HAS_LEFT": False, "HAS_RIGHT": True, "SOFTCAP": False, "HAS_ALIBI": False,
             "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32", "USE_TMA": descriptors,
             "SAME_KV_STRIDES": same_kv_strides or shared_kv, "OFFSETS_32": offsets_32,
             "ONE_LOOP": launch_decode.one_loop(descriptors, page_size > 0),
             "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1, "stride_tn": 1}
    const.update(switches)
    sig = {}
    for name in k.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name in ("K_DESC", "V_DESC"):
            bd = const["BLOCK_DV"] if name == "V_DESC" else (const["BLOCK_DHI"] or const["BLOCK_D"])
            sig[name] = f"tensordesc<{elem}[1,1,{block_n},{bd}]>" if descriptors else f"*{elem}"
        elif name in ("Q", "K", "V", "O"):
            sig[name] = f"*{elem}"
        elif name in ("SEQLENS", "BLOCK_TABLE"):
            sig[name] = "*i32"
        elif name in ("SLOPES", "LSE"):
            sig[name] = "*fp32"
        elif name in ("qk_scale", "softcap_scale", "softcap_log2"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    divisible = [n for n in ("Q", "K", "V", "O", "SEQLENS", "BLOCK_TABLE", "LSE", "stride_qb", "stride_qh", "stride_qn",
                             "stride_kb", "stride_kh", "stride_kn", "stride_vb", "stride_vh", "stride_vn",
                             "stride_tb", "stride_ob", "stride_oh", "stride_os")
                 + (("stride_qn", "stride_on") if row_strides_16 else ()) if sig[n] != "constexpr"]
    src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(n),): v for n, v in const.items()},
                    attrs={(k.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def _ptxas_info(ptx: str, arch: int):
    """Registers and spill bytes from the ptxas that ships with Triton
    (``runtime.ptxas_report``); (None, None) where it refuses the PTX."""
    import subprocess
    from tileattn.launch import runtime
    try:
        rep = runtime.ptxas_report(ptx, arch)
    except subprocess.CalledProcessError:
        return None, None
    return rep["registers"], rep["spill_stores"]


def hopper_default_configs(head_dims=(64, 128), seqlens=(2048, 4096, 8192, 16384)) -> list:
    """[(kind, d, causal, config, [N, ...])]: the configs a default plain call
    (no variant, MHA) takes at the FA2 protocol's points, each once."""
    import torch
    from tileattn.launch import hopper
    found = {}
    for d in head_dims:
        for causal in (False, True):
            for n in seqlens:
                q = torch.empty(16384 // n, 2048 // d, n, d, device="meta")
                for kind, cfg in (("fwd", hopper.call_config(d, d, n, causal)),
                                  ("bwd", hopper.bwd_call_config(q, q, q, causal, plain=True))):
                    found.setdefault((kind, d, causal, cfg), []).append(n)
    return [key + (ns,) for key, ns in found.items()]


def hopper_defaults_report() -> list[str]:
    """One line a default config: its name, the lengths it serves, and what
    the sm_90a compile says (registers at launch and per partition, shared
    memory, spill stores, serialized warpgroup MMAs)."""
    from tileattn.launch import hopper_compile
    lines = [f"{'kind':4} {'d':>3} {'causal':6} {'N':18} {'config':48} {'regs':>4} {'setmaxnreg':12} "
             f"{'smem':>7} {'spills':>6} serialized"]
    for kind, d, causal, cfg, ns in hopper_default_configs():
        build = hopper_compile.compile_report if kind == "fwd" else hopper_compile.compile_bwd_report
        rep = build(d, cfg, causal)
        lens = ",".join(f"{n // 1024}k" for n in ns)
        lines.append(f"{kind:4} {d:>3} {str(causal):6} {lens:18} {cfg.name:48} {str(rep['registers']):>4} "
                     f"{'/'.join(rep['setmaxnreg']):12} {rep['shared']:>7} {rep['spill_stores']:>6} "
                     f"{rep['wgmma_serialized']}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--head-dim-v", type=int, default=None, help="V's head dim (default: each --head-dim)")
    ap.add_argument("--dtype", default="bf16", choices=sorted(_TY))
    ap.add_argument("--pointer-path", action="store_true", help="the portable path instead of TMA")
    ap.add_argument("--variant", nargs="+", default=[], choices=sorted(VARIANTS),
                    help="compile with these variants switched on (default: the plain kernels)")
    ap.add_argument("--hopper-defaults", action="store_true",
                    help="the Hopper configs default calls take at the FA2 protocol's points, instead")
    args = ap.parse_args()
    if args.hopper_defaults:
        print("\n".join(hopper_defaults_report()))
        return
    rows = []
    for d in args.head_dim:
        dv = args.head_dim_v
        for kind, kernel, cands in (("fwd", _attn_fwd_kernel, configs.candidates("fwd", d, dv)),
                                    ("dkdv", _attn_bwd_dkdv_kernel, configs.candidates("dkdv", d, dv)),
                                    ("dq", _attn_bwd_dq_kernel, configs.candidates("dq", d, dv)),
                                    ("dkdv_atomic", _attn_bwd_dkdv_kernel, configs.candidates("dkdv_atomic", d, dv))):
            for cfg in cands:
                for causal in (False, True):
                    try:
                        regs, smem, spills, wgmma, _ = compile_one(kernel, cfg, d, args.dtype, causal, args.arch,
                                                                   not args.pointer_path, tuple(args.variant),
                                                                   atomic_dq=kind == "dkdv_atomic", head_dim_v=dv)
                        rows.append((kind, d, cfg.name, causal, regs, smem, spills, wgmma))
                    except Exception as e:  # report and go on
                        msg = re.sub(r"\s+", " ", str(e))[:120]
                        rows.append((kind, d, cfg.name, causal, "ERR", msg, "", ""))
    print(f"{'kernel':11} {'d':>4} {'config':18} {'causal':6} {'regs':>5} {'smem':>7} {'spills':>6} wgmma")
    for r in rows:
        print(f"{r[0]:11} {r[1]:>4} {r[2]:18} {str(r[3]):6} {str(r[4]):>5} {str(r[5]):>7} {str(r[6]):>6} {r[7]}")


if __name__ == "__main__":
    main()
