"""What one trip of a Hopper kernel's tile loop issues: the innermost loops
that hold warpgroup MMAs in the assembler's output (SASS, sm_90a, compiled on
the CPU; no GPU), their instructions by class.

A compute partition's loop body is one tile's work; its instruction count
against the tile's MMA time says how close the warps come to their issue
slots (one warp instruction a clock per SM sub-partition; perf-notes v21:
the d = 64 forward's softmax already issues ~2/3 of them), and its
local-memory loads and stores say whether ptxas spilled inside the loop or
around it.  Two counts a loop: the whole body (static: a body that branches,
as the forward's masked and unmasked softmax, counts both sides) and its
shortest trip (the fewest instructions from the body's start to its back
edge: a block that only some trips run, such as the masked softmax, a last
tile's fix-up or a turn taken every other tile, is left out), and the
longest chain of register dependences from the loop's first MMA wait to its
end in a crude latency model (``chain_after_wait``: how long the softmax
between the S product and the next products is at the least, for comparing
builds; perf-notes v44).

    python benchmarks/sass_loops.py --only "hopper-bwd-d192"         # the cases of ptx_identity.py
    python benchmarks/sass_loops.py --only "fwd-d64-64-full" --opcodes

Loops are found from predicated backward branches (a loop's back edge):
a body is [target, branch].  Spin loops on an mbarrier hold no MMA; the
out-of-line copies of a try-wait that ptxas places after the function's
exit jump back into a loop unpredicated, so they are not taken for one.
Of the MMA-holding bodies, those that hold no other are reported.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_LABEL = re.compile(r"^\s*\.(L_x_\d+):")
_TARGET = re.compile(r"\.(L_x_\d+)")

# (class, opcode prefixes), first match wins: the copy engine's opcodes before the uniform datapath's
CLASSES = (
    ("mma", ("HGMMA",)),
    ("mufu", ("MUFU",)),
    ("fp32", ("FFMA", "FADD", "FMUL", "FMNMX", "FSEL", "FSETP", "FCHK", "FSWZADD")),
    ("convert", ("F2FP", "F2F", "I2F", "F2I", "FRND")),
    ("tma", ("UTMA", "UBLKCP", "UBLKRED")),
    ("uniform", ("U", "R2UR", "S2UR")),
    ("local", ("LDL", "STL")),
    ("shared", ("LDS", "STS", "LDSM", "STSM")),
    ("global", ("LDG", "STG", "RED", "ATOM", "LDC")),
    ("sync", ("BAR", "SYNCS", "WARPGROUP", "MEMBAR", "FENCE", "DEPBAR", "ELECT", "VOTE", "CCTL", "WARPSYNC")),
    ("branch", ("BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "JMP", "BRX")),
    ("int", ("IMAD", "IADD", "VIADD", "LOP", "ISETP", "SHF", "LEA", "SEL", "MOV", "IABS", "PLOP", "P2R", "R2P",
             "SGXT", "PRMT", "IMNMX", "FLO", "POPC", "BMSK", "CS2R", "S2R", "SHFL", "NOP")),
)


def classify(opcode: str) -> str:
    for name, prefixes in CLASSES:
        if opcode.startswith(prefixes):
            return name
    return "other"


def disassemble(cubin: bytes) -> str:
    """nvdisasm's listing (with line info) of a cubin; nvdisasm is the one
    Triton bundles beside its ptxas."""
    from tileattn.launch.runtime import bundled_ptxas
    tool = Path(bundled_ptxas()).with_name("nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(tool), "-c", "-g", str(path)], capture_output=True, text=True, check=True).stdout


def parse(sass: str):
    """([(address, predicated, opcode, operands)], {label: address of the instruction after it})."""
    ins, labels, pending = [], {}, []
    for line in sass.splitlines():
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        m = _INSTR.search(line)
        if m:
            addr = int(m.group(1), 16)
            ins.append((addr, bool(m.group(2)), m.group(3), m.group(4)))
            labels.update((p, addr) for p in pending)
            pending = []
    return ins, labels


def hot_loops(sass: str) -> list[dict]:
    """The innermost loops that hold warpgroup MMAs, in address order: start
    and end address, instructions, and counts by class and by opcode."""
    ins, labels = parse(sass)
    regions = set()
    for addr, predicated, op, rest in ins:
        target = _TARGET.search(rest)
        if predicated and op.startswith("BRA") and target and labels.get(target.group(1), addr + 1) <= addr:
            regions.add((labels[target.group(1)], addr))
    bodies = {r: [(op, classify(op)) for a, _, op, _ in ins if r[0] <= a <= r[1]] for r in regions}
    with_mma = [r for r, body in bodies.items() if any(c == "mma" for _, c in body)]
    inner = [r for r in with_mma if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in with_mma)]
    out = []
    for r in sorted(inner):
        body = bodies[r]
        listing = [x for x in ins if r[0] <= x[0] <= r[1]]
        trip = _shortest_trip(listing, labels)
        out.append({"start": r[0], "end": r[1], "instructions": len(body), "chain": chain_after_wait(listing),
                    "classes": dict(collections.Counter(c for _, c in body).most_common()),
                    "opcodes": dict(collections.Counter(op for op, _ in body).most_common()),
                    "trip": len(trip), "trip_classes": dict(collections.Counter(map(classify, trip)).most_common())})
    return out


# a crude latency model for chain_after_wait: clocks from an instruction's issue until a dependent one may issue
LATENCY = (("MUFU", 20), ("SHFL", 24), ("LDS", 30), ("LDL", 30), ("F2FP", 6))
_NO_DEST = ("ISETP", "FSETP", "PLOP3", "STS", "STG", "STL", "RED", "SYNCS", "BAR", "WARPGROUP", "BRA", "EXIT",
            "UTMA", "HGMMA", "FENCE", "MEMBAR", "NOP")
_REG = re.compile(r"\bR(\d+)\b")


def chain_after_wait(body) -> int:
    """The longest chain of register dependences (in clocks of ``LATENCY``,
    4 for any other instruction) through a loop body's instructions from its
    first warpgroup-MMA wait (``WARPGROUP.DEPBAR``: the scores have landed) to
    its end, in listing order: both sides of a branch count, predicates and
    uniform registers do not, the first register of an instruction is its
    destination unless the opcode writes none (compares, stores, syncs,
    MMAs).  A rough measure of the softmax's dependent depth between the S
    product and the next products, for comparing builds (0 without a wait)."""
    start = next((i for i, (_, _, op, _) in enumerate(body) if op.startswith("WARPGROUP.DEPBAR")), None)
    if start is None:
        return 0
    ready, longest = {}, 0
    for _, _, op, rest in body[start + 1:]:
        regs = _REG.findall(rest)
        if op.startswith(_NO_DEST) or not regs:
            dest, srcs = None, regs
        else:
            dest, srcs = regs[0], regs[1:]
        done = max((ready.get(r, 0) for r in srcs), default=0) + next((c for p, c in LATENCY if op.startswith(p)), 4)
        if dest is not None:
            ready[dest] = done
        longest = max(longest, done)
    return longest


def _shortest_trip(body, labels) -> list[str]:
    """The opcodes of the fewest-instruction walk from a loop body's first
    instruction to its back edge: forward branches taken or not, branches
    back within the body (spin loops) and out of it not taken, so a block
    the body may skip (the masked softmax, a last tile's fix-up) is left
    out."""
    index = {addr: i for i, (addr, *_) in enumerate(body)}
    best = [None] * len(body)   # (instructions, previous index)
    best[0] = (1, None)
    for i, (addr, predicated, op, rest) in enumerate(body[:-1]):
        if best[i] is None:
            continue
        succ = []
        target = _TARGET.search(rest) if op.startswith("BRA") else None
        if target and labels.get(target.group(1), -1) > addr and labels[target.group(1)] in index:
            succ.append(index[labels[target.group(1)]])
        if predicated or not op.startswith(("BRA", "EXIT", "RET")):
            succ.append(i + 1)
        for j in succ:
            if best[j] is None or best[i][0] + 1 < best[j][0]:
                best[j] = (best[i][0] + 1, i)
    path, i = [], len(body) - 1
    while i is not None and best[i] is not None:
        path.append(body[i][2])
        i = best[i][1]
    return path[::-1]


def format_loop(loop: dict, opcodes: bool = False) -> str:
    head = (f"  loop {loop['start']:#07x}-{loop['end']:#07x}: {loop['instructions']} instructions; "
            + ", ".join(f"{k} {v}" for k, v in loop["classes"].items())
            + f"\n    shortest trip {loop['trip']}: " + ", ".join(f"{k} {v}" for k, v in loop["trip_classes"].items())
            + f"\n    dependent chain after the first MMA wait (crude clocks): {loop['chain']}")
    if not opcodes:
        return head
    return head + "\n" + "\n".join(f"      {v:5d} {k}" for k, v in loop["opcodes"].items())


def case_loops(name_case):
    """(case name, hot loops or an error) of one of ``ptx_identity.hopper_cases()``."""
    import ptx_identity
    name, case = name_case
    try:
        return name, hot_loops(disassemble(ptx_identity._compile_hopper(case).asm["cubin"]))
    except Exception as e:  # noqa: BLE001 - report and go on
        return name, re.sub(r"\s+", " ", str(e))[:300]


def main():
    os.environ.pop("TRITON_INTERPRET", None)   # Gluon does not compile under the interpreter
    import ptx_identity
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="regular expression over ptx_identity.py's Hopper case names")
    ap.add_argument("--opcodes", action="store_true", help="every opcode's count under each loop")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    todo = [(n, c) for n, c in ptx_identity.hopper_cases().items() if re.search(args.only, n)]
    if not todo:
        sys.exit(f"no Hopper case matches {args.only!r}")
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(args.jobs) as ex:
            results = list(ex.map(case_loops, todo))
    else:
        results = map(case_loops, todo)
    failed = False
    for name, loops in results:
        print(name)
        if isinstance(loops, str):
            print(f"  error: {loops}")
            failed = True
            continue
        for loop in loops:
            print(format_loop(loop, args.opcodes))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
