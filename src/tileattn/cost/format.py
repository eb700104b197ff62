"""Text formatting of the IO model's results: byte, FLOP and time units, and
the summary table and header that ``tileattn io`` prints and the HTML report
shows."""
from __future__ import annotations

from .roofline import Comparison


# ---------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------
def fmt_bytes(x: float, binary: bool = False) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB") if binary else ("B", "kB", "MB", "GB", "TB", "PB")
    base = 1024.0 if binary else 1000.0
    i = 0
    while abs(x) >= base and i < len(units) - 1:
        x /= base
        i += 1
    return f"{x:.3g} {units[i]}" if i else f"{x:.0f} B"


def fmt_flops(x: float) -> str:
    for unit, f in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if x >= f:
            return f"{x / f:.3g} {unit}"
    return f"{x:.3g} FLOP"


def fmt_time(t: float) -> str:
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def summary_rows(c: Comparison) -> list[tuple[str, str, str, str]]:
    """(quantity, standard, tiled, standard / tiled) rows shared by ``io`` and the report."""
    sp, tp = c.standard_pred, c.tiled_pred
    rows = []

    def ratio(a, b):
        return f"{a / b:.3g}x" if b else "-"

    f = c.flops
    rows.append(("useful FLOPs fwd (visible pairs)", fmt_flops(f.useful_fwd), fmt_flops(f.useful_fwd), "1x"))
    rows.append(("executed FLOPs fwd", fmt_flops(f.standard_fwd_executed), fmt_flops(f.tiled_fwd_executed),
                 ratio(f.standard_fwd_executed, f.tiled_fwd_executed)))
    rows.append(("executed FLOPs bwd", fmt_flops(f.standard_bwd_executed), fmt_flops(f.tiled_bwd_executed),
                 ratio(f.standard_bwd_executed, f.tiled_bwd_executed)))
    rows.append(("  of which recompute", "0", fmt_flops(f.tiled_bwd_recompute + f.tiled_bwd_split_recompute), ""))
    for ph, label in (("fwd", "fwd"), ("bwd", "bwd"), ("fwd_bwd", "fwd+bwd")):
        rows.append((f"HBM bytes {label}", fmt_bytes(sp[ph].bytes), fmt_bytes(tp[ph].bytes),
                     ratio(sp[ph].bytes, tp[ph].bytes)))
    rows.append(("tiled tile loads fwd (no L2 reuse)", "", fmt_bytes(c.tiled_no_cache.bytes("fwd")), ""))
    rows.append(("kernels fwd / bwd", f"{sp['fwd'].kernels} / {sp['bwd'].kernels}",
                 f"{tp['fwd'].kernels} / {tp['bwd'].kernels}", ""))
    for ph, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
        rows.append((f"intensity {label} (FLOP/B)", f"{sp[ph].intensity:.3g}", f"{tp[ph].intensity:.3g}", ""))
    for ph, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
        rows.append((f"bound {label} (ridge {c.ridge:.0f})", sp[ph].bound, tp[ph].bound, ""))
    for ph, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
        rows.append((f"predicted time {label}", fmt_time(sp[ph].time_s), fmt_time(tp[ph].time_s),
                     ratio(sp[ph].time_s, tp[ph].time_s)))
    rows.append(("peak N-dependent memory", fmt_bytes(c.standard_memory.peak_extra_bytes, True),
                 fmt_bytes(c.tiled_memory.peak_extra_bytes, True), ""))
    rows.append(("saved for backward", fmt_bytes(c.standard_memory.saved_for_backward_bytes, True),
                 fmt_bytes(c.tiled_memory.saved_for_backward_bytes, True), ""))
    return rows


def header_lines(c: Comparison) -> list[str]:
    hw, s = c.hardware, c.shape
    pk = c.standard_pred["fwd"].peak_flops
    bw = c.standard_pred["fwd"].bandwidth
    kv = f" kv_heads={s.kv_heads}" if s.kv_heads != s.heads else ""
    nk = f" Nk={s.seqlen_k}" if s.seqlen_k != s.seqlen_q else ""
    dv = f" dv={s.head_dim_v}" if s.head_dim_v != s.head_dim else ""
    lines = [f"{hw.display_name} ({hw.name}, {c.basis}): {pk / 1e12:.4g} TFLOP/s {s.dtype}, "
             f"{bw / 1e12:.3g} TB/s, ridge {c.ridge:.0f} FLOP/byte",
             f"shape: batch={s.batch} heads={s.heads}{kv} N={s.seqlen_q}{nk} d={s.head_dim}{dv} {s.dtype}"
             f"{' causal' if s.causal else ''}; standard = {c.fusion}; tiled configs fwd "
             f"{c.tiled.params['fwd_config']}, dK/dV {c.tiled.params['dkdv_config']}, "
             f"dQ {c.tiled.params['dq_config']}"]
    cap = hw.value("memory_capacity")
    if cap is not None:
        need = c.standard_memory.peak_extra_bytes
        if need > cap.value:
            lines.append(f"note: standard attention needs {fmt_bytes(need, True)} for scores and probabilities, "
                         f"more than the {fmt_bytes(cap.value)} on the device")
    return lines
