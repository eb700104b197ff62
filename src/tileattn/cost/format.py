"""Text formatting of the IO model's results: byte, FLOP and time units, and
the summary table and header that ``tileattn io`` prints and the HTML report
shows."""
from __future__ import annotations

from .roofline import Comparison, fit_notes

NOT_RUNNABLE = "does not run"


# ---------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------
def _digits(x: float) -> str:
    """Three significant digits, or the whole number where that would take
    an exponent (1000 and up)."""
    text = f"{x:.3g}"
    return f"{x:.0f}" if "e" in text else text


def _scaled(x: float, units: tuple[str, ...], base: float) -> str:
    """``x`` (in units[0]) with three significant digits in the largest unit
    that keeps it below ``base`` once rounded (999.7 kB is "1 MB", not
    "1e+03 kB"); values from 1000 up to a base of 1024, and past the last
    unit, as whole numbers ("1000 KiB", "3552 PiB")."""
    i = 0
    while i < len(units) - 1 and round(abs(x)) >= base:
        x /= base
        i += 1
    return f"{_digits(x)} {units[i]}"


def fmt_bytes(x: float, binary: bool = False) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB") if binary else ("B", "kB", "MB", "GB", "TB", "PB")
    base = 1024.0 if binary else 1000.0
    if round(abs(x)) < base:
        return f"{x:.0f} B"
    return _scaled(x, units, base)


def fmt_flops(x: float) -> str:
    if x < 1e6:
        return f"{_digits(x)} FLOP"
    return _scaled(x / 1e6, ("MFLOP", "GFLOP", "TFLOP", "PFLOP"), 1000.0)


def fmt_time(t: float) -> str:
    if t >= 0.9995:
        return f"{_digits(t)} s"
    return _scaled(t * 1e6, ("µs", "ms"), 1000.0)


def summary_rows(c: Comparison) -> list[tuple[str, str, str, str]]:
    """(quantity, standard, tiled, standard / tiled) rows shared by ``io`` and
    the report.  Where the tiled kernels of a phase refuse the shape on this
    device (:meth:`Comparison.runnable`), its tiled cells read "does not run"
    (the header's note says why) instead of numbers."""
    sp, tp = c.standard_pred, c.tiled_pred
    rows = []
    ok = {ph: c.runnable(ph) for ph in ("fwd", "bwd", "fwd_bwd")}

    def ratio(a, b, ph="fwd"):
        return f"{a / b:.3g}x" if b and ok[ph] else "-"

    def tiled(text, ph):
        return text if ok[ph] else NOT_RUNNABLE

    f = c.flops
    rows.append(("useful FLOPs fwd (visible pairs)", fmt_flops(f.useful_fwd), fmt_flops(f.useful_fwd), "1x"))
    rows.append(("executed FLOPs fwd", fmt_flops(f.standard_fwd_executed),
                 tiled(fmt_flops(f.tiled_fwd_executed), "fwd"),
                 ratio(f.standard_fwd_executed, f.tiled_fwd_executed)))
    rows.append(("executed FLOPs bwd", fmt_flops(f.standard_bwd_executed),
                 tiled(fmt_flops(f.tiled_bwd_executed), "bwd"),
                 ratio(f.standard_bwd_executed, f.tiled_bwd_executed, "bwd")))
    rows.append(("  of which recompute", "0",
                 tiled(fmt_flops(f.tiled_bwd_recompute + f.tiled_bwd_split_recompute), "bwd"), ""))
    for ph, label in (("fwd", "fwd"), ("bwd", "bwd"), ("fwd_bwd", "fwd+bwd")):
        rows.append((f"HBM bytes {label}", fmt_bytes(sp[ph].bytes), tiled(fmt_bytes(tp[ph].bytes), ph),
                     ratio(sp[ph].bytes, tp[ph].bytes, ph)))
    rows.append(("tiled tile loads fwd (no L2 reuse)", "", tiled(fmt_bytes(c.tiled_no_cache.bytes("fwd")), "fwd"),
                 ""))
    rows.append(("kernels fwd / bwd", f"{sp['fwd'].kernels} / {sp['bwd'].kernels}",
                 f"{tp['fwd'].kernels if ok['fwd'] else '-'} / {tp['bwd'].kernels if ok['bwd'] else '-'}", ""))
    for ph, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
        rows.append((f"intensity {label} (FLOP/B)", f"{sp[ph].intensity:.3g}", tiled(f"{tp[ph].intensity:.3g}", ph),
                     ""))
    for ph, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
        rows.append((f"bound {label} (ridge {c.ridge:.0f})", sp[ph].bound, tiled(tp[ph].bound, ph), ""))
    for ph, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
        rows.append((f"predicted time {label}", fmt_time(sp[ph].time_s), tiled(fmt_time(tp[ph].time_s), ph),
                     ratio(sp[ph].time_s, tp[ph].time_s, ph)))
    rows.append(("peak N-dependent memory", fmt_bytes(c.standard_memory.peak_extra_bytes, True),
                 tiled(fmt_bytes(c.tiled_memory.peak_extra_bytes, True), "fwd"), ""))
    rows.append(("saved for backward", fmt_bytes(c.standard_memory.saved_for_backward_bytes, True),
                 tiled(fmt_bytes(c.tiled_memory.saved_for_backward_bytes, True), "fwd"), ""))
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
    return lines + fit_notes(c)
