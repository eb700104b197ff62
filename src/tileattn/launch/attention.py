"""Launchers of the training kernels (``kernels/fwd.py``, ``kernels/bwd.py``):
allocate outputs, compute the grid and call the kernels by keyword; the
config comes from ``tuning.py``, descriptors, direct launches and plans from
``runtime.py``.  No validation here (``validation.py`` checks before anything
reaches this module) and no autograd (``ops.py``).
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import configs, dispatch
from .._env import interpreter_active
from ..block_mask import BLOCK_K as MASK_BLOCK_K, BLOCK_Q as MASK_BLOCK_Q, cached_kernel_block_lists
from ..configs import HopperBwdConfig, HopperFwdConfig, KernelConfig
from ..kernels.bwd import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel
from ..kernels.fwd import _attn_fwd_kernel
from ..sinks import kernel_sink_grad, remainder_like, with_sinks
from ..validation import fold_causal
from .runtime import (LOG2E, abandon_record, aligned, base_tensor, begin_record, descriptor, dot_precision, end_record,
                      output_f32, output_like, replay, smem_limit, strides4, use_tma)
from . import bwd_steps, hopper_calls, runtime, tuning

# Which tile height (meta-parameter) each descriptor argument is read with.
# and the width: V, O, dO and dV have V's head dim (BLOCK_DV), the rest BLOCK_D.
_V_WIDTH = frozenset({"V", "O", "DO", "DV"})
_BOX_ROWS = {
    "fwd": {"Q": "BLOCK_M", "O": "BLOCK_M", "K": "BLOCK_N", "V": "BLOCK_N"},
    "dkdv": {"Q": "BLOCK_M", "DO": "BLOCK_M", "K": "BLOCK_N", "V": "BLOCK_N", "DK": "BLOCK_N", "DV": "BLOCK_N"},
    "dkdv_atomic": {"Q": "BLOCK_M", "DO": "BLOCK_M", "K": "BLOCK_N", "V": "BLOCK_N", "DK": "BLOCK_N",
                    "DV": "BLOCK_N", "DQ_ACC": "BLOCK_M"},
    "dq": {"Q": "BLOCK_M", "DO": "BLOCK_M", "DQ": "BLOCK_M", "K": "BLOCK_N", "V": "BLOCK_N"},
}


def _set_boxes(kind: str):
    def hook(args):
        if args["USE_TMA"]:
            for name, rows in _BOX_ROWS[kind].items():
                if isinstance(args[name], TensorDescriptor):
                    width = args["BLOCK_DV"] if name in _V_WIDTH else args["BLOCK_D"]
                    args[name].block_shape = [1, 1, args[rows], width]
    return hook


def _output(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The forward's output: q's batch, heads and rows, v's head dim."""
    if v.shape[-1] == q.shape[-1]:
        return output_like(q)
    out = torch.empty((*q.shape[:-1], v.shape[-1]), device=q.device, dtype=q.dtype)
    if runtime.POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def _bucket(n: int) -> int:
    """Autotune key for a sequence length: the next power of two (>= 64), so
    shapes of one size class share their tuning."""
    return max(64, 1 << (int(n) - 1).bit_length())


def _prune(kind: str):
    def prune(cfgs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        head_dim, head_dim_v = args["HEAD_DIM"], args["HEAD_DIM_V"]
        q = base_tensor(args["Q"])
        elem = q.element_size()
        limit = smem_limit(q.device)
        allowed = {c.name for c in configs.fitting(configs.candidates(kind, head_dim, head_dim_v), head_dim, elem,
                                                   limit, kind=kind, head_dim_v=head_dim_v)}
        kept = [c for c in cfgs if _name(c) in allowed]
        if args.get("BLOCK_SPARSE"):
            kept = [c for c in kept if _tiles_divide_mask(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"])]
        return kept or cfgs[:1]
    return prune


def _name(cfg: "triton.Config") -> str:
    return KernelConfig(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages).name


def _triton_configs(kind: str) -> list:
    seen, out = set(), []
    for cfgs in configs.TABLES[kind].values():
        for c in cfgs:
            if c.name not in seen:
                seen.add(c.name)
                out.append(triton.Config(c.as_meta(), num_warps=c.num_warps, num_stages=c.num_stages,
                                         pre_hook=_set_boxes(kind)))
    return out


def _tiles_divide_mask(block_m: int, block_n: int) -> bool:
    """A kernel tile must lie inside one block of a block-sparse layout."""
    return MASK_BLOCK_Q % block_m == 0 and MASK_BLOCK_K % block_n == 0


_TUNE_KEY = ["N_Q_BUCKET", "N_K_BUCKET", "HEAD_DIM", "HEAD_DIM_V", "IS_CAUSAL", "DOT_PRECISION", "USE_TMA",
             "IS_VARLEN", "HAS_WINDOW", "HAS_SOFTCAP", "HAS_ALIBI", "BLOCK_SPARSE"]
_KERNELS = {"fwd": _attn_fwd_kernel, "dkdv": _attn_bwd_dkdv_kernel, "dkdv_atomic": _attn_bwd_dkdv_kernel,
            "dq": _attn_bwd_dq_kernel}


def _tuned(kind: str):
    """The autotuned kernel of each kind (built on first use, GPU only)."""
    return tuning.autotuner(kind, lambda: triton.autotune(
        configs=_triton_configs(kind), key=_TUNE_KEY,
        prune_configs_by={"early_config_prune": _prune(kind)})(_KERNELS[kind]))


def _launch(kind: str, kernel, grid_of, config: KernelConfig | None, interpreter_cfg: KernelConfig, **args):
    """Run ``kernel`` with a forced config, the interpreter's single config, the
    table's first fitting config (autotuning off), or autotuning (``tuning.py``)."""
    q = base_tensor(args["Q"])
    sparse = args.get("BLOCK_SPARSE")

    def first_fit():
        # the atomic backward is never autotuned: the autotuner's trial launches
        # would each add their dQ into the same accumulator
        if runtime.autotune_enabled() and kind != "dkdv_atomic":
            return None
        head_dim, head_dim_v = args["HEAD_DIM"], args["HEAD_DIM_V"]
        fits = configs.fitting(configs.candidates(kind, head_dim, head_dim_v), head_dim, q.element_size(),
                               smem_limit(q.device), kind=kind, head_dim_v=head_dim_v)
        if sparse:
            fits = [c for c in fits if _tiles_divide_mask(c.block_m, c.block_n)] or fits
        return fits[0]

    def check(config):
        if sparse and not _tiles_divide_mask(config.block_m, config.block_n):
            raise ValueError(f"config {config.name}: block-sparse attention needs tiles that divide the layout's "
                             f"{MASK_BLOCK_Q} x {MASK_BLOCK_K} blocks")

    tuning.launch(kind, kernel, grid_of, args, config=config, interpreter_config=interpreter_cfg,
                  first_fit=first_fit, build_autotuner=lambda: _tuned(kind),
                  key=(q.device, q.dtype, *(args.get(k) for k in _TUNE_KEY)), set_boxes=_set_boxes(kind),
                  check=check)


def bwd_kinds(deterministic: bool) -> tuple[str, ...]:
    """The configurable kernels a portable backward launches."""
    return ("dkdv", "dq") if deterministic else ("dkdv_atomic",)


def _device_smem(q: torch.Tensor) -> int | None:
    """Shared memory per block of q's GPU; None under the interpreter (no limit)."""
    if interpreter_active() or not q.is_cuda:
        return None
    return smem_limit(q.device)


@functools.lru_cache(maxsize=None)
def _check_fits(kinds: tuple, head_dim: int, head_dim_v: int, dtype: torch.dtype, limit: int) -> None:
    configs.check_fits(kinds, head_dim, dtype.itemsize, limit, head_dim_v, str(dtype))


def check_shared_memory(q: torch.Tensor, v: torch.Tensor, kinds: tuple) -> None:
    """ValueError, before any launch, when a kernel of ``kinds`` has no tile
    that fits the GPU's shared memory (``configs.check_fits``: head dims above
    256, e.g. float32 at 512 on a 99 KB part)."""
    limit = _device_smem(q)
    if limit is not None:
        _check_fits(tuple(kinds), q.shape[-1], v.shape[-1], q.dtype, limit)


def window_bounds(causal: bool, window: tuple[int, int], len_q: int, len_k: int) -> tuple[int, int]:
    """The kernels' (left, right) of a sliding window: causal folded into
    the right side, an unbounded side (-1) a bound past every sequence (no
    int32 overflow)."""
    left, right = fold_causal(causal, *window)
    return (len_k if left < 0 else min(left, len_k)), (len_q if right < 0 else min(right, len_q))


class _Variants:
    """The kernel arguments of the variants that are on (none for a plain call).

    Packed sequences arrive as (1, H, total, D) views with ``cu_seqlens_*``;
    the batch axis of the grid then runs over the sequences."""

    def __init__(self, q, k, causal, scale, *, window=None, softcap=None, alibi_slopes=None, block_mask=None,
                 cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
        self.varlen = cu_seqlens_q is not None
        n_q, n_k = q.shape[2], k.shape[2]
        self.batch = cu_seqlens_q.numel() - 1 if self.varlen else q.shape[0]
        self.len_q = int(max_seqlen_q) if self.varlen else n_q   # rows per sequence the grid covers
        self.len_k = int(max_seqlen_k) if self.varlen else n_k
        self.causal = bool(causal)   # IS_CAUSAL of the kernels
        self.window = window
        self.block_mask = block_mask
        self.args = {}
        if self.varlen:
            self.args.update(CU_SEQLENS_Q=cu_seqlens_q, CU_SEQLENS_K=cu_seqlens_k, IS_VARLEN=True)
        if window is not None:   # causal is folded into the window's right side
            left, right = window_bounds(causal, window, self.len_q, self.len_k)
            self.args.update(win_left=left, win_right=right, HAS_WINDOW=True)
            self.causal = False
        if softcap:
            self.args.update(softcap_scale=scale / softcap, softcap_log2=softcap * LOG2E, HAS_SOFTCAP=True)
        if alibi_slopes is not None:
            slopes = alibi_slopes.to(device=q.device, dtype=torch.float32)
            if slopes.dim() == 1:
                self.args.update(ALIBI=slopes, stride_ab=0, stride_ah=slopes.stride(0))
            else:
                self.args.update(ALIBI=slopes, stride_ab=slopes.stride(0), stride_ah=slopes.stride(1))
            self.args["HAS_ALIBI"] = True
        self.lists = None
        if block_mask is not None:
            self.lists = cached_kernel_block_lists(block_mask, n_q, n_k, causal=causal, window=window)

    def kernel_args(self, kind: str) -> dict:
        """Arguments for the ``fwd``, ``dkdv`` or ``dq`` kernel."""
        args = dict(self.args)
        if self.lists is not None:
            lst = self.lists
            full_num, full_idx, part_num, part_idx = (
                (lst.q_full_num, lst.q_full_idx, lst.q_part_num, lst.q_part_idx) if kind == "dkdv" else
                (lst.kv_full_num, lst.kv_full_idx, lst.kv_part_num, lst.kv_part_idx))
            bb, hb = full_idx.shape[0], full_idx.shape[1]
            # broadcast layouts (batch or heads of size 1) get stride 0
            args.update(BS_FULL_NUM=full_num, BS_FULL_IDX=full_idx, BS_PART_NUM=part_num, BS_PART_IDX=part_idx,
                        stride_bs_nb=full_num.stride(0) if bb > 1 else 0,
                        stride_bs_nh=full_num.stride(1) if hb > 1 else 0,
                        stride_bs_ib=full_idx.stride(0) if bb > 1 else 0,
                        stride_bs_ih=full_idx.stride(1) if hb > 1 else 0,
                        stride_bs_ir=full_idx.stride(2), BLOCK_SPARSE=True,
                        MASK_BLOCK_Q=MASK_BLOCK_Q, MASK_BLOCK_K=MASK_BLOCK_K)
        return args


_VARLEN_ARGS = {"cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"}


def _packed(variants: dict, n_q: int, n_k: int) -> tuple:
    """(the variants' names but packed sequences' arguments, the (query, key)
    lengths the masks see, the Hopper launchers' ``varlen`` tuple or None)."""
    if not _VARLEN_ARGS <= variants.keys():
        return variants.keys(), (n_q, n_k), None
    lens = (variants["max_seqlen_q"], variants["max_seqlen_k"])
    return variants.keys() - _VARLEN_ARGS, lens, (variants["cu_seqlens_q"], variants["cu_seqlens_k"], *lens)


def attn_fwd(q, k, v, causal: bool, scale: float, config: KernelConfig | None = None, sinks=None,
             remainder: bool = False, **variants):
    """Forward launch. Returns (out (B, Hq, Nq, Dv) in q's dtype, lse float32
    (B, Hq, Nq)); Dv is v's head dim, which may differ from q's.

    ``variants``: ``window=(left, right)``, ``softcap=c``, ``alibi_slopes``,
    ``block_mask`` (see ``tileattn.attention``) and, for packed sequences
    given as (1, H, total, D) views, ``cu_seqlens_q``, ``cu_seqlens_k``,
    ``max_seqlen_q``, ``max_seqlen_k`` (lse is then (1, Hq, total_q)).
    ``sinks``: float32 (Hq,) attention sinks; the lse includes them.
    ``remainder``: (out, lse, out_lo), out_lo = the float32 output's
    rounding remainder O - out in out's dtype and layout, for
    :func:`attn_bwd`'s sinks gradient (rowsum(dO o O) from the rounded out
    loses digits that gradient sums over every row)."""
    # a sliding window alone runs on the Hopper forward too, where it is wide enough; packed sequences too
    forced = isinstance(config, HopperFwdConfig)
    others, lens, packed = _packed(variants, q.shape[2], k.shape[2])
    window = window_bounds(causal, variants["window"], *lens) if "window" in variants else None
    window_only = others == {"window"} and dispatch.hopper_window_fwd(q, v, window, forced)
    if ((not others or window_only) and (config is None or forced) and dispatch.hopper_fwd_eligible(q, k, v)
            and (dispatch.hopper_varlen_fwd(q, v, causal, lens[1], forced) if packed is not None
                 else forced or dispatch.hopper_fwd_preferred(q.shape[-1], causal, k.shape[2]))):
        return hopper_calls.fwd(q, k, v, causal and window is None, scale, config, sinks, remainder, window,
                                varlen=packed)
    b, hq, n_q, d = q.shape
    n_k = k.shape[2]
    plan_key = None
    if not variants and sinks is None and not remainder and config is None and q.is_cuda:
        plan_key = runtime.plan_key("fwd", (q, k, v), bool(causal), float(scale))
        plan = runtime.PLANS.get(plan_key) if plan_key is not None else None
        if plan is not None:
            o, lse = _output(q, v), output_f32((b, hq, n_q), q.device)
            if aligned(o, lse):
                replay(plan, {"q": q, "k": k, "v": v, "o": o, "lse": lse})
                return o, lse
            plan_key = None
    var = _Variants(q, k, causal, scale, **variants)
    o = _output(q, v)
    lse = output_f32((b, hq, n_q), q.device)
    o_lo = remainder_like(o) if remainder else None
    if n_q == 0 or b == 0 or var.batch == 0:
        return (o, lse) if o_lo is None else (o, lse, o_lo)
    if n_k == 0:  # nothing to attend to: every row is empty (or its sink alone)
        lse.fill_(float("-inf"))
        out = (o.zero_(), lse) if sinks is None else with_sinks(o.zero_(), lse, sinks)
        return out if o_lo is None else out + (o_lo.zero_(),)
    if config is None:
        check_shared_memory(q, v, ("fwd",))
    if plan_key is not None:
        begin_record()
    try:
        _attn_fwd_launch(q, k, v, o, lse, var, scale, config, sinks, o_lo)
    except BaseException:
        abandon_record()
        raise
    if plan_key is not None:
        end_record(plan_key, {"q": q, "k": k, "v": v, "o": o, "lse": lse})
    return (o, lse) if o_lo is None else (o, lse, o_lo)


def _attn_fwd_launch(q, k, v, o, lse, var, scale, config, sinks=None, o_lo=None):
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]

    def grid(meta):
        return (triton.cdiv(var.len_q, meta["BLOCK_M"]), hq, var.batch)

    tma = use_tma(q, k, v, o)
    tiles = (lambda t: descriptor(t)) if tma else (lambda t: t)
    _launch("fwd", _attn_fwd_kernel, grid, config, configs.INTERPRETER_FWD,
            Q=tiles(q), K=tiles(k), V=tiles(v), O=o if var.varlen else tiles(o), LSE=lse,
            **strides4(q, "q"), **strides4(k, "k"), **strides4(v, "v"), **strides4(o, "o"),
            stride_lb=lse.stride(0), stride_lh=lse.stride(1),
            GROUP_SIZE=hq // hkv, N_Q=n_q, N_K=n_k, qk_scale=scale * LOG2E,
            N_Q_BUCKET=_bucket(var.len_q), N_K_BUCKET=_bucket(var.len_k),
            HEAD_DIM=d, BLOCK_D=configs.block_d(d), HEAD_DIM_V=v.shape[-1], BLOCK_DV=configs.block_d(v.shape[-1]),
            IS_CAUSAL=var.causal, DOT_PRECISION=dot_precision(q.dtype), USE_TMA=tma, **var.kernel_args("fwd"),
            **({} if sinks is None else dict(SINKS=sinks.float().contiguous(), HAS_SINKS=True)),
            **({} if o_lo is None else dict(O_LO=o_lo, **strides4(o_lo, "lo"), HAS_O_LO=True)))


def attn_bwd(do, q, k, v, o, lse, causal: bool, scale: float, dlse=None,
             config: KernelConfig | dict | None = None, deterministic: bool = True, sinks=None, o_lo=None,
             **variants):
    """Backward launch. Returns (dq like q, dk like k, dv like v), and the
    sinks' gradient (float32 (Hq,)) after them when ``sinks`` is given (``o``
    and ``lse`` are then the forward's with the sinks in: the kernels'
    products do not change, only the lse they recompute P from).

    ``deterministic=True``: the dK/dV kernel, then the dQ kernel (bitwise
    reproducible).  ``False``: the dK/dV kernel also adds its share of dQ
    into a float32 accumulator with atomics (5 tile matmuls instead of 7;
    dq is then reproducible only up to the order of the float32 adds), and
    a small kernel converts the sum into dq.  ``config`` forces every
    kernel's config, or {"dkdv": ..., "dq": ..., "dkdv_atomic": ...} each;
    ``variants`` as for :func:`attn_fwd`.

    The sinks' gradient needs each row's sum_j P_ij dP_ij to float32
    accuracy.  With ``o_lo`` (the forward's rounding remainder, see
    :func:`attn_fwd`) the preprocess takes it as rowsum(dO o (o + o_lo)) and
    the kernels do no extra work; without it the kernel that owns dQ's rows
    also sums each row's dS (``tileattn.sinks.kernel_sink_grad``)."""
    b, hq, n_q, d = q.shape
    n_k = k.shape[2]
    deterministic = bool(deterministic)
    sums_ds = sinks is not None and o_lo is None   # the kernels sum dS for the sinks' gradient
    forced = isinstance(config, HopperBwdConfig)
    others, lens, packed = _packed(variants, n_q, n_k)   # packed sequences: the d <= 128 kernel's packed build
    window_only = others == {"window"} and dispatch.hopper_window_bwd(q, v, forced)
    if packed is not None and forced and not dispatch.hopper_varlen_bwd(q, v, True):
        raise ValueError("config: a Hopper backward config on packed sequences needs QK = V head dim <= 128 and "
                         "TILEATTN_HOPPER_VARLEN_BWD=1 (the packed backward build is opt-in)")
    if (not deterministic and (not others or window_only) and (config is None or forced)
            and dispatch.hopper_bwd_eligible(q, k, v, do, sums_ds)
            and (packed is None or (dispatch.hopper_varlen_bwd(q, v, forced) and not sums_ds))):
        # causal folded into the window's bounds
        window = window_bounds(causal, variants["window"], *lens) if window_only else None
        return hopper_calls.bwd(do, q, k, v, o, lse, dlse, causal and window is None, scale, config, sinks, o_lo,
                                window, varlen=packed)
    plan_key = None
    if not variants and sinks is None and config is None and q.is_cuda:
        plan_key = runtime.plan_key("bwd", (do, q, k, v, o, lse, dlse), bool(causal), float(scale), deterministic)
        plan = runtime.PLANS.get(plan_key) if plan_key is not None else None
        if plan is not None:
            dq, dk, dv = output_like(q), output_like(k), output_like(v)
            delta, lse2 = output_f32((b, hq, n_q), q.device), output_f32((b, hq, n_q), q.device)
            tensors = {"do": do, "q": q, "k": k, "v": v, "o": o, "lse": lse, "dlse": dlse,
                       "dq": dq, "dk": dk, "dv": dv, "delta": delta, "lse2": lse2}
            if not deterministic:
                tensors["dq_acc"] = bwd_steps.dq_accumulator(q)
            if aligned(dq, dk, dv, delta, lse2):
                replay(plan, tensors)
                return dq, dk, dv
            plan_key = None
    var = _Variants(q, k, causal, scale, **variants)
    dq, dk, dv = output_like(q), output_like(k), output_like(v)
    if b == 0 or n_k == 0 or n_q == 0 or var.batch == 0:
        zeros = (dq.zero_(), dk.zero_(), dv.zero_())
        if sinks is None:
            return zeros
        # no key: every row's softmax is the sink alone (P = 0, out 0), only dlse reaches the sinks
        return zeros + (kernel_sink_grad(sinks, lse, dlse, None, None),)
    delta = output_f32((b, hq, n_q), q.device)
    lse2 = output_f32((b, hq, n_q), q.device)
    if config is None:
        check_shared_memory(q, v, bwd_kinds(deterministic))
    dq_acc = None if deterministic else bwd_steps.dq_accumulator(q)
    ds_sum = torch.zeros((b, hq, n_q), device=q.device, dtype=torch.float32) if sums_ds else None
    if plan_key is not None:
        begin_record()
    try:
        dsinks = _attn_bwd_launch(do, q, k, v, o, lse, dlse, dq, dk, dv, delta, lse2, var, scale, config, dq_acc,
                                  ds_sum, o_lo, sinks)
    except BaseException:
        abandon_record()
        raise
    if plan_key is not None:
        tensors = {"do": do, "q": q, "k": k, "v": v, "o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv,
                   "delta": delta, "lse2": lse2}
        if dlse is not None:
            tensors["dlse"] = dlse
        if dq_acc is not None:
            tensors["dq_acc"] = dq_acc
        end_record(plan_key, tensors)
    if sinks is None:
        return dq, dk, dv
    return dq, dk, dv, dsinks if dsinks is not None else kernel_sink_grad(sinks, lse, dlse, delta, ds_sum)


def _attn_bwd_launch(do, q, k, v, o, lse, dlse, dq, dk, dv, delta, lse2, var, scale, config, dq_acc=None,
                     ds_sum=None, o_lo=None, sinks=None):
    """The backward's launches; with ``dq_acc`` (a zeroed float32 tensor
    shaped like q) the atomic path: the dK/dV kernel adds dQ into it and
    the convert kernel writes dq from it.  ``ds_sum``: a zeroed float32
    (B, Hq, N_Q) tensor for each row's sum of dS (the sinks' gradient), or
    None; ``o_lo``: O's rounding remainder for the preprocess, or None.
    Returns the sinks' gradient where the preprocess formed it (``o_lo``
    and ``sinks``), else None."""
    per_kind = config if isinstance(config, dict) else {"dkdv": config, "dq": config, "dkdv_atomic": config}
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    dsinks = bwd_steps.preprocess(do, o, lse, dlse, delta, lse2, o_lo, sinks)

    tma = use_tma(q, k, v, do, dq, dk, dv)
    tiles = (lambda t: descriptor(t)) if tma else (lambda t: t)
    common = dict(Q=tiles(q), K=tiles(k), V=tiles(v), DO=tiles(do), LSE2=lse2, DELTA=delta,
                  **strides4(q, "q"), **strides4(k, "k"), **strides4(v, "v"), **strides4(do, "do"),
                  N_HEADS=hq, GROUP_SIZE=hq // hkv, N_Q=n_q, N_K=n_k,
                  sm_scale=scale, qk_scale=scale * LOG2E,
                  N_Q_BUCKET=_bucket(var.len_q), N_K_BUCKET=_bucket(var.len_k),
                  HEAD_DIM=d, BLOCK_D=configs.block_d(d), HEAD_DIM_V=v.shape[-1],
                  BLOCK_DV=configs.block_d(v.shape[-1]), IS_CAUSAL=var.causal,
                  DOT_PRECISION=dot_precision(q.dtype), USE_TMA=tma)
    # packed sequences store through pointers, clipped at each sequence's end
    out_tiles = (lambda t: t) if var.varlen else tiles
    # the kernel that owns dQ also sums each row's dS (the sinks' gradient)
    sum_args = {} if ds_sum is None else dict(DS_SUM=ds_sum, SUM_DS=True)

    def grid_kv(meta):
        return (triton.cdiv(var.len_k, meta["BLOCK_N"]), hkv, var.batch)

    def grid_q(meta):
        return (triton.cdiv(var.len_q, meta["BLOCK_M"]), hq, var.batch)

    if dq_acc is None:
        _launch("dkdv", _attn_bwd_dkdv_kernel, grid_kv, per_kind.get("dkdv"), configs.INTERPRETER_BWD,
                DK=out_tiles(dk), DV=out_tiles(dv), **strides4(dk, "dk"), **strides4(dv, "dv"), **common,
                **var.kernel_args("dkdv"))
        _launch("dq", _attn_bwd_dq_kernel, grid_q, per_kind.get("dq"), configs.INTERPRETER_BWD,
                DQ=out_tiles(dq), **strides4(dq, "dq"), **common, **var.kernel_args("dq"), **sum_args)
        return dsinks
    # the copy engine's bulk reduce clips at the tensor's edges only, so
    # packed sequences (and the interpreter, which lacks it) add by pointer
    dq_tma = tma and not var.varlen and not interpreter_active()
    _launch("dkdv_atomic", _attn_bwd_dkdv_kernel, grid_kv, per_kind.get("dkdv_atomic"), configs.INTERPRETER_BWD,
            DK=out_tiles(dk), DV=out_tiles(dv), **strides4(dk, "dk"), **strides4(dv, "dv"), **common,
            **var.kernel_args("dkdv"), DQ_ACC=descriptor(dq_acc) if dq_tma else dq_acc,
            **strides4(dq_acc, "dqa"), ATOMIC_DQ=True, DQ_TMA=dq_tma, **sum_args)
    bwd_steps.dq_convert(dq_acc, dq, scale)
    return dsinks
