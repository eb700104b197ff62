"""benchmarks/sass_loops.py: the hot loops of a kernel's SASS.

On a listing written for the test (the shapes ptxas gives a warp-specialized
kernel: a tile loop with a try-wait whose retry copy sits after the exit and
jumps back unpredicated, a spin loop, a block only some trips run), and on
the Hopper kernels compiled for sm_90a on this machine (a fresh process: the
test process runs under TRITON_INTERPRET, where Gluon cannot compile)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import sass_loops  # noqa: E402

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0020*/              @!P0 BRA `(.L_x_9) ;
.L_x_2:
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   FFMA R3, R24, R5, -R6 ;
        /*0060*/                   MUFU.EX2 R3, R3 ;
        /*0070*/                   ISETP.GE.AND P1, PT, R7, R8, PT ;
        /*0080*/               @P1 BRA `(.L_x_3) ;
        /*0090*/                   FSEL R3, R3, RZ, P2 ;
        /*00a0*/                   FSEL R4, R4, RZ, P2 ;
        /*00b0*/                   LDL R9, [R1+0x4] ;
.L_x_3:
        /*00c0*/                   F2FP.BF16.F32.PACK_AB R10, R3, R4 ;
        /*00d0*/                   UIADD3.64 UR8, UR8, 0x2, URZ ;
.L_x_4:
        /*00e0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [UR5], R2 ;
        /*00f0*/              @!P3 BRA `(.L_x_4) ;
        /*0100*/                   IADD3 R7, R7, 0x1, RZ ;
        /*0110*/                   ISETP.NE.AND P0, PT, R7, R11, PT ;
        /*0120*/               @P0 BRA `(.L_x_1) ;
        /*0130*/                   EXIT ;
.L_x_9:
        /*0140*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0150*/              @!P0 BRA `(.L_x_9) ;
        /*0160*/                   BRA `(.L_x_2) ;
"""


def test_listing_one_tile_loop():
    loops = sass_loops.hot_loops(LISTING)
    assert len(loops) == 1, loops   # not the retry copy's jump back, not the spin loop (no MMA in it)
    loop = loops[0]
    assert (loop["start"], loop["end"]) == (0x10, 0x120)
    assert loop["instructions"] == 18
    assert loop["classes"] == {"sync": 3, "branch": 4, "fp32": 3, "mma": 1, "mufu": 1, "int": 3, "local": 1,
                               "convert": 1, "uniform": 1}
    # the shortest trip skips the block behind the predicated branch forward (2 FSEL and the LDL)
    assert loop["trip"] == 15
    assert "local" not in loop["trip_classes"] and loop["trip_classes"]["fp32"] == 1


def test_chain_after_the_mma_wait():
    # LISTING after its DEPBAR: FFMA R3 (4) -> MUFU R3 (+20) -> FSEL R3 (+4) -> F2FP R10 (+6) = 34 clocks; the
    # compare, the LDL off the chain (R1 is ready) and the loop counter's IADD3 do not lengthen it
    (loop,) = sass_loops.hot_loops(LISTING)
    assert loop["chain"] == 34
    # a row's max over four registers as one chain (3 dependent FMNMX after the first) against a tree (2 levels)
    head = "        /*0000*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;\n" \
           "        /*0010*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
    linear = ["FMNMX R30, R24, R25, !PT", "FMNMX R30, R26, R30, !PT", "FMNMX R30, R27, R30, !PT"]
    tree = ["FMNMX R30, R24, R25, !PT", "FMNMX R31, R26, R27, !PT", "FMNMX R30, R30, R31, !PT"]
    chains = []
    for body in (linear, tree):
        listing = head + "".join(f"        /*{0x20 + 16 * i:04x}*/                   {x} ;\n" for i, x in enumerate(body))
        chains.append(sass_loops.chain_after_wait(sass_loops.parse(listing)[0]))
    assert chains == [12, 8]
    assert sass_loops.chain_after_wait(sass_loops.parse(head.splitlines()[0])[0]) == 0   # no wait: no chain


def test_classify_names_the_units():
    cases = {"HGMMA.64x64x16.F32.BF16": "mma", "MUFU.EX2": "mufu", "FMNMX": "fp32", "F2FP.BF16.F32.PACK_AB": "convert",
             "UTMAREDG.4D.ADD": "tma", "R2UR": "uniform", "UIADD3.64": "uniform", "STL.64": "local",
             "LDSM.16.M88.4": "shared", "LDG.E": "global", "SYNCS.ARRIVE.TRANS64.A1T0": "sync", "BRA": "branch",
             "IMAD.WIDE.U32": "int", "SHFL.BFLY": "int", "XYZZY": "other"}
    assert {op: sass_loops.classify(op) for op in cases} == cases


def test_shortest_trip_through_if_else():
    # if/else: the predicated branch jumps to the else side, the then side ends in an unpredicated
    # jump over it; the shortest trip runs the shorter side only
    listing = """
.L_x_1:
        /*0000*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
        /*0010*/               @P1 BRA `(.L_x_2) ;
        /*0020*/                   FADD R1, R1, R2 ;
        /*0030*/                   FADD R1, R1, R2 ;
        /*0040*/                   FADD R1, R1, R2 ;
        /*0050*/                   BRA `(.L_x_3) ;
.L_x_2:
        /*0060*/                   FMUL R1, R1, R2 ;
.L_x_3:
        /*0070*/               @P0 BRA `(.L_x_1) ;
        /*0080*/                   EXIT ;
"""
    (loop,) = sass_loops.hot_loops(listing)
    assert loop["instructions"] == 8 and loop["trip"] == 4
    assert loop["trip_classes"] == {"mma": 1, "branch": 2, "fp32": 1}


def _compiled_loops(names):
    code = ("import json, sys; sys.path.insert(0, sys.argv[2]); import sass_loops, ptx_identity\n"
            "cases = ptx_identity.hopper_cases()\n"
            "print(json.dumps({n: sass_loops.case_loops((n, cases[n]))[1] for n in json.loads(sys.argv[1])}))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(names), str(BENCH)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_hopper_kernels_tile_loops():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from tileattn import configs
    fwd, bwd = "hopper-fwd-d64-64-full", "hopper-bwd-d128-128-full"
    got = _compiled_loops([fwd, bwd])
    for name in (fwd, bwd):
        assert not isinstance(got[name], str), got[name]
    f = configs.HOPPER_FWD[(64, 64)]
    # one loop a softmax warpgroup: Q Kᵀ (64 x 128, d / 16 MMAs) and P V (block_n / 16), an exp2 a score
    assert len(got[fwd]) == 2, got[fwd]
    for loop in got[fwd]:
        assert loop["opcodes"]["HGMMA.64x128x16.F32.BF16"] == 64 // 16
        assert loop["opcodes"]["HGMMA.64x64x16.F32.BF16"] == f.block_n // 16
        assert loop["trip_classes"]["mufu"] >= f.block_m * f.block_n // 128
        assert loop["trip"] < loop["instructions"]   # the masked softmax is off the shortest trip
    # one loop a compute warpgroup, each with the tile's products' MMAs: Sᵀ and dPᵀ (d / 16 each), dV and
    # dK (block_m / 16 each) and its half of dQ (the program's 2 * block_n keys / 16)
    b = configs.HOPPER_BWD[(128, 128)]
    assert len(got[bwd]) == 2, got[bwd]
    for loop in got[bwd]:
        assert loop["classes"]["mma"] == 2 * (128 // 16) + 2 * (b.block_m // 16) + 2 * b.block_n // 16
        assert loop["trip_classes"]["mufu"] >= b.block_m * b.block_n // 128
