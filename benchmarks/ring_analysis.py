"""The ring benchmark's analysis and output, imported by ``ring_bench.py``
(whose module docstring is the usage): the cost model's columns beside each
measured point, the overlap columns from the per-step records, the line
printed per point, the CSV files and the plots.  Nothing here needs a GPU or
a process group, so ``ring_bench.py --plot DIR [--reanalyse]`` runs anywhere."""
from __future__ import annotations

import csv
import json
from pathlib import Path

HW_BY_NAME = (("H200", "nvidia-h200"), ("H100", "nvidia-h100-sxm"), ("A100", "nvidia-a100-80gb-sxm4"),
              ("4090", "nvidia-rtx-4090"), ("3090", "nvidia-rtx-3090"), ("MI300X", "amd-instinct-mi300x"))


# ---------------------------------------------------------------------------
# 3. Model
# ---------------------------------------------------------------------------
def model_hardware(ctx, args):
    """The catalogue entry the model uses: --hw, else the one named by the device, else None."""
    from tileattn.cost import get_hardware
    if args.hw != "auto":
        return get_hardware(args.hw)
    name = ctx.meta.get("gpu", "")
    for key, hw in HW_BY_NAME:
        if key in name:
            return get_hardware(hw)
    return None


def model_columns(rows: dict, shape, hw, link_bw) -> None:
    """The cost model's columns of one point's rows (mode -> row), in place:
    ``predict_ring`` with the catalogue's numbers (``model_*``) and, where one
    GPU ran the whole sequence and the link was timed, calibrated with this
    run's single-GPU TFLOP/s and link bandwidth (``model_cal_*``)."""
    from tileattn.cost import attention_flops
    from tileattn.cost.interconnect import predict_ring

    b, hq, n, d, causal = shape.batch, shape.heads, shape.seqlen, shape.head_dim, shape.causal
    for mode, row in rows.items():
        pred = predict_ring(shape, hw, mode)
        row.update(model_hw=hw.name, model_ms=pred.time_s * 1e3, model_efficiency=pred.efficiency,
                   model_hidden=pred.hidden, model_transfer_ms=pred.transfer_s * 1e3)
    fwd, both = rows.get("fwd"), rows.get("fwd_bwd")
    if fwd and both and fwd.get("single_ms") and both.get("single_ms") and link_bw:
        f_fwd = attention_flops(b, hq, n, n, d, causal=causal, mode="fwd")
        f_bwd = attention_flops(b, hq, n, n, d, causal=causal, mode="bwd")
        t_bwd = max(both["single_ms"] - fwd["single_ms"], 1e-6)
        tflops = {"fwd": f_fwd / (fwd["single_ms"] * 1e-3) / 1e12, "bwd": f_bwd / (t_bwd * 1e-3) / 1e12}
        for mode, row in rows.items():
            pred = predict_ring(shape, hw, mode, tflops=tflops, link_bw=link_bw)
            row.update(model_cal_ms=pred.time_s * 1e3, model_cal_efficiency=pred.efficiency,
                       model_cal_tflops_fwd=tflops["fwd"], model_cal_tflops_bwd=tflops["bwd"])


# ---------------------------------------------------------------------------
# Overlap
# ---------------------------------------------------------------------------
def overlap_columns(mode: str, world: int, t_kv: float, t_dkv: float, records: list[dict]) -> dict:
    """How much of the ring's communication hid behind compute, from one
    profiled call's per-step records (all ranks) and the transfers timed alone.

    A transfer posted while compute remains can hide: in the forward the
    ``world - 1`` K/V hops, in the backward also ``world - 1`` hops of K/V
    with the dK/dV accumulators.  The backward's last dK/dV hop (record kind
    ``dkdv-return``) brings the gradients home after the last compute step,
    so nothing can hide it; its wait is reported apart (``final_wait_ms``,
    whose excess over ``final_hop_ms`` is the neighbour finishing later).

    ``hidden_fraction = 1 - loop_wait_ms / loop_transfer_ms`` with
    ``loop_wait_ms`` the largest over ranks of the waits outside the last hop.
    """
    ranks = sorted({int(r["rank"]) for r in records})
    loop_wait = final_wait = compute = 0.0
    for rank in ranks:
        mine = [r for r in records if int(r["rank"]) == rank]
        compute = max(compute, sum(float(r["compute_ms"]) for r in mine))
        loop_wait = max(loop_wait, sum(float(r["wait_ms"]) for r in mine if r["kind"] != "dkdv-return"))
        final_wait = max(final_wait, sum(float(r["wait_ms"]) for r in mine if r["kind"] == "dkdv-return"))
    hops = world - 1
    loop_transfer = hops * t_kv + (hops * (t_kv + t_dkv) if mode == "fwd_bwd" else 0.0)
    final_hop = t_dkv if mode == "fwd_bwd" and world > 1 else 0.0
    return dict(step_compute_ms=compute, step_wait_ms=loop_wait + final_wait, loop_transfer_ms=loop_transfer,
                loop_wait_ms=loop_wait, final_hop_ms=final_hop, final_wait_ms=final_wait,
                transfer_ms=loop_transfer + final_hop,
                hidden_fraction=(max(0.0, 1.0 - loop_wait / loop_transfer) if loop_transfer else None))


def reanalyse(out: Path) -> None:
    """Recompute the overlap columns of a saved run from its per-step records
    (older runs kept only the total transfer: the two hop times are recovered
    from it and the measured link bandwidth)."""
    from tileattn.cost.interconnect import RingShape, ring_step_bytes

    rows, steps = _read_csv(out / "ring_bench.csv"), _read_csv(out / "ring_steps.csv")
    key = lambda r: (r["mask"], int(r["seqlen"]))  # noqa: E731
    for row in rows:
        w = int(row["world_size"])
        if row.get("t_kv_ms") is None:
            shape = RingShape(int(row["batch"]), int(row["heads"]), int(row["kv_heads"]), int(row["seqlen"]),
                              int(row["head_dim"]), w, bool(row["causal"]), row["layout"], row["dtype"])
            t_kv = ring_step_bytes(shape, "fwd") / (row["link_gbs_measured"] * 1e9) * 1e3
            both = next(r for r in rows if key(r) == key(row) and r["mode"] == "fwd_bwd")
            # the earlier run's total for fwd_bwd was (w - 1) t_kv + w t_dkv
            row.update(t_kv_ms=t_kv, t_dkv_ms=(both["transfer_ms"] - (w - 1) * t_kv) / w)
    for row in rows:
        mine = [s for s in steps if key(s) == key(row) and s["mode"] == row["mode"]]
        row.update(overlap_columns(row["mode"], int(row["world_size"]), row["t_kv_ms"], row["t_dkv_ms"], mine))
    _write_csv(out / "ring_bench.csv", rows)
    with open(out / "ring_bench.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------
def point_line(n: int, mask: str, row: dict) -> str:
    """The line printed for one measured point and mode."""
    eff = row.get("efficiency")
    return (f"{n:>8} {mask:<18} {row['mode']:<8} ring {row['ring_ms']:9.2f} ms "
            f"({row['ring_tflops_per_gpu']:6.1f} TFLOP/s/GPU)  1 GPU "
            f"{row.get('single_ms') or float('nan'):9.2f} ms  eff "
            f"{eff if eff is not None else float('nan'):.3f}  hidden "
            f"{row.get('hidden_fraction') if row.get('hidden_fraction') is not None else float('nan'):.2f}"
            f"  model {row.get('model_ms') or float('nan'):9.2f} ms "
            f"(cal {row.get('model_cal_ms') or float('nan'):.2f})")


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})


def _read_csv(path: Path) -> list[dict]:
    def conv(v):
        if v in ("True", "False"):
            return v == "True"
        try:
            return float(v) if any(c in v for c in ".eE") or v.lstrip("-").isdigit() else v
        except ValueError:
            return v
    with open(path) as fh:
        return [{k: (None if v == "" else conv(v)) for k, v in r.items()} for r in csv.DictReader(fh)]


def plot(out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _read_csv(out / "ring_bench.csv")
    if not rows:
        return []
    r0 = rows[0]
    title = (f"ring attention, {int(r0['world_size'])}x {r0.get('gpu', '?')}, {r0['dtype']}, B={int(r0['batch'])} "
             f"Hq={int(r0['heads'])} Hkv={int(r0['kv_heads'])} D={int(r0['head_dim'])}, commit {r0.get('git_commit')}")
    panels = sorted({(r["mask"], r["mode"]) for r in rows})
    written = []
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 6.6), squeeze=False)
    for j, (mask, mode) in enumerate(panels):
        sel = sorted((r for r in rows if (r["mask"], r["mode"]) == (mask, mode)), key=lambda r: r["seqlen"])
        x = [r["seqlen"] for r in sel]
        ax = axes[0][j]
        for key, label, style in (("ring_ms", f"ring ({int(r0['world_size'])} GPUs)", "o-"),
                                  ("single_ms", "1 GPU", "s-"), ("model_ms", "model (catalogue)", "--"),
                                  ("model_cal_ms", "model (calibrated)", ":")):
            pts = [(xi, r.get(key)) for xi, r in zip(x, sel) if r.get(key)]
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{mask}, {mode}")
        ax.set_ylabel("ms per call")
        ax.grid(alpha=0.3)
        ax = axes[1][j]
        for key, label, style in (("efficiency", "measured", "o-"), ("model_efficiency", "model (catalogue)", "--"),
                                  ("model_cal_efficiency", "model (calibrated)", ":"),
                                  ("hidden_fraction", "in-loop transfer hidden", "^-")):
            pts = [(xi, r.get(key)) for xi, r in zip(x, sel) if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("tokens (global)")
        ax.set_ylabel("scaling efficiency / fraction")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    axes[1][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = out / "ring_scaling.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(str(path))
    steps_path = out / "ring_steps.csv"
    if steps_path.exists():
        steps = _read_csv(steps_path)
        n_max = int(max(r["seqlen"] for r in steps))
        sel = [r for r in steps if r["seqlen"] == n_max and r["mode"] == max(r["mode"] for r in steps)]
        groups = sorted({(r["mask"], int(r["rank"])) for r in sel})
        fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.4), squeeze=False)
        for ax, (mask, rank) in zip(axes[0], groups):
            rs = [r for r in sel if r["mask"] == mask and int(r["rank"]) == rank]
            labels = [f"{r['phase'][0]}{int(r['step'])}" for r in rs]
            ax.bar(labels, [r["compute_ms"] for r in rs], label="compute")
            ax.bar(labels, [r["wait_ms"] for r in rs], bottom=[r["compute_ms"] for r in rs], label="exposed wait")
            ax.set_title(f"{mask}, rank {rank}", fontsize=9)
            ax.set_ylabel("ms")
            ax.tick_params(axis="x", labelsize=7, rotation=90)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"per-step compute vs exposed wait (transfer not hidden, or a slower neighbour), {n_max} tokens "
                     f"(f = forward, b = backward)",
                     fontsize=9)
        fig.tight_layout()
        path = out / "ring_steps.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(str(path))
    return written
