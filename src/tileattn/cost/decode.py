"""Bytes and FLOPs of one KV-cache decoding step (``attention_with_kvcache``),
and whether it is memory- or compute-bound on a device.

A step attends ``Nq`` new queries of ``Hq`` heads to a cache of ``L`` keys
per batch element (``L`` counts the keys after the append).  Conventions as
in ``cost/io.py``: ``D`` is the head dim of Q and K, ``Dv`` that of V and the
output, ``e`` bytes per element, DRAM bytes with reads and writes apart.

Passes (one :class:`~tileattn.cost.io.Pass` each):

* ``append`` (``n_new`` > 0): k_new (and v_new) read and written into the
  cache: ``B Hkv Nnew (D + Dv) e`` each way; a shared cache writes k_new
  alone (``D`` wide: V is its first Dv channels).
* ``decode``, the partial kernel: the cache read once per kv head,
  ``B Hkv L D e`` for K and ``B Hkv L Dv e`` for V -- nothing for V on a
  shared cache (``v_cache = k_cache[..., :Dv]``: each key tile is read once
  and its first Dv channels are the value tile) -- plus Q, the lengths and,
  on a paged cache, one int32 block-table entry per page used; it writes the
  output and lse, or with ``S`` > 1 splits float32 partials
  ``B Hq Nq S (Dv + 1) 4``.  More than 64 packed rows (``Hq / Hkv x Nq``)
  make several query blocks, each of whose programs loads the cache's tiles
  again: ``tile_read_bytes`` counts those loads, the DRAM bytes count the
  cache once (the query blocks of a split run side by side in the grid, the
  repeats come from L2).
* ``combine`` (``S`` > 1): the partials read, the output and lse written.

FLOPs: ``2 B Hq P (D + Dv)`` with ``P`` the visible (query, key) pairs of a
head (``P = L`` for one query token): Q K^T over D, P V over Dv.

The absorbed MLA layout (DeepSeek-V3: one kv head, D = 576, Dv = 512, a
shared cache) at one query token reads 576 e bytes a key per batch element and
computes ``2 Hq 1088`` FLOPs on it: ``Hq x 1088 / 576`` FLOP a byte in bf16,
30 at 16 heads and 242 at 128.  The H200's ridge (bf16) is 206 FLOP a byte
by its datasheet (989 TFLOP/s over 4.8 TB/s) and 187 as measured here
(789 TFLOP/s, 4.21 TB/s, ``tileattn calibrate``): 16 heads are memory-bound,
128 heads compute-bound, the crossover near 109 heads (99 measured);
:func:`crossover_heads`.
"""
from __future__ import annotations

import dataclasses
import math

from .flops import visible_pairs
from .hardware import Hardware
from .io import Pass, TrafficEstimate
from .roofline import PhasePrediction, peak_dtype, predict
from .shape import DTYPE_BYTES, LSE_BYTES, _check_int, dtype_bytes

__all__ = ["DecodeShape", "MLA_HEAD_DIM", "MLA_HEAD_DIM_V", "crossover_heads", "decode_bound", "decode_cache_bytes",
           "decode_flops", "decode_traffic"]

MLA_HEAD_DIM = 576
MLA_HEAD_DIM_V = 512
INDEX_BYTES = 4            # cache_seqlens and block-table entries are int32
MAX_BLOCK_ROWS = 64        # packed query rows per program (configs.MAX_DECODE_BLOCK_M)


@dataclasses.dataclass(frozen=True)
class DecodeShape:
    """One decoding step: q (B, Hq, Nq, D), a cache of ``cache_len`` keys per
    batch element with K (.., D) and V (.., Dv), ``n_new`` of them appended by
    the step; ``shared_kv``: V is K's first Dv channels (one storage);
    ``num_splits`` programs per (batch element, kv head); ``page_size`` 0 for a
    contiguous cache."""

    batch: int
    heads: int
    kv_heads: int
    cache_len: int
    head_dim: int = 128
    head_dim_v: int | None = None
    seqlen_q: int = 1
    dtype: str = "bf16"
    shared_kv: bool = False
    causal: bool = True
    n_new: int = 0
    num_splits: int = 1
    page_size: int = 0

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        for name in ("batch", "heads", "kv_heads", "head_dim", "seqlen_q", "num_splits"):
            set_(name, _check_int(name, getattr(self, name)))
        set_("cache_len", _check_int("cache_len", self.cache_len, 0))
        set_("n_new", _check_int("n_new", self.n_new, 0))
        set_("page_size", _check_int("page_size", self.page_size, 0))
        set_("head_dim_v", self.head_dim if self.head_dim_v is None else _check_int("head_dim_v", self.head_dim_v))
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.shared_kv and self.head_dim_v >= self.head_dim:
            raise ValueError(f"shared_kv needs head_dim_v < head_dim (V is K's first channels), got "
                             f"{self.head_dim_v} and {self.head_dim}")
        if self.n_new > self.cache_len:
            raise ValueError(f"n_new={self.n_new} exceeds cache_len={self.cache_len} (the keys after the append)")
        dtype_bytes(self.dtype)

    @classmethod
    def absorbed_mla(cls, batch: int, heads: int, cache_len: int, **kw) -> "DecodeShape":
        """DeepSeek-V3's absorbed layout: one kv head, D = 576, Dv = 512, shared."""
        return cls(batch, heads, 1, cache_len, MLA_HEAD_DIM, MLA_HEAD_DIM_V, shared_kv=True, **kw)

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def query_blocks(self) -> int:
        """Programs per (batch element, kv head, split): the packed rows over 64."""
        return math.ceil(self.heads // self.kv_heads * self.seqlen_q / MAX_BLOCK_ROWS)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def decode_flops(shape: DecodeShape) -> float:
    """Matmul FLOPs of the step: ``2 B Hq P (D + Dv)``, P the visible pairs."""
    pairs = visible_pairs(shape.seqlen_q, shape.cache_len, shape.causal)
    return 2.0 * shape.batch * shape.heads * pairs * (shape.head_dim + shape.head_dim_v)


def decode_cache_bytes(shape: DecodeShape) -> float:
    """The cache bytes a step must read once: K, and V unless it is K's
    first channels (the numerator of a decoding benchmark's bandwidth)."""
    width = shape.head_dim + (0 if shape.shared_kv else shape.head_dim_v)
    return float(shape.batch * shape.kv_heads * shape.cache_len * width * shape.elem_bytes)


def decode_traffic(shape: DecodeShape) -> TrafficEstimate:
    """The passes of one step (the module docstring has the formulas)."""
    s, e = shape, shape.elem_bytes
    b, hq, hkv, nq, d, dv = s.batch, s.heads, s.kv_heads, s.seqlen_q, s.head_dim, s.head_dim_v
    passes = []
    if s.n_new:
        new = b * hkv * s.n_new * (d if s.shared_kv else d + dv) * e
        passes.append(Pass("append", "fwd", new + b * INDEX_BYTES, new, kernel="append",
                           note="k_new alone (V is its first channels)" if s.shared_kv else ""))
    cache = decode_cache_bytes(s)
    pages = b * math.ceil(s.cache_len / s.page_size) * INDEX_BYTES if s.page_size else 0
    q = b * hq * nq * d * e
    out = b * hq * nq * (dv * e + LSE_BYTES)
    partials = b * hq * nq * s.num_splits * (dv + 1) * 4
    passes.append(Pass("decode", "fwd", q + cache + b * INDEX_BYTES + pages, out if s.num_splits == 1 else partials,
                       flops=decode_flops(s), tile_read_bytes=q + cache * s.query_blocks + b * INDEX_BYTES + pages,
                       kernel="decode", note="K read once, V its first channels" if s.shared_kv else ""))
    if s.num_splits > 1:
        passes.append(Pass("combine", "fwd", partials, out, kernel="combine"))
    return TrafficEstimate("decode", s, tuple(passes), {"query_blocks": s.query_blocks})


def decode_bound(shape: DecodeShape, hw: Hardware, basis: str = "datasheet") -> PhasePrediction:
    """The roofline of the step on ``hw``: intensity, ridge, ``bound``
    ("memory", "compute" or "latency") and the predicted time."""
    return predict(decode_traffic(shape), hw, basis=basis)["fwd"]


def crossover_heads(hw: Hardware, head_dim: int = MLA_HEAD_DIM, head_dim_v: int = MLA_HEAD_DIM_V,
                    dtype: str = "bf16", shared_kv: bool = True, basis: str = "datasheet") -> float:
    """Query heads per kv head above which a one-token step over a long cache
    is compute-bound: the ridge point over the FLOPs a cached byte costs
    (``2 (D + Dv) / ((D + Dv unless shared) e)`` per head)."""
    width = head_dim + (0 if shared_kv else head_dim_v)
    per_head = 2.0 * (head_dim + head_dim_v) / (width * DTYPE_BYTES[dtype])
    return hw.ridge_point(peak_dtype(dtype), basis) / per_head
