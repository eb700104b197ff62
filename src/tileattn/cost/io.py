"""FLOPs, HBM bytes and resident memory of standard and tiled attention.

The shape and constants live in ``shape.py``, the FLOP counts in
``flops.py``; this module holds the bytes (passes, traffic, the L2 model,
resident memory) and offers all three under one name.

Everything here is arithmetic on shapes: no GPU, no torch.  The counts are
per call of one attention layer (all batches and heads).

Conventions
-----------
* ``B`` batch, ``Hq`` query heads, ``Hkv`` key/value heads (GQA when
  ``Hkv < Hq``), ``Nq``/``Nk`` sequence lengths, ``D`` head dim of Q and K,
  ``Dv`` head dim of V (``head_dim_v``, default ``D``), ``e`` bytes per
  element of the input dtype.  Q, K, dQ, dK rows are ``D`` wide; V, O, dO,
  dV rows ``Dv`` wide.
* Causal masking is bottom-right aligned: query ``i`` sees key ``j`` iff
  ``j <= i + Nk - Nq`` (the kernels' and the reference's convention).
* "Bytes" are DRAM (HBM) bytes, reads and writes counted separately.  A
  :class:`Pass` also records ``tile_read_bytes``, the bytes its programs load
  into on-chip memory; for the tiled kernels that is the textbook
  Theta(N^2 d^2 / M) traffic, and the DRAM figure is lower when L2 serves the
  repeats (see :func:`tiled_traffic`).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from .. import configs as _configs
from ..configs import KernelConfig
from .flops import (  # noqa: F401  (re-exported: tileattn.cost.io is the model's one import path)
    FlopBreakdown, _cdiv, _dkdv_query_rows, _fwd_key_rows, _tile_matmul_flops, attention_flops, executed_pairs,
    flop_breakdown, visible_pairs)
from .shape import (  # noqa: F401  (re-exported: tileattn.cost.io is the model's one import path)
    AttentionShape, DTYPE_BYTES, DefaultConfigs, FLOP_MODES, FUSION_LEVELS, L2_USABLE_FRACTION, LAUNCH_OVERHEAD_S,
    LSE_BYTES, _check_int, _resolve_configs, default_configs, dtype_bytes, parse_config_name)


# ---------------------------------------------------------------------------
# Passes and traffic estimates
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Pass:
    """One kernel launch (or one elementwise pass over memory)."""

    name: str
    phase: str                 # "fwd" or "bwd"
    read_bytes: float          # DRAM reads
    write_bytes: float         # DRAM writes
    flops: float = 0.0         # tensor-core FLOPs executed
    tile_read_bytes: float | None = None  # bytes loaded on chip; None = read_bytes
    note: str = ""
    kernel: str = ""           # tiled: "fwd", "preprocess", "dkdv", "dq"; standard: "matmul",
    #                            "elementwise", "softmax", "copy", "reduce" or "mask"

    @property
    def bytes(self) -> float:
        return self.read_bytes + self.write_bytes

    @property
    def tile_reads(self) -> float:
        return self.read_bytes if self.tile_read_bytes is None else self.tile_read_bytes


@dataclasses.dataclass(frozen=True)
class TrafficEstimate:
    """The passes of one implementation for one shape, with totals by phase."""

    impl: str                  # "standard" or "tiled"
    shape: AttentionShape
    passes: tuple[Pass, ...]
    params: dict = dataclasses.field(default_factory=dict)

    def _sel(self, phase: str | None) -> Iterable[Pass]:
        if phase not in (None, "fwd", "bwd"):
            raise ValueError(f"phase={phase!r} must be None, 'fwd' or 'bwd'")
        return [p for p in self.passes if phase is None or p.phase == phase]

    def reads(self, phase: str | None = None) -> float:
        return float(sum(p.read_bytes for p in self._sel(phase)))

    def writes(self, phase: str | None = None) -> float:
        return float(sum(p.write_bytes for p in self._sel(phase)))

    def bytes(self, phase: str | None = None) -> float:
        return self.reads(phase) + self.writes(phase)

    def tile_reads(self, phase: str | None = None) -> float:
        return float(sum(p.tile_reads for p in self._sel(phase)))

    def flops(self, phase: str | None = None) -> float:
        return float(sum(p.flops for p in self._sel(phase)))

    def kernels(self, phase: str | None = None) -> int:
        return len(list(self._sel(phase)))

    def phases(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.phase for p in self.passes))

    def as_dict(self) -> dict:
        return {
            "impl": self.impl, "shape": self.shape.as_dict(), "params": dict(self.params),
            "passes": [dataclasses.asdict(p) for p in self.passes],
            "totals": {ph or "all": {"read_bytes": self.reads(ph), "write_bytes": self.writes(ph),
                                     "flops": self.flops(ph), "kernels": self.kernels(ph)}
                       for ph in (None, *self.phases())},
        }


def _cached_broadcast(nbytes: float, repeats: int, l2_bytes: float | None) -> float:
    """DRAM bytes to read a broadcast operand ``repeats`` times: once if it fits
    in the usable part of L2, else every time."""
    if l2_bytes is not None and nbytes <= L2_USABLE_FRACTION * l2_bytes:
        return nbytes
    return nbytes * repeats


def standard_traffic(shape: AttentionShape, *, fusion: str = "eager", backward: bool = True,
                     l2_bytes: float | None = None) -> TrafficEstimate:
    """HBM traffic of materialized attention, pass by pass.

    ``fusion="textbook"``: the algorithm as usually written (FlashAttention
    paper, Algorithm 0): S = scale Q K^T is written, an optional causal mask
    reads and rewrites it, softmax reads S and writes P, P V reads P.
    Backward: dP = dO V^T, dV = P^T dO, dS = P o (dP - rowsum(dP o P)),
    dQ = dS K, dK = dS^T Q, each reading its N^2 operands from HBM.

    ``fusion="eager"``: what ``tileattn.reference.standard_attention`` runs in
    PyTorch eager mode: the scale is its own pass, a causal call materializes
    a boolean mask, fills it in twice (hidden keys, then empty rows) and masks
    P once more, and GQA copies k/v with ``repeat_interleave``.  Autograd
    replays each of those in the backward.  The broadcast (Nq, Nk) mask is
    read once per (batch, head) unless it fits in ``l2_bytes``.  Two more
    passes come from PyTorch itself: the CUDA softmax backward first forms
    ``dP * P`` with a separate elementwise kernel (read 2, write 1 N^2
    tensor) before its row-reduction kernel, and ``backward()`` copies dK,
    which the score matmul's backward produces transposed, into k's layout.
    Forward + backward non-causal then reads or writes an N^2 tensor 18
    times against the textbook's 11 (causal: 30 against 15); the kernel
    list of an Nsight Compute run shows each of them (``docs/io-model.md``).

    Matmuls are assumed to read each input once from DRAM (cuBLAS tiles are
    served from L2) and to compute the full product even where masked.
    """
    if fusion not in FUSION_LEVELS:
        raise ValueError(f"fusion={fusion!r} is not one of {', '.join(FUSION_LEVELS)}")
    s = shape
    e = s.elem_bytes
    bh = s.batch * s.heads
    d, dv = s.head_dim, s.head_dim_v
    q_b = bh * s.seqlen_q * d * e                     # Q, dQ (all query heads)
    o_b = bh * s.seqlen_q * dv * e                    # O, dO
    k_b = bh * s.seqlen_k * d * e                     # K (and dK) as the matmul sees it
    v_b = bh * s.seqlen_k * dv * e                    # V (and dV)
    k_own = s.batch * s.kv_heads * s.seqlen_k * d * e
    v_own = s.batch * s.kv_heads * s.seqlen_k * dv * e
    sb = float(s.score_elements * e)                  # one N x N tensor
    mm = 2.0 * s.score_elements * d                   # one full N x N x D matmul: S, dQ, dK
    mm_v = 2.0 * s.score_elements * dv                # one over Dv: O, dP, dV
    mask_b = float(s.seqlen_q * s.seqlen_k)           # bool (Nq, Nk)
    mask_rd = _cached_broadcast(mask_b, bh, l2_bytes)
    eager = fusion == "eager"
    gqa = s.group > 1
    # kernel kinds: "matmul" (cuBLAS), "elementwise" (one aten elementwise kernel over
    # the N^2 tensor), "softmax" (a row kernel), "copy"/"reduce" (N*d-sized), "mask"
    mat = lambda *a, **k: Pass(*a, kernel="matmul", **k)        # noqa: E731
    ew = lambda *a, **k: Pass(*a, kernel="elementwise", **k)    # noqa: E731
    rows = lambda *a, **k: Pass(*a, kernel="softmax", **k)      # noqa: E731
    f: list[Pass] = []
    if gqa:
        f.append(Pass("expand K, V to all query heads (repeat_interleave)", "fwd", k_own + v_own, k_b + v_b,
                      note="GQA: the reference copies k/v per query head" if eager else
                      "GQA: k/v broadcast per query head", kernel="copy"))
    if eager:
        f.append(mat("S = Q K^T", "fwd", q_b + k_b, sb, mm))
        f.append(ew("S *= scale", "fwd", sb, sb))                         # `* scale`: its own kernel
    else:
        f.append(mat("S = scale * Q K^T", "fwd", q_b + k_b, sb, mm))
    if s.causal:
        if eager:
            f.append(Pass("build causal mask (Nq x Nk bool, 3 small passes)", "fwd", 2 * mask_b, 2 * mask_b,
                          note="independent of batch and heads", kernel="mask"))
            f.append(ew("S.masked_fill(hidden, -inf)", "fwd", sb + mask_rd, sb))
            f.append(ew("S.masked_fill(empty rows, 0)", "fwd", sb, sb))
        else:
            f.append(ew("mask S (causal)", "fwd", sb, sb))
    f.append(rows("P = softmax(S)", "fwd", sb, sb))
    if s.causal and eager:
        f.append(ew("P.masked_fill(empty rows, 0)", "fwd", sb, sb))
    f.append(mat("O = P V", "fwd", sb + v_b, o_b, mm_v))

    # Backward, in the order autograd replays the forward (eager):
    #   O = P V          -> dP = dO V^T (writes dP), dV = P^T dO (reads P)      2 N^2
    #   masked_fill (P)  -> dP.masked_fill                                      2 N^2, causal
    #   softmax          -> T = dP * P (elementwise kernel: reads dP, P; writes T),
    #                       dS = T - P * rowsum(T) (row kernel: reads T, P; writes dS)  6 N^2
    #   masked_fill x2   -> dS.masked_fill twice                                4 N^2, causal
    #   * scale          -> dS *= scale                                         2 N^2
    #   S = Q K^T        -> dQ = dS K and dK = dS^T Q, each reading dS           2 N^2
    # Non-causal: 12 N^2 (textbook 7); causal: 18 (textbook 9).
    bw: list[Pass] = []
    if backward:
        bw.append(mat("dP = dO V^T", "bwd", o_b + v_b, sb, mm_v))
        bw.append(mat("dV = P^T dO", "bwd", sb + o_b, v_b, mm_v))
        if s.causal and eager:
            bw.append(ew("dP.masked_fill(empty rows, 0)", "bwd", sb, sb))
        if eager:
            # aten's CUDA softmax backward forms `grad * output` with its own
            # elementwise kernel, then runs a row kernel dS = T - P * rowsum(T)
            # that reads T and P again: 6 N^2 passes instead of the textbook's 3
            bw.append(ew("T = dP * P (softmax backward, elementwise)", "bwd", 2 * sb, sb))
            bw.append(rows("dS = T - P * rowsum(T) (softmax backward, rows)", "bwd", 2 * sb, sb))
        else:
            bw.append(rows("dS = P * (dP - rowsum(P * dP))", "bwd", 2 * sb, sb, note="softmax backward"))
        if s.causal:
            if eager:
                bw.append(ew("dS.masked_fill(empty rows, 0)", "bwd", sb, sb))
                bw.append(ew("dS.masked_fill(hidden, 0)", "bwd", sb + mask_rd, sb))
            else:
                bw.append(ew("mask dS (causal)", "bwd", sb, sb))
        if eager:
            bw.append(ew("dS *= scale", "bwd", sb, sb))
        # the score matmul's backward: two matmuls, each reading dS in full
        bw.append(mat("dQ = dS K", "bwd", sb + k_b, q_b, mm))
        bw.append(mat("dK = dS^T Q", "bwd", sb + q_b, k_b, mm))
        if gqa:
            bw.append(Pass("sum dK, dV over the query heads of a group", "bwd", k_b + v_b, k_own + v_own,
                           kernel="reduce"))
        elif eager:
            # dK comes out of the matmul as the transpose of a contiguous (D, Nk)
            # product; backward() stores k.grad in k's own layout with a copy
            bw.append(Pass("copy dK into k's layout (accumulate grad)", "bwd", k_b, k_b, kernel="copy"))
    return TrafficEstimate("standard", shape, tuple(f + bw),
                           {"fusion": fusion, "l2_bytes": l2_bytes, "backward": backward})


@dataclasses.dataclass(frozen=True)
class CacheModel:
    """What the L2 reuse model needs to know about the device."""

    l2_bytes: float
    sm_count: int
    smem_per_sm: int | None = None

    def concurrent_programs(self, smem_estimate: int, num_warps: int) -> int:
        """Programs resident at once: SMs x programs per SM, limited by shared
        memory and, roughly, by registers (~128 per thread of 64K per SM)."""
        per_sm = max(1, 65536 // (num_warps * 32 * 128))
        if self.smem_per_sm:
            per_sm = min(per_sm, max(1, self.smem_per_sm // max(1, smem_estimate)))
        return self.sm_count * per_sm


def cache_model(hw, basis: str = "datasheet") -> CacheModel | None:
    """The :class:`CacheModel` of a :class:`~tileattn.cost.hardware.Hardware`
    (None if it lacks an L2 size or SM count)."""
    l2 = hw.get_int("l2_bytes", basis)
    sms = hw.get_int("sm_count", basis)
    if not l2 or not sms:
        return None
    return CacheModel(float(l2), sms, hw.get_int("smem_per_sm", basis))


def _streamed_dram(unique: float, loads: float, programs_per_unit: int, concurrent: int | None,
                   l2_bytes: float | None) -> float:
    """DRAM bytes for an operand of size ``unique`` that ``programs_per_unit``
    programs stream through (``loads`` bytes of tile loads in total).

    Programs of one unit are launched next to each other and walk the operand
    in step, so one wave of them reads it from DRAM once and the rest hit L2.
    A unit spread over several waves reads it once per wave, unless the
    operand fits in the usable part of L2 and survives to the next wave.
    Without a cache model every tile load goes to DRAM."""
    if l2_bytes is None or concurrent is None:
        return loads
    waves = _cdiv(programs_per_unit, concurrent)
    if waves <= 1 or unique <= L2_USABLE_FRACTION * l2_bytes:
        per_unit = unique
    else:
        per_unit = unique * waves
    return min(loads, per_unit)


def tiled_traffic(shape: AttentionShape, *, fwd_config: KernelConfig | None = None,
                  bwd_config: KernelConfig | None = None, cache: CacheModel | None = None,
                  gqa_reuse: bool = False, backward: bool = True,
                  smem_per_block: int | None = None, dq_config: KernelConfig | None = None) -> TrafficEstimate:
    """HBM traffic of the tiled kernels for the block sizes they use.

    Forward, one program per (query block of BLOCK_M rows, batch, q-head):
    Q read once; every visible K and V tile read once *per query block*, i.e.
    ``ceil(Nq/BLOCK_M) * Nk * D`` elements each (``Dv`` for V) -- the
    Theta(N^2 d^2 / M) term, since BLOCK_M is bounded by SRAM size M / d; O
    written once, lse (fp32) written once.

    Backward: (1) preprocess reads O, dO, lse, writes delta and lse2 (fp32);
    (2) dK/dV, one program per (key block of BLOCK_N, batch, kv-head): K, V
    once, Q, dO, lse2, delta once per key block for each q-head of the group,
    writes dK, dV; (3) dQ, one program per (query block, batch, q-head): Q,
    dO, lse2, delta once, K and V once per query block, writes dQ.

    ``cache`` switches on the L2 reuse model (:func:`_streamed_dram`): the
    repeated K/V (resp. Q/dO) tile loads of neighbouring programs are served
    from L2 and DRAM sees roughly one read per wave.  Without it, every tile
    load is counted as a DRAM read (the textbook bound); ``gqa_reuse`` then
    still lets the q-heads of a group share one read of their k/v head.

    Configs: ``fwd_config`` for the forward kernel, ``bwd_config`` for the
    dK/dV kernel and ``dq_config`` for the dQ kernel, each defaulting to the
    first entry of its own table (``FWD_CONFIGS``, ``DKDV_CONFIGS``,
    ``DQ_CONFIGS``) that fits ``smem_per_block`` under its own estimator
    (:func:`default_configs`).
    """
    s = shape
    fwd_config, bwd_config, dq_config = _resolve_configs(s, fwd_config, bwd_config, smem_per_block, dq_config)
    e, d, dv = s.elem_bytes, s.head_dim, s.head_dim_v
    nq, nk, g = s.seqlen_q, s.seqlen_k, s.group
    b, hq, hkv = s.batch, s.heads, s.kv_heads
    row_q = d * e                     # one row of Q, dQ, K, dK
    row_v = dv * e                    # one row of V, dV, O, dO
    row_kv = row_q + row_v            # a row of K and the same row of V
    l2 = cache.l2_bytes if cache else None
    flops = flop_breakdown(s, fwd_config, bwd_config, dq_config)
    bm, bn = fwd_config.block_m, fwd_config.block_n

    # ---- forward ----
    n_qb = _cdiv(nq, bm)
    kv_rows_loaded = _fwd_key_rows(nq, nk, bm, bn, s.causal)
    kv_tile_loads = float(kv_rows_loaded * row_kv * b * hq)         # K and V, every q-head program
    kv_unique = float(nk * row_kv)                                   # one kv head's K and V
    if cache:
        conc = cache.concurrent_programs(
            _configs.fwd_smem_bytes(bm, bn, d, e, fwd_config.num_stages, dv), fwd_config.num_warps)
        # unit = (batch, kv head): its g * n_qb programs are adjacent in launch order
        kv_dram = b * hkv * _streamed_dram(kv_unique, float(kv_rows_loaded * row_kv * g), g * n_qb, conc, l2)
    else:
        conc = None
        kv_dram = kv_tile_loads / (g if gqa_reuse else 1)
    q_bytes = float(b * hq * nq * row_q)                             # Q (or dQ)
    o_bytes = float(b * hq * nq * row_v)                             # O (or dO)
    lse_bytes = float(b * hq * nq * LSE_BYTES)
    passes = [Pass("attention forward (one kernel)", "fwd", q_bytes + kv_dram, o_bytes + lse_bytes,
                   flops.tiled_fwd_executed, tile_read_bytes=q_bytes + kv_tile_loads,
                   note=f"{fwd_config.name}: K/V loaded {kv_rows_loaded / max(nk, 1):.1f}x per head",
                   kernel="fwd")]

    # ---- backward ----
    if backward:
        rows_aux = 2 * LSE_BYTES      # lse2 and delta per query row
        passes.append(Pass("backward preprocess: delta = rowsum(dO * O)", "bwd",
                           2 * o_bytes + lse_bytes, 2 * lse_bytes, kernel="preprocess"))
        # dK/dV (DKDV_CONFIGS tile): per key block, the group's q-heads stream
        # Q, dO, lse2, delta from the first query block that sees the key block
        bm2, bn2 = bwd_config.block_m, bwd_config.block_n
        conc_kv = (cache.concurrent_programs(_configs.dkdv_smem_bytes(bm2, bn2, d, e, bwd_config.num_stages, dv),
                                             bwd_config.num_warps) if cache else None)
        n_kb = _cdiv(nk, bn2)
        q_rows_loaded = _dkdv_query_rows(nq, nk, bm2, bn2, s.causal)
        per_row = row_q + row_v + rows_aux                            # Q, dO, lse2, delta
        q_tile_loads = float(q_rows_loaded * per_row * g)            # per (batch, kv head)
        q_unique = float(nq * per_row * g)
        if cache:
            q_dram = b * hkv * _streamed_dram(q_unique, q_tile_loads, n_kb, conc_kv, l2)
        else:
            q_dram = b * hkv * q_tile_loads
        kv_own = float(b * hkv * nk * row_kv)                        # K and V (read), dK and dV (written)
        passes.append(Pass("backward dK, dV (one program per key block)", "bwd",
                           kv_own + q_dram, kv_own,
                           2 * _tile_matmul_flops(s, bwd_config, "dkdv")          # S, dK
                           + 2 * _tile_matmul_flops(s, bwd_config, "dkdv", True),  # dP, dV
                           tile_read_bytes=kv_own + b * hkv * q_tile_loads,
                           note=f"{bwd_config.name}: Q/dO loaded {q_rows_loaded / max(nq, 1):.1f}x per head",
                           kernel="dkdv"))
        # dQ (DQ_CONFIGS tile): like the forward, K and V streamed per query block
        bm3, bn3 = dq_config.block_m, dq_config.block_n
        conc_q = cache.concurrent_programs(
            _configs.dq_smem_bytes(bm3, bn3, d, e, dq_config.num_stages, dv), dq_config.num_warps) if cache else None
        n_qb3 = _cdiv(nq, bm3)
        kv_rows3 = _fwd_key_rows(nq, nk, bm3, bn3, s.causal)
        kv_loads3 = float(kv_rows3 * row_kv * b * hq)
        if cache:
            kv_dram3 = b * hkv * _streamed_dram(kv_unique, float(kv_rows3 * row_kv * g), g * n_qb3, conc_q, l2)
        else:
            kv_dram3 = kv_loads3 / (g if gqa_reuse else 1)
        own_q = q_bytes + o_bytes + 2 * lse_bytes                    # Q, dO, lse2, delta
        passes.append(Pass("backward dQ (one program per query block)", "bwd", own_q + kv_dram3, q_bytes,
                           2 * _tile_matmul_flops(s, dq_config, "dq")             # S, dQ
                           + _tile_matmul_flops(s, dq_config, "dq", True),         # dP
                           tile_read_bytes=own_q + kv_loads3,
                           note=f"{dq_config.name}: recomputes S and dP a second time; K/V loaded "
                                f"{kv_rows3 / max(nk, 1):.1f}x per head",
                           kernel="dq"))
    params = {"fwd_config": fwd_config.name, "bwd_config": bwd_config.name,
              "dkdv_config": bwd_config.name, "dq_config": dq_config.name,
              "cache": dataclasses.asdict(cache) if cache else None, "gqa_reuse": gqa_reuse,
              "concurrent_programs": conc}
    return TrafficEstimate("tiled", shape, tuple(passes), params)


# ---------------------------------------------------------------------------
# Resident memory
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ResidentMemory:
    """Bytes held by one attention call besides Q, K, V and O."""

    impl: str
    peak_extra_bytes: float        # largest N-dependent working set during the forward
    saved_for_backward_bytes: float
    detail: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def resident_memory(shape: AttentionShape, impl: str, fusion: str = "textbook") -> ResidentMemory:
    """Memory beyond the inputs and output.

    Standard: S and P are both live while softmax runs (``2 * B*H*Nq*Nk*e``:
    the "scores and probabilities"), and P is kept for the backward.  The
    eager causal reference also keeps the softmax output and the re-masked P
    (two N^2 tensors) and, until it returns, S.  Tiled: only the fp32 lse,
    ``B*H*Nq*4`` bytes, survives to the backward; the per-program tiles live
    in SRAM and registers.
    """
    s = shape
    sb = float(s.score_elements * s.elem_bytes)
    if impl == "tiled":
        lse = float(s.batch * s.heads * s.seqlen_q * LSE_BYTES)
        return ResidentMemory("tiled", lse, lse, "lse (fp32) per query row")
    if impl != "standard":
        raise ValueError(f"impl={impl!r} must be 'standard' or 'tiled'")
    if fusion not in FUSION_LEVELS:
        raise ValueError(f"fusion={fusion!r} is not one of {', '.join(FUSION_LEVELS)}")
    if fusion == "eager" and s.causal:
        return ResidentMemory("standard", 3 * sb, 2 * sb,
                              "S, softmax(S) and the re-masked P are live together; the latter two are saved")
    return ResidentMemory("standard", 2 * sb, sb, "S and P live during softmax; P saved for the backward")
