"""Figures from a results file (``bench.jsonl`` or ``bench.csv``):

* ``tflops.png``: TFLOP/s vs N, one panel per (head dim, causal, mode), one
  line per provider (rows with status ``ok`` only: failed, out-of-memory and
  wrong results are not drawn);
* ``speedup.png``: each provider's speed-up over standard attention (over
  ``baseline``, by default SDPA-cuDNN or the first SDPA backend, where the
  run has no standard-attention rows);
* ``memory.png``: peak memory vs N, out-of-memory points marked with a cross
  at the top of the panel (where standard attention runs out of memory).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .results import load_rows

PANEL_COLS = 4


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _panels(rows) -> list[tuple]:
    return sorted({(r["head_dim"], bool(r["causal"]), r["mode"]) for r in rows},
                  key=lambda p: (p[0], p[1], ("fwd", "bwd", "fwd_bwd").index(p[2]) if p[2] in
                                 ("fwd", "bwd", "fwd_bwd") else 9))


def _providers(rows) -> list[str]:
    return list(dict.fromkeys(r["provider"] for r in rows))


def _sel(rows, panel, provider):
    d, causal, mode = panel
    return [r for r in rows if r["provider"] == provider and r["head_dim"] == d
            and bool(r["causal"]) == causal and r["mode"] == mode]


def _figure(plt, n_panels):
    nrows = max(1, -(-n_panels // PANEL_COLS))
    ncols = min(PANEL_COLS, max(1, n_panels))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows), squeeze=False)
    return fig, list(axes.flat)


def _title(rows, what) -> str:
    r = rows[0]
    return (f"{what}: {r.get('gpu', '?')}, {r.get('dtype', '?')}, torch {r.get('torch', '?')}, "
            f"triton {r.get('triton', '?')}, commit {r.get('git_commit', '?')}")


def _finish(fig, axes, n_panels, path, title):
    for ax in axes[n_panels:]:
        ax.axis("off")
    handles, labels = {}, {}
    for ax in axes[:n_panels]:
        for h_, l_ in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(l_, h_)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 7),
                   fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06 if handles else 0, 1, 0.95))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _axis(ax, panel, ylabel):
    d, causal, mode = panel
    ax.set_xscale("log", base=2)
    ax.set_title(f"d={d} {'causal' if causal else 'non-causal'} {mode}", fontsize=9)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def _style(provider):
    return {"linewidth": 2.5 if provider == "tileattn" else 1.2, "marker": "o", "markersize": 3.5}


def plot_tflops(rows: list[dict], path) -> Path:
    plt = _plt()
    panels = _panels(rows)
    fig, axes = _figure(plt, len(panels))
    for ax, panel in zip(axes, panels):
        for i, prov in enumerate(_providers(rows)):
            pts = sorted((r["seqlen_q"], r["tflops"]) for r in _sel(rows, panel, prov)
                         if r["status"] == "ok" and r.get("tflops") is not None)
            if pts:
                ax.plot(*zip(*pts), label=prov, color=f"C{i % 10}", **_style(prov))
        _axis(ax, panel, "TFLOP/s")
    out = _finish(fig, axes, len(panels), path, _title(rows, "TFLOP/s"))
    plt.close(fig)
    return out


def plot_speedup(rows: list[dict], path, baseline: str = "standard") -> Path:
    plt = _plt()
    panels = _panels(rows)
    fig, axes = _figure(plt, len(panels))
    for ax, panel in zip(axes, panels):
        base = {r["seqlen_q"]: r["ms"] for r in _sel(rows, panel, baseline)
                if r["status"] == "ok" and r.get("ms")}
        for i, prov in enumerate(_providers(rows)):
            if prov == baseline:
                continue
            pts = sorted((r["seqlen_q"], base[r["seqlen_q"]] / r["ms"]) for r in _sel(rows, panel, prov)
                         if r["status"] == "ok" and r.get("ms") and r["seqlen_q"] in base)
            if pts:
                ax.plot(*zip(*pts), label=prov, color=f"C{i % 10}", **_style(prov))
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        _axis(ax, panel, f"speed-up over {baseline}")
    what = "standard attention" if baseline == "standard" else baseline
    out = _finish(fig, axes, len(panels), path, _title(rows, f"speed-up over {what}"))
    plt.close(fig)
    return out


def plot_memory(rows: list[dict], path) -> Path:
    plt = _plt()
    panels = _panels(rows)
    fig, axes = _figure(plt, len(panels))
    for ax, panel in zip(axes, panels):
        oom_label_done = False
        for i, prov in enumerate(_providers(rows)):
            sel = _sel(rows, panel, prov)
            pts = sorted((r["seqlen_q"], r["peak_mem_bytes"] / 2**30) for r in sel
                         if r["status"] == "ok" and r.get("peak_mem_bytes") is not None)
            color = f"C{i % 10}"
            if pts:
                ax.plot(*zip(*pts), label=prov, color=color, **_style(prov))
            ooms = sorted(r["seqlen_q"] for r in sel if r["status"] == "oom")
            if ooms:
                # y in axes coordinates: the top of the panel, whatever the scale
                ax.scatter(ooms, [0.95] * len(ooms), transform=ax.get_xaxis_transform(), marker="x", s=60,
                           color=color, label=None if oom_label_done else "out of memory", zorder=5)
                for n in ooms:
                    ax.annotate(f"{prov} OOM", (n, 0.95), xycoords=ax.get_xaxis_transform(), fontsize=7,
                                xytext=(0, -12), textcoords="offset points", ha="center", color=color)
                oom_label_done = True
        _axis(ax, panel, "peak memory (GiB)")
        if not ax.lines and not ax.collections:
            ax.text(0.5, 0.5, "no peak-memory data\n(measured on CUDA only)", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="grey")
    out = _finish(fig, axes, len(panels), path, _title(rows, "peak memory of the step (max_memory_allocated less what earlier work left)"))
    plt.close(fig)
    return out


def speedup_baseline(rows: list[dict], baseline: str | None = None) -> str:
    """The provider the speed-up figure divides by: ``baseline`` where given,
    else standard attention where the rows have it, else SDPA-cuDNN, else the
    first SDPA backend, else the first provider (a run without standard
    attention would otherwise draw empty panels)."""
    if baseline is not None:
        return baseline
    ran = [p for p in _providers(rows) if any(r["status"] == "ok" for r in rows if r["provider"] == p)]
    for name in ("standard", "sdpa-cudnn"):
        if name in ran:
            return name
    return next((p for p in ran if p.startswith("sdpa-")), ran[0] if ran else "standard")


def plot_results(results: str | os.PathLike | Iterable[dict], out_dir: str | os.PathLike,
                 run_id: str | None = "latest", baseline: str | None = None) -> list[Path]:
    """Draw the three figures into ``out_dir`` from a results file (or rows);
    ``run_id`` picks the run in a file that holds several (default: the last);
    ``baseline``: the speed-up figure's (:func:`speedup_baseline`)."""
    rows = load_rows(results, run_id) if isinstance(results, (str, os.PathLike)) else list(results)
    if not rows:
        raise ValueError(f"no result rows in {results}")
    out = Path(out_dir)
    return [plot_tflops(rows, out / "tflops.png"),
            plot_speedup(rows, out / "speedup.png", baseline=speedup_baseline(rows, baseline)),
            plot_memory(rows, out / "memory.png")]
