"""Draw TFLOP/s vs sequence length from a compare_sdpa.py results file: one
panel per (head dim, causal, mode), one line per provider.

    python benchmarks/plot_compare.py docs/results/h200/compare_sdpa_v2.json -o docs/results/h200/tflops.png
"""
from __future__ import annotations

import argparse
import json


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(args.results))
    rows = [r for r in data["rows"] if r.get("status") == "ok"]
    panels = sorted({(r["d"], r["causal"], r["mode"]) for r in rows})
    cols = 4
    fig, axes = plt.subplots((len(panels) + cols - 1) // cols, cols, figsize=(4 * cols, 3.2 * ((len(panels) + cols - 1) // cols)),
                             squeeze=False)
    for ax, (d, causal, mode) in zip(axes.flat, panels):
        for prov in sorted({r["provider"] for r in rows}):
            pts = sorted((r["n"], r["tflops"]) for r in rows
                         if r["provider"] == prov and (r["d"], r["causal"], r["mode"]) == (d, causal, mode))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=prov,
                        linewidth=2.5 if prov == "tileattn" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d} {'causal' if causal else 'non-causal'} {mode}")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    meta = data.get("meta", {})
    fig.suptitle(f"{meta.get('gpu', '?')}, bf16, 16k tokens, torch {meta.get('torch', '?')}, "
                 f"triton {meta.get('triton', '?')}")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
