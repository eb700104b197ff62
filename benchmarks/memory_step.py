"""Where the peak of one benchmarked step goes (GPU): runs ``tileattn bench``'s
own sweep for one point with the CUDA allocator's history on, and for every
row prints the peak, the blocks alive when the peak counter was reset, and
the blocks allocated after the reset that were alive at the peak (size and
the innermost frame outside torch), next to the target
(q, k, v, dO, O, dQ, dK, dV, lse).

    python benchmarks/memory_step.py [--seqlen 16384] [--head-dim 128] [--providers tileattn sdpa-flash]
"""
from __future__ import annotations

import argparse

import torch

from tileattn.bench import runner

MiB = 1 << 20


def _where(frames) -> str:
    for f in frames or []:
        name = f.get("filename", "")
        if "/torch/" not in name and "/triton/" not in name and "memory_step" not in name and name:
            return f"{name.rsplit('/', 2)[-1] if '/' in name else name}:{f.get('line')} {f.get('name')}"
    return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--providers", nargs="+", default=["tileattn", "sdpa-flash"])
    ap.add_argument("--modes", nargs="+", default=["fwd_bwd"])
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    marks: list = []          # (live blocks at the reset, trace length at the reset)
    peaks: list = []
    orig_clear, orig_max = runner._clear, torch.cuda.max_memory_allocated

    def clear(device):
        orig_clear(device)
        snap = torch.cuda.memory._snapshot()
        live = [(b["size"], _where(b.get("frames"))) for seg in snap["segments"] for b in seg["blocks"]
                if b["state"] == "active_allocated"]
        marks.append((live, len(snap["device_traces"][dev.index or 0]), torch.cuda.memory_allocated(device)))

    def max_allocated(device=None):
        value = orig_max(device)
        snap = torch.cuda.memory._snapshot()
        live0, start, base = marks[-1]
        events = snap["device_traces"][dev.index or 0][start:]
        cur, best, alive, at_best = base, base, {}, {}
        for e in events:
            if e["action"] == "alloc":
                cur += e["size"]
                alive[e["addr"]] = (e["size"], _where(e.get("frames")))
            elif e["action"] == "free_completed":
                cur -= e["size"]
                alive.pop(e["addr"], None)
            if cur > best:
                best, at_best = cur, dict(alive)
        peaks.append((value, base, live0, best, list(at_best.values())))
        return value

    runner._clear = clear
    torch.cuda.max_memory_allocated = max_allocated
    cfg = runner.BenchConfig(head_dims=(args.head_dim,), seqlens=(args.seqlen,), modes=tuple(args.modes),
                             causal=(False,), providers=tuple(args.providers))
    rows = runner.run_sweep(cfg)
    b, h, hkv = cfg.shape(args.seqlen, args.head_dim)
    qsz = b * h * args.seqlen * args.head_dim * 2
    target = 8 * qsz + b * h * args.seqlen * 4    # q k v dO O dQ dK dV (bf16) + lse (fp32)
    print(f"B={b} H={h} N={args.seqlen} d={args.head_dim}: one (B,H,N,D) tensor = {qsz / MiB:.0f} MiB, "
          f"target {target / MiB:.0f} MiB")
    for row, (value, base, live0, best, at_best) in zip([r for r in rows if r.peak_mem_bytes], peaks):
        print(f"\n{row.provider} {row.mode}: max_memory_allocated {value / MiB:.0f} MiB; the step's peak "
              f"(bench's peak_mem_bytes) {row.peak_mem_bytes / MiB:.0f} MiB = {row.peak_mem_bytes / target:.3f} x "
              f"target; replayed peak {best / MiB:.0f} MiB; at the reset {base / MiB:.0f} MiB alive in "
              f"{len(live0)} blocks:")
        for size, where in sorted(live0, reverse=True)[:12]:
            print(f"    {size / MiB:9.1f} MiB  {where}")
        print("  allocated after the reset and alive at the peak:")
        for size, where in sorted(at_best, reverse=True)[:12]:
            print(f"    {size / MiB:9.1f} MiB  {where}")


if __name__ == "__main__":
    main()
