"""Is the PTX of the kernels unchanged by a refactor?  Compiles the training
kernels (forward, dK/dV, dQ, the atomic dK/dV), the decoding kernel and the
Gluon Hopper kernels (``--only hopper``) for sm_90 ahead of time (no GPU, no TRITON_INTERPRET) over a named set of cases,
saves the PTX, or compares it with a saved set after normalising both
(line info, debug sections, comments and inline-asm markers removed).

    python benchmarks/ptx_identity.py --save /tmp/ptx-before     # before the change
    python benchmarks/ptx_identity.py --compare /tmp/ptx-before  # after it

``--compare`` prints, per case, "same" or the number of differing lines,
with registers / shared memory / spills before and after, and exits 1 when
any case differs.  ``--only REGEX`` restricts the cases; ``--jobs N``
compiles in N processes.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("", "varlen", "window", "softcap", "alibi", "block_sparse")


def training_cases():
    """name -> (kind, head_dim, causal, use_tma, variant): bf16, the first
    config of each kernel's candidates."""
    cases = {}
    for kind in ("fwd", "dkdv", "dq", "dkdv_atomic"):
        for d in (64, 128):
            for causal in (False, True):
                for tma in (True, False):
                    for var in VARIANTS:
                        name = f"{kind}-d{d}-{'causal' if causal else 'full'}-{'tma' if tma else 'ptr'}"
                        cases[name + (f"-{var}" if var else "")] = ("train", kind, d, causal, tma, var)
    return cases


# name -> keyword arguments of compile_report.compile_decode
_MLA = dict(head_dim=576, head_dim_v=512, shared_kv=True, row_strides_16=True)
DECODE_CASES = {
    "decode-contig-tma-N128": dict(block_n=128, num_warps=4, num_stages=3),
    "decode-contig-tma-N128-softcap": dict(block_n=128, num_warps=4, num_stages=3, SOFTCAP=True),
    "decode-contig-tma-N128-alibi": dict(block_n=128, num_warps=4, num_stages=3, HAS_ALIBI=True),
    "decode-contig-tma-N128-left": dict(block_n=128, num_warps=4, num_stages=3, HAS_LEFT=True),
    "decode-contig-tma-N128-d64": dict(block_n=128, num_warps=4, num_stages=3, head_dim=64),
    "decode-contig-ptr-N64": dict(block_n=64, num_warps=4, num_stages=3, descriptors=False),
    "decode-contig-ptr-N64-left": dict(block_n=64, num_warps=4, num_stages=3, descriptors=False, HAS_LEFT=True),
    "decode-contig-ptr-N64-softcap-alibi": dict(block_n=64, num_warps=4, num_stages=3, descriptors=False,
                                                SOFTCAP=True, HAS_ALIBI=True),
    "decode-paged256-tma-N128": dict(block_n=128, num_warps=4, num_stages=5, page_size=256),
    "decode-paged256-tma-N64-left": dict(block_n=64, num_warps=4, num_stages=7, page_size=256, HAS_LEFT=True),
    "decode-paged16-ptr-N128": dict(block_n=128, num_warps=4, num_stages=5, page_size=16, descriptors=False),
    "decode-paged16-ptr-N128-32bit": dict(block_n=128, num_warps=4, num_stages=5, page_size=16, descriptors=False,
                                          same_kv_strides=True, offsets_32=True, SOFTCAP=True),
    "decode-paged256-ptr-N32-fp32": dict(block_n=32, num_warps=4, num_stages=4, page_size=256, descriptors=False,
                                         dtype="fp32"),
    # a V head dim of its own; the shared cache of absorbed MLA (D = 576, V = its first 512 channels)
    "decode-dv64-contig-tma-N128": dict(block_n=128, num_warps=4, num_stages=3, head_dim_v=64),
    "decode-mla-contig-tma-M64-N32": dict(block_n=32, num_warps=8, num_stages=2, block_m=64, **_MLA),
    "decode-mla-contig-tma-M16-N32": dict(block_n=32, num_warps=8, num_stages=3, **_MLA),
    "decode-mla-paged256-tma-M16-N32": dict(block_n=32, num_warps=8, num_stages=5, page_size=256, **_MLA),
    "decode-mla-paged16-ptr-M64-N32": dict(block_n=32, num_warps=8, num_stages=5, page_size=16, descriptors=False,
                                           block_m=64, **_MLA),
}


def hopper_cases():
    """name -> ("hopper", kernel, QK head dim, V head dim or rows, causal, sinks or paged, paired): the
    Gluon kernels at every table config (the backward's causal one also forced into key-block pairs; the
    forward at d <= 128 also persistent, with sinks, the output's remainder or ``defer_o``), and the
    absorbed decoding kernel at 16 and 32 rows, contiguous and paged."""
    from tileattn import configs
    cases = {}
    for (d, dv) in configs.HOPPER_FWD:
        for causal in (False, True):
            cases[f"hopper-fwd-d{d}-{dv}-{'causal' if causal else 'full'}"] = ("hopper", "fwd", d, dv, causal, False,
                                                                                False)
    # the forward at d <= 128 with opt-in flags: persistent plain, with sinks, with sinks and the output's
    # remainder, with defer_o (also with sinks and the remainder); the rows' max and sum as trees (row_tree), one
    # program a tile and persistent
    for d in (64, 128):
        for causal in (False, True):
            for extra in ("-pers", "-pers-sinks", "-pers-sinks-remainder", "-pers-dfo", "-pers-dfo-sinks-remainder",
                          "-rt", "-pers-rt", "-pers-rt-sk"):
                cases[f"hopper-fwd-d{d}-{d}-{'causal' if causal else 'full'}{extra}"] = (
                    "hopper", "fwd-flags", d, d, causal, extra, False)
    # the non-causal table's config (d = 64: three softmax warpgroups), persistent, with sinks and the remainder
    for (d, dv) in configs.HOPPER_FWD_NONCAUSAL:
        for extra in ("-nc", "-nc-pers-rt", "-nc-pers-rt-sinks", "-nc-pers-rt-sinks-remainder"):
            cases[f"hopper-fwd-d{d}-{dv}-full{extra}"] = ("hopper", "fwd-flags", d, dv, False, extra, False)
    for (d, dv) in configs.HOPPER_BWD:
        for causal in (False, True):
            for sinks in ((False, True) if d == dv else (False,)):
                for paired in ((False, True) if causal and d == dv else (False,)):
                    name = (f"hopper-bwd-d{d}-{dv}-{'causal' if causal else 'full'}{'-sinks' if sinks else ''}"
                            f"{'-paired' if paired else ''}")
                    cases[name] = ("hopper", "bwd", d, dv, causal, sinks, paired)
    for rows in (16, 32):
        for paged in (False, True):
            cases[f"hopper-decode-mla-rows{rows}-{'paged' if paged else 'contig'}"] = ("hopper", "decode", 576, rows,
                                                                                       True, paged, False)
    return cases


def all_cases():
    cases = training_cases()
    cases.update({name: ("decode", kw) for name, kw in DECODE_CASES.items()})
    cases.update(hopper_cases())
    return cases


def _compile_hopper(case):
    import dataclasses
    from tileattn import configs
    from tileattn.launch import decode_hopper, hopper_compile
    _, kind, d, dv, causal, flag, paired = case
    if kind == "fwd":
        return hopper_compile.compile_sm90(d, configs.HOPPER_FWD[(d, dv)], causal, "bf16", False, head_dim_v=dv)
    if kind == "fwd-flags":   # "-pers" with "-dfo" or "-sinks" (and "-remainder"), "-rt" with or without it, "-sk";
        on = set(flag.split("-"))   # "-nc": the non-causal table's config (alone: as it is)
        table = configs.HOPPER_FWD_NONCAUSAL if "nc" in on else configs.HOPPER_FWD
        cfg = table[(d, dv)] if flag == "-nc" else dataclasses.replace(
            table[(d, dv)], persistent="pers" in on, defer_o="dfo" in on, row_tree="rt" in on, stream_k="sk" in on)
        return hopper_compile.compile_sm90(d, cfg, causal, "bf16", "sinks" in on, head_dim_v=dv,
                                           remainder="remainder" in on)
    if kind == "bwd":
        cfg = dataclasses.replace(configs.HOPPER_BWD[(d, dv)], pair_blocks=paired or None)
        return hopper_compile.compile_bwd_sm90(d, cfg, causal, "bf16", flag, head_dim_v=dv)
    return decode_hopper.compile_sm90(dv, flag, "bf16", causal)


_DROP = re.compile(r"^\s*(\.loc|\.file|//|\$L__tmp\d+:|\$L__func_(begin|end)\d+:)")


def normalise(ptx: str) -> str:
    """PTX without line info, the debug sections (at the end), comments and
    the labels that only the debug info refers to."""
    out = []
    for line in ptx.splitlines():
        if line.lstrip().startswith(".section"):
            break
        if _DROP.match(line):
            continue
        out.append(line.split("//")[0].rstrip())
    return "\n".join(out) + "\n"


def build(name_case):
    name, case = name_case
    import compile_report as cr
    from tileattn import configs
    try:
        if case[0] in ("decode", "hopper"):
            ck = cr.compile_decode(**case[1]) if case[0] == "decode" else _compile_hopper(case)
            ptx = ck.asm["ptx"]
            regs, spills = cr._ptxas_info(ptx, 90)
            smem = ck.metadata.shared
        else:
            _, kind, d, causal, tma, var = case
            kernel = {"fwd": cr._attn_fwd_kernel, "dkdv": cr._attn_bwd_dkdv_kernel, "dq": cr._attn_bwd_dq_kernel,
                      "dkdv_atomic": cr._attn_bwd_dkdv_kernel}[kind]
            cfg = configs.candidates(kind, d)[0]
            regs, smem, spills, _, ck = cr.compile_one(kernel, cfg, d, "bf16", causal, 90, tma,
                                                       (var,) if var else (), atomic_dq=kind == "dkdv_atomic")
            ptx = ck.asm["ptx"]
        return name, ptx, {"regs": regs, "smem": smem, "spills": spills}
    except Exception as e:  # noqa: BLE001 - report and go on
        return name, None, {"error": re.sub(r"\s+", " ", str(e))[:300]}


def run(names, jobs):
    cases = all_cases()
    todo = [(n, cases[n]) for n in names]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as ex:
            yield from ex.map(build, todo)
    else:
        yield from map(build, todo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", metavar="DIR")
    mode.add_argument("--compare", metavar="DIR")
    ap.add_argument("--only", default="", help="regular expression over case names")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--diff", action="store_true", help="print the differing lines")
    args = ap.parse_args()
    names = [n for n in all_cases() if re.search(args.only, n)]
    folder = Path(args.save or args.compare)
    if args.save:
        folder.mkdir(parents=True, exist_ok=True)
        info = {}
        for name, ptx, meta in run(names, args.jobs):
            info[name] = meta
            if ptx is not None:
                (folder / f"{name}.ptx").write_text(ptx)
            print(name, meta, flush=True)
        old = json.loads((folder / "info.json").read_text()) if (folder / "info.json").exists() else {}
        old.update(info)
        (folder / "info.json").write_text(json.dumps(old, indent=1, sort_keys=True))
        return 0
    info = folder / "info.json"
    before = json.loads(info.read_text()) if info.exists() else {}
    differ = 0
    print(f"{'case':48} {'ptx':>9}  regs      smem           spills")
    for name, ptx, meta in run(names, args.jobs):
        b = before.get(name, {})
        path = folder / f"{name}.ptx"
        if ptx is None or not path.exists():
            verdict = "error" if ptx is None else "new"
            differ += 1
        else:
            old, ptx = normalise(path.read_text()), normalise(ptx)
            if old == ptx:
                verdict = "same"
            else:
                diff = [l for l in difflib.unified_diff(old.splitlines(), ptx.splitlines(), lineterm="", n=0)
                        if l[:1] in "+-" and not l.startswith(("+++", "---"))]
                verdict = f"{len(diff)} lines"
                differ += 1
                if args.diff:
                    print("\n".join(diff[:80]))
        print(f"{name:48} {verdict:>9}  {b.get('regs')}->{meta.get('regs')}  "
              f"{b.get('smem')}->{meta.get('smem')}  {b.get('spills')}->{meta.get('spills')}"
              + (f"  {meta['error']}" if "error" in meta else ""), flush=True)
    print(f"{differ} of {len(names)} cases differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
