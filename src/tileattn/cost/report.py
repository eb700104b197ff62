"""Self-contained HTML report: one page, every number computed for the
user's hardware and shape (plots embedded as base64 PNG)."""
from __future__ import annotations

import base64
import dataclasses
import html
import math

import numpy as np

from .format import fmt_bytes, fmt_flops, fmt_time, header_lines, summary_rows
from .io import AttentionShape
from .roofline import Comparison, compare, figure_png_bytes, plot_roofline
from .shape import KERNEL_LABELS
from .tiles import feasible_tiles, max_block_n, paper_block_sizes, table_configs_check

SECTIONS = ("problem", "identity", "bytes", "tiling", "roofline", "scaling", "limits")


def online_softmax_check(n: int = 1000, block: int = 128, d: int = 16, seed: int = 0) -> dict:
    """Run the online softmax on one random row and compare with the direct one.

    For key block j with scores s_j:  m' = max(m, max s_j),
    l' = e^(m - m') l + sum e^(s_j - m'),  o' = e^(m - m') o + e^(s_j - m') V_j.
    After the last block o / l equals softmax(s) V exactly (up to rounding)."""
    rng = np.random.default_rng(seed)
    s = rng.normal(0, 3, n)
    v = rng.normal(0, 1, (n, d))
    m, l, o = -np.inf, 0.0, np.zeros(d)
    steps = []
    for start in range(0, n, block):
        sj = s[start:start + block]
        m_new = max(m, sj.max())
        alpha = math.exp(m - m_new) if m > -np.inf else 0.0
        p = np.exp(sj - m_new)
        l = alpha * l + p.sum()
        o = alpha * o + p @ v[start:start + block]
        steps.append({"block": start // block, "m": m_new, "rescale": alpha, "l": l})
        m = m_new
    direct_p = np.exp(s - s.max())
    direct = (direct_p / direct_p.sum()) @ v
    err = float(np.abs(o / l - direct).max())
    lse_err = abs((m + math.log(l)) - (s.max() + math.log(np.exp(s - s.max()).sum())))
    return {"n": n, "block": block, "d": d, "steps": steps, "max_abs_diff": err, "lse_diff": float(lse_err)}


def _img(fig) -> str:
    return '<img alt="plot" src="data:image/png;base64,' + base64.b64encode(figure_png_bytes(fig)).decode() + '">'


def _table(head, rows) -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _scaling_figure(comp: Comparison):
    import matplotlib.pyplot as plt
    s = comp.shape
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=100)
    def vary(**kw):
        xs, std_b, til_b, sp = [], [], [], []
        key, vals = next(iter(kw.items()))
        for x in vals:
            d = dataclasses.asdict(s)
            if key == "seqlen":
                d.update(seqlen_q=x, seqlen_k=x)
            elif key == "head_dim" and s.head_dim_v == s.head_dim:
                d.update(head_dim=x, head_dim_v=x)      # one head dim stays one
            else:
                d[key] = x
            c = compare(AttentionShape(**d), comp.hardware, fusion=comp.fusion, basis=comp.basis)
            xs.append(x)
            std_b.append(c.standard_pred["fwd"].bytes)
            til_b.append(c.tiled_pred["fwd"].bytes)
            sp.append(c.speedup("fwd"))
        return xs, std_b, til_b, sp
    panels = [("seqlen", [2 ** k for k in range(8, 16)], "sequence length N", True),
              ("batch", [1, 2, 4, 8, 16, 32, 64], "batch", True),
              ("head_dim", [32, 64, 128, 256], "head dim d", True)]
    for ax, (key, vals, label, logx) in zip(axes, panels):
        xs, sb, tb, sp = vary(**{key: vals})
        ax.loglog(xs, sb, "o-", color="tab:red", label="standard HBM bytes (fwd)")
        ax.loglog(xs, tb, "s-", color="tab:blue", label="tiled HBM bytes (fwd)")
        ax.set_xlabel(label)
        ax.set_ylabel("bytes")
        ax.grid(True, which="both", alpha=0.25)
        ax2 = ax.twinx()
        ax2.semilogx(xs, sp, "k--", label="predicted speedup (fwd)")
        ax2.set_ylabel("speedup")
        if key == "seqlen":
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


CSS = """body{font-family:Georgia,serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222;line-height:1.5}
h1{font-size:1.7em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;margin:.8em 0;font-family:Menlo,Consolas,monospace;font-size:.85em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f2f2f2}.formula{font-family:Menlo,Consolas,monospace;background:#f7f7f7;padding:.5em 1em;
border-left:3px solid #88a;white-space:pre-wrap}img{max-width:100%}.ok{color:#070}.meta{color:#555;font-size:.9em}"""


def _not_run_html(comp: Comparison) -> str:
    """A paragraph naming the tiled kernels that do not run on this device ('' if all do)."""
    bad = comp.not_runnable()
    if not bad:
        return ""
    items = "".join(f"<li>{html.escape(KERNEL_LABELS[k])}: {html.escape(m)}</li>" for k, m in bad.items())
    return (f"<p><b>Not runnable here.</b> No config of these tiled kernels fits this device's shared memory, and "
            f"the kernels raise ValueError for this shape; their figures are modelled with the smallest config "
            f"only for comparison:</p><ul>{items}</ul>")


def _chosen_text(comp: Comparison) -> str:
    """Which config each kernel runs with autotuning off, as :attr:`Comparison.kernel_fit` has it."""
    parts = []
    for kind, f in comp.kernel_fit.items():
        label, name = KERNEL_LABELS[kind], f"<code>{f.config.name}</code>"
        if f.fits:
            parts.append(f"{label} {name}")
        elif f.runnable:
            parts.append(f"{label}: none fits by the estimate, so the launcher tries the smallest, {name}, and the "
                         f"compiler decides")
        else:
            parts.append(f"{label}: none fits, and the kernels refuse this shape (ValueError)")
    lead = "With autotuning off each kernel takes the first config of its table that fits"
    if all(f.fits for f in comp.kernel_fit.values()):
        return f"{lead}: {', '.join(parts)}."
    return f"{lead}, where one does: {'; '.join(parts)}."


def _roofline_text(comp: Comparison) -> str:
    tp = comp.tiled_pred
    if not comp.runnable("fwd"):
        return "The tiled kernels do not run on this device (section 4)."
    text = (f"Tiled: {tp['fwd'].intensity:.3g} FLOP/byte, {tp['fwd'].bound}-bound. Predicted speedup "
            f"{comp.speedup('fwd'):.2f}&times; forward, ")
    if comp.runnable("fwd_bwd"):
        return text + f"{comp.speedup('fwd_bwd'):.2f}&times; forward+backward."
    return text + "none forward+backward: the tiled backward does not run on this device (section 4)."


def build_report(comp: Comparison, measured=None) -> str:
    """The report as an HTML string."""
    s, hw = comp.shape, comp.hardware
    sp, tp, f = comp.standard_pred, comp.tiled_pred, comp.flops
    e = s.elem_bytes
    score_b = s.score_elements * e
    out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>tileattn IO report: "
           f"{html.escape(hw.display_name)}</title><style>{CSS}</style></head><body>",
           f"<h1>Attention IO report: {html.escape(hw.display_name)}</h1>",
           "<p class='meta'>" + "<br>".join(html.escape(x) for x in header_lines(comp)) + "</p>"]

    # 1. problem
    std_f = sp["fwd"]
    out.append(f"""<section id="problem"><h2>1. The problem: quadratic FLOPs, yet bandwidth-bound</h2>
<p>Attention over N = {s.seqlen_q} tokens computes S = QK<sup>T</sup>/&radic;d, P = softmax(S), O = PV for each of
{s.batch * s.heads} (batch &times; head) pairs. The matmuls cost {fmt_flops(f.useful_fwd)} in the forward, 4&middot;N&sup2;&middot;d
per head, but each of them does only d = {s.head_dim} multiply-adds per score. The elementwise steps between them
(scale, mask, softmax) do almost no arithmetic and each one reads and writes the whole N&times;N matrix:
{fmt_bytes(score_b)} per pass at {s.dtype}. A standard forward therefore moves {fmt_bytes(std_f.bytes)}
for {fmt_flops(std_f.flops)}, an arithmetic intensity of {std_f.intensity:.3g} FLOP/byte, while
{html.escape(hw.display_name)} needs {comp.ridge:.0f} FLOP/byte (its ridge point, peak &divide; bandwidth) to keep its
tensor cores busy. Predicted: <b>{std_f.bound}-bound</b>, {fmt_time(std_f.time_s)}, of which
{fmt_time(std_f.memory_time_s)} is spent moving bytes. It also needs {fmt_bytes(comp.standard_memory.peak_extra_bytes, True)}
for the scores and probabilities.</p></section>""")

    # 2. identity
    chk = online_softmax_check()
    steps = chk["steps"]
    rows = [(st["block"], f"{st['m']:.4f}", f"{st['rescale']:.6f}", f"{st['l']:.6f}") for st in steps]
    out.append(f"""<section id="identity"><h2>2. Why the tiled softmax is exact</h2>
<p>Split a row of scores into blocks s<sub>1</sub>, s<sub>2</sub>, &hellip; Keep a running maximum m, a running sum l
and an unnormalised output o. On block j:</p>
<div class="formula">m' = max(m, max s_j)
l' = e^(m - m') &middot; l + &Sigma; e^(s_j - m')
o' = e^(m - m') &middot; o + e^(s_j - m') V_j</div>
<p>By induction l = &Sigma;<sub>k seen</sub> e^(s_k - m) and o = &Sigma;<sub>k seen</sub> e^(s_k - m) v<sub>k</sub> for the
current m: multiplying by e^(m - m') just changes the reference point of every earlier term, so nothing is approximated.
At the end o / l = &Sigma; e^(s_k) v<sub>k</sub> / &Sigma; e^(s_k) = softmax(s)V, and m + log l is the log-sum-exp
the backward needs. Checked now on a random row of {chk['n']} scores in blocks of {chk['block']} (float64):</p>
{_table(("block", "running max m", "rescale e^(m-m')", "running sum l"), rows)}
<p class="ok">max |online &minus; direct| = {chk['max_abs_diff']:.2e} over {chk['d']} output columns;
|lse difference| = {chk['lse_diff']:.2e}.</p></section>""")

    # 3. bytes
    pass_rows = []
    for t in (comp.standard, comp.tiled):
        for p in t.passes:
            pass_rows.append((t.impl, p.phase, p.name, fmt_bytes(p.read_bytes), fmt_bytes(p.write_bytes),
                              fmt_flops(p.flops) if p.flops else "-"))
    out.append(f"""<section id="bytes"><h2>3. The bytes both implementations move</h2>
<p>Summary for this shape on {html.escape(hw.display_name)}:</p>
{_table(("quantity", "standard", "tiled", "std / tiled"), summary_rows(comp))}
<p>Pass by pass (HBM reads and writes; the standard passes follow PyTorch eager for <code>{comp.fusion}</code>):</p>
{_table(("impl", "phase", "pass", "read", "write", "FLOPs"), pass_rows)}
<p>The tiled kernel reads K and V once per query block: {fmt_bytes(comp.tiled_no_cache.bytes('fwd'))} of tile loads
in the forward, the &Theta;(N&sup2;d&sup2;/M) term. Neighbouring programs of a head stream the same K/V tiles at the
same time, so L2 serves most repeats and HBM sees about {fmt_bytes(tp['fwd'].bytes)}.</p>{_not_run_html(comp)}</section>""")

    # 4. tiling
    smem = hw.get_int("smem_per_block", comp.basis) or 0
    tile_html = "<p>This hardware entry has no shared-memory size.</p>"
    if smem:
        feas = feasible_tiles(smem, s.head_dim, s.dtype, num_stages=3, shape=dataclasses.replace(s, batch=1),
                              head_dim_v=s.head_dim_v)
        br, bc = paper_block_sizes(smem, s.head_dim, s.dtype)
        mbn = max_block_n(smem, s.head_dim, s.dtype, block_m=128, num_stages=3, head_dim_v=s.head_dim_v)
        trows = [(o.block_m, o.block_n, fmt_bytes(o.smem_bytes, True), fmt_bytes(o.hbm_bytes * s.batch))
                 for o in feas[:12]]
        cfg_rows = [(KERNEL_LABELS[k], c.name, "fits" if ok else "does not fit", c.source) for k, c, ok in
                    table_configs_check(smem, s.head_dim, s.dtype, s.head_dim_v)]
        tile_html = f"""<p>A forward program keeps a BLOCK_M&times;d Q tile, {3} stages of BLOCK_N&times;d K and V
tiles and a BLOCK_M&times;BLOCK_N tile of P in {fmt_bytes(smem, True)} of shared memory per block. The paper's sizing,
B<sub>c</sub> = &lceil;M/4d&rceil; = {bc} and B<sub>r</sub> = min(B<sub>c</sub>, d) = {br}, ignores the pipeline
buffers and the P tile; with them the largest BLOCK_N next to BLOCK_M = 128 is
<b>{mbn if mbn else 'none'}</b>. Shared memory, not the IO bound, decides BLOCK_N: the bytes depend on BLOCK_M
(K/V are re-read once per query block), not on BLOCK_N.</p>
<p>Feasible forward tiles at 3 stages, by HBM bytes without L2 reuse:</p>
{_table(("BLOCK_M", "BLOCK_N", "shared memory", "HBM bytes fwd"), trows) if trows else "<p>none fits.</p>"}
<p>The kernels' own configuration tables against this device (each kernel with its own estimator):</p>
{_table(("kernel", "config", "on this device", "source"), cfg_rows)}
<p>{_chosen_text(comp)} The model uses these unless told otherwise.</p>"""
    out.append(f'<section id="tiling"><h2>4. Tiling and the shared-memory bound</h2>{tile_html}</section>')

    # 5. roofline
    fig = plot_roofline(comp, measured=measured)
    out.append(f"""<section id="roofline"><h2>5. Roofline</h2>
<p>Ridge point {comp.ridge:.0f} FLOP/byte ({comp.basis} figures). Standard: {sp['fwd'].intensity:.3g} FLOP/byte forward,
{sp['fwd'].bound}-bound. {_roofline_text(comp)}
{'Measured points are overlaid.' if measured else ''}</p>{_img(fig)}</section>""")

    # 6. scaling
    out.append(f"""<section id="scaling"><h2>6. How the gap scales</h2>
<p>Standard bytes grow as B&middot;H&middot;N&sup2; (every elementwise pass); the tiled kernel's HBM bytes grow as
B&middot;H&middot;N&middot;d while L2 absorbs the K/V re-reads, and as N&sup2;d&sup2;/M once it cannot. Batch scales
both linearly, so the ratio does not change with batch. A larger head dim raises the standard matmuls' intensity and
the tiled kernel's N&middot;d traffic, so the ratio shrinks as d grows. Each panel varies one of N, batch, head dim
around this shape:</p>{_img(_scaling_figure(comp))}</section>""")

    # 7. limits
    small = compare(dataclasses.replace(s, seqlen_q=128, seqlen_k=128, batch=1), hw, fusion=comp.fusion,
                    basis=comp.basis)
    conc = comp.tiled.params.get("concurrent_programs")
    progs = math.ceil(s.seqlen_q / 128) * s.batch * s.heads
    out.append(f"""<section id="limits"><h2>7. What the kernel does not change</h2>
{_not_run_html(comp)}<ul><li><b>FLOPs.</b> Useful forward FLOPs are {fmt_flops(f.useful_fwd)} either way; the tiled forward executes
{fmt_flops(f.tiled_fwd_executed)} (whole tiles, including the masked part of diagonal tiles). Once the bytes are
gone, the tensor cores are the limit: {fmt_time(tp['fwd'].compute_time_s)} at peak for the forward.</li>
<li><b>The backward's recompute.</b> Not storing P means rebuilding it: the tiled backward executes
{fmt_flops(f.tiled_bwd_executed)} against {fmt_flops(f.standard_bwd_executed)} for the standard one
({fmt_flops(f.tiled_bwd_recompute)} to recompute S in the dK/dV kernel, plus {fmt_flops(f.tiled_bwd_split_recompute)}
because the separate dQ kernel rebuilds S and dP again). It pays because it is compute-bound work replacing
memory-bound work, not because it is free.</li>
<li><b>Small N is latency-bound.</b> At N = 128, batch 1, the forward moves {fmt_bytes(small.tiled_pred['fwd'].bytes)}
and is predicted <b>{small.tiled_pred['fwd'].bound}</b>-bound ({fmt_time(small.tiled_pred['fwd'].time_s)}, standard
{fmt_time(small.standard_pred['fwd'].time_s)}): launch overhead, not bytes, sets the time.</li>
<li><b>Occupancy.</b> This shape launches {progs} forward programs; about {conc or 'an unknown number'} run at once
on {hw.get_int('sm_count') or '?'} SMs. Fewer programs than that (small batch&times;heads, short N) leave SMs idle,
which no byte count predicts.</li>
<li><b>Resident memory.</b> Tiled keeps only the lse ({fmt_bytes(comp.tiled_memory.saved_for_backward_bytes, True)})
for the backward instead of {fmt_bytes(comp.standard_memory.saved_for_backward_bytes, True)}: this, not speed, is often
what makes long sequences possible at all.</li></ul></section>""")
    out.append("<p class='meta'>Generated by <code>tileattn report</code>; the model is derived in docs/io-model.md.</p>"
               "</body></html>")
    return "\n".join(out)


def write_report(comp: Comparison, path, measured=None) -> str:
    text = build_report(comp, measured)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return str(path)
