"""Kernel launch configurations as data, with where the numbers came from.

A config fixes the tile shape (BLOCK_M query rows x BLOCK_N key rows), the
number of warps and the software-pipelining depth.  The shared-memory
footprint of a config is estimated by :func:`fwd_smem_bytes` /
:func:`bwd_smem_bytes`; the same functions back the tile-shape solver in
``tileattn.cost`` so that the cost model and the kernels agree on what fits.

On a GPU the launcher autotunes over the bucket's candidates that fit the
device's shared memory; under ``TRITON_INTERPRET=1``, one small config.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    source: str = ""

    def as_meta(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n}

    @property
    def name(self) -> str:
        return f"M{self.block_m}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}"


def block_d(head_dim: int) -> int:
    """Head dim padded to the power of two the kernels tile with (>= 16 for tl.dot)."""
    return max(16, 1 << (int(head_dim) - 1).bit_length())


# mbarriers and bookkeeping the compiler adds to the tiles
_SMEM_OVERHEAD = 2048


def _widths(head_dim: int, head_dim_v: int | None) -> tuple[int, int]:
    """The tile widths (BLOCK_D, BLOCK_DV) of Q/K and of V/O/dO (V's head dim defaults to Q's)."""
    d = block_d(head_dim)
    return d, (d if head_dim_v is None else block_d(head_dim_v))


def fwd_smem_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int, num_stages: int,
                   head_dim_v: int | None = None) -> int:
    """Shared memory of a forward program: the Q tile plus K and V tiles
    buffered ``num_stages`` deep (P feeds the second matmul from registers).
    Matches the compiler's report for sm_90 with TMA loads within the
    overhead term (docs/perf-notes.md, compile report).  ``head_dim_v``:
    V's head dim where it differs from Q/K's."""
    d, dv = _widths(head_dim, head_dim_v)
    return elem_bytes * (d * block_m + num_stages * block_n * (d + dv)) + _SMEM_OVERHEAD


def _bwd_program_bytes(stream_rows: int, resident_rows: int, head_dim: int, elem_bytes: int,
                       num_stages: int, head_dim_v: int | None = None) -> int:
    # one tile of each width streamed (Q and dO, or K and V), one of each resident
    d, dv = _widths(head_dim, head_dim_v)
    return elem_bytes * (d + dv) * (num_stages * stream_rows + resident_rows) + _SMEM_OVERHEAD


def dkdv_smem_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int, num_stages: int,
                    head_dim_v: int | None = None) -> int:
    """dK/dV program: K and V tiles (BLOCK_N rows) resident, Q and dO tiles
    (BLOCK_M rows) streamed ``num_stages`` deep."""
    return _bwd_program_bytes(block_m, block_n, head_dim, elem_bytes, num_stages, head_dim_v)


def dq_smem_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int, num_stages: int,
                  head_dim_v: int | None = None) -> int:
    """dQ program: Q and dO tiles (BLOCK_M rows) resident, K and V tiles
    (BLOCK_N rows) streamed ``num_stages`` deep."""
    return _bwd_program_bytes(block_n, block_m, head_dim, elem_bytes, num_stages, head_dim_v)


def dkdv_atomic_smem_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int, num_stages: int,
                           head_dim_v: int | None = None) -> int:
    """The dK/dV program of the atomic backward: the dK/dV program's tiles,
    plus the float32 dQ tile staged for the copy engine's bulk reduce and dS
    transposed (BLOCK_M x BLOCK_N) for the dS K matmul.  Matches the sm_90
    compile report of the TMA path exactly (the pointer path needs less)."""
    return (dkdv_smem_bytes(block_m, block_n, head_dim, elem_bytes, num_stages, head_dim_v)
            + 4 * block_m * block_d(head_dim) + elem_bytes * block_m * block_n)


def bwd_smem_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int, num_stages: int,
                   head_dim_v: int | None = None) -> int:
    """The larger of the two backward programs for one config."""
    return max(dkdv_smem_bytes(block_m, block_n, head_dim, elem_bytes, num_stages, head_dim_v),
               dq_smem_bytes(block_m, block_n, head_dim, elem_bytes, num_stages, head_dim_v))


SMEM_ESTIMATORS = {"fwd": fwd_smem_bytes, "dkdv": dkdv_smem_bytes, "dkdv_atomic": dkdv_atomic_smem_bytes,
                   "dq": dq_smem_bytes}
HEAD_DIM_BUCKETS = (64, 128, 256, 512)


def _head_dim_bucket(head_dim: int) -> int:
    for bucket in HEAD_DIM_BUCKETS:
        if head_dim <= bucket:
            return bucket
    raise ValueError(f"head_dim={head_dim} exceeds {HEAD_DIM_BUCKETS[-1]}, the largest the kernels support")


_C = "sm_90 compile report, triton 3.6: no register spills (docs/perf-notes.md)"
_S = "H200 config sweep, triton 3.6 (benchmarks/config_sweep.py; docs/perf-notes.md v2)"
# Head dims 257..512: sized for shared memory, not swept (v14 timed the first).  Each note gives the estimate
# and the compile report (triton 3.6, bf16 unless float32 is named, compiled on a CPU for sm_90a with tensor
# descriptors or for sm_89 by pointers; benchmarks/compile_report.py): registers, spill stores non-causal/causal,
# the compiler's shared memory (perf-notes v13).  Without timings the order is the atomic table's rule: few spills
# first, then wider tiles; each table has a tile that fits 227 KB (sm_90), one 99 KB (sm_86/sm_89), float32's.
_W = "d > 256, sized for shared memory; first configs timed on the H200 (perf-notes v14), not swept"

# Autotuning candidates by head-dim bucket; the first that fits is also the choice with TILEATTN_AUTOTUNE=0.  The
# order follows the H200 sweep: the first is the best or within 3% of it at N = 2k..16k, causal and not.
FWD_CONFIGS: dict[int, tuple[KernelConfig, ...]] = {
    64: (
        KernelConfig(64, 128, 4, 3, _S + ": best non-causal and causal at 16k, within 3% at 2k"),
        KernelConfig(64, 64, 4, 3, _S + ": best causal at 2k"),
        KernelConfig(128, 64, 4, 3, _C),
    ),
    128: (
        KernelConfig(128, 128, 8, 3, _S + ": best at 16k and non-causal 2k"),
        KernelConfig(64, 64, 4, 3, _S + ": best causal at 2k"),
        KernelConfig(128, 64, 8, 4, _S),
    ),
    256: (
        KernelConfig(128, 64, 8, 2, _C),
        KernelConfig(64, 64, 4, 2, _C),
        KernelConfig(64, 32, 4, 2, _C),
        KernelConfig(32, 32, 4, 1, "float32 head dims > 128: the only tile under 227 KB"),
    ),
    512: (
        KernelConfig(64, 32, 8, 2, _W + ": 198,656 B; sm_90a wgmma 241/245 regs, no spills, 196,640 B "
                     "(by pointers 2,808/2,832 B)"),
        KernelConfig(32, 16, 8, 2, _W + ": 100,352 B, fits 99 KB; sm_89 229/239 regs, no spills, 50,176 B; "
                     "float32 on 227 KB: sm_90a spills 240/256 B"),
        KernelConfig(32, 16, 8, 1, _W + ": float32 on 163 KB, 133,120 B; sm_90a 254 regs, no spills"),
        KernelConfig(16, 16, 8, 1, _W + ": float32 on 99 KB, 100,352 B; sm_89 194 regs, no spills"),
    ),
}

# dK/dV keeps two fp32 accumulators and the K, V tiles in registers: small BLOCK_M keeps it near 255 registers.
DKDV_CONFIGS: dict[int, tuple[KernelConfig, ...]] = {
    64: (
        KernelConfig(32, 64, 4, 3, _S + ": best at 2k and 16k, causal and not"),
        KernelConfig(64, 64, 4, 3, _S),
    ),
    128: (
        KernelConfig(64, 128, 8, 2, _S + ": best causal (20% ahead at 16k), within 3% non-causal; spills 44/420 B"),
        KernelConfig(32, 64, 4, 3, _S + ": best non-causal"),
    ),
    256: (
        KernelConfig(32, 64, 8, 2, _C),
        KernelConfig(32, 32, 4, 1, "float32 head dims > 128: the only tile under 227 KB"),
        KernelConfig(16, 16, 8, 1, "float32 on 99 KB, 67,584 B, not yet timed; sm_89 158 regs, no spills "
                     "(dkdv_atomic 84,992 B: 198 regs, no spills)"),
    ),
    # dK and dV stay in registers (2 x BLOCK_N x 512 float32): BLOCK_N <= 32 on 8 warps, no wgmma (its M is
    # BLOCK_N); the causal diagonal stage's second loop spills on the descriptor path
    512: (
        KernelConfig(16, 16, 8, 2, _W + ": 100,352 B, fits 99 KB; sm_90a 192/255 regs, spills 0/708 B, "
                     "66,200 B; sm_89 spills 48/48 B; float32 on 227 KB: sm_90a spills 252/336 B"),
        KernelConfig(16, 32, 8, 2, _W + ": 133,120 B; sm_90a 255 regs, spills 24/2,392 B, 99,480 B (by "
                     "pointers 292/412 B)"),
        KernelConfig(32, 32, 8, 2, _W + ": 198,656 B; sm_90a 255 regs, spills 64/2,312 B, 133,400 B"),
        KernelConfig(16, 16, 8, 1, _W + ": float32 on 163 KB, 133,120 B; sm_90a 254/255 regs, spills 0/328 B"),
    ),
}

DQ_CONFIGS: dict[int, tuple[KernelConfig, ...]] = {
    64: (
        KernelConfig(64, 64, 4, 3, _S + ": best at 2k and 16k, causal and not"),
        KernelConfig(128, 128, 8, 2, _S),
    ),
    128: (
        KernelConfig(128, 128, 8, 2, _S + ": best at 2k and non-causal 16k"),
        KernelConfig(64, 64, 4, 3, _S + ": best causal 16k"),
    ),
    256: (
        KernelConfig(64, 64, 8, 2, _C),
        KernelConfig(32, 32, 4, 1, "float32 head dims > 128: the only tile under 227 KB"),
        KernelConfig(16, 16, 8, 1, "float32 on 99 KB, 67,584 B, not yet timed; sm_89 112 regs, no spills"),
    ),
    # BLOCK_M = 64 takes wgmma on sm_90 (Q and dO read from shared memory);
    # BLOCK_M = 32 on 8 warps compiled to 32 registers and 9 KB of spills
    512: (
        KernelConfig(64, 16, 8, 2, _W + ": 198,656 B; sm_90a wgmma 255 regs, spills 216/232 B, 196,624 B "
                     "(by pointers 3,722 B)"),
        KernelConfig(16, 16, 8, 2, _W + ": 100,352 B, fits 99 KB; sm_89 255 regs, no spills (sm_90a 700/712 B); "
                     "float32 on 227 KB: sm_90a no spills"),
        KernelConfig(16, 16, 8, 1, _W + ": float32 on 163 KB, 133,120 B; sm_90a 208 regs, no spills"),
    ),
}

# The dK/dV kernel of the atomic backward (deterministic=False) also holds
# the dQ tile and a transposed dS: more registers and shared memory
# (dkdv_atomic_smem_bytes), so it has its own table.  UNMEASURED: the order
# comes from the sm_90 compile report alone (bf16, TMA path, triton 3.6):
# no or few spills first, and a wide BLOCK_N (fewer dQ adds per query row,
# one per key block) before a narrow one.  The dK/dV table's first choice
# spills more here (d=64: 0/100 B non-causal/causal; d=128: 212/504 B).
_A = "sm_90 compile report, triton 3.6, bf16 TMA (benchmarks/compile_report.py, dkdv_atomic); not timed"
DKDV_ATOMIC_CONFIGS: dict[int, tuple[KernelConfig, ...]] = {
    64: (
        KernelConfig(32, 128, 8, 2, _A + ": no spills"),
        KernelConfig(32, 64, 4, 2, _A + ": no spills"),
        KernelConfig(32, 64, 4, 3, _A + ": the dK/dV table's first; spills 0/100 B"),
    ),
    128: (
        KernelConfig(32, 128, 8, 2, _A + ": spills 0/92 B"),
        KernelConfig(32, 64, 8, 2, _A + ": no spills"),
        KernelConfig(64, 128, 8, 2, _A + ": the dK/dV table's first; spills 212/504 B"),
    ),
    # the dK/dV table's: spills 24/168 B and 140/1396 B with the dQ adds
    # (0/32 and 12/1308 without); nothing better tried yet
    256: DKDV_CONFIGS[256],
    512: (
        KernelConfig(16, 32, 8, 2, _W + ": 166,912 B; sm_90a 255 regs, spills 28/2,364 B, 132,248 B"),
        KernelConfig(16, 16, 8, 1, _W + ": 100,864 B, fits 99 KB; sm_90a 182/128 regs, spills 0/1,596 B; "
                     "sm_89 spills 44/104 B; float32 (166,912 B) sm_90a spills 224/672 B"),
    ),
}

TABLES = {"fwd": FWD_CONFIGS, "dkdv": DKDV_CONFIGS, "dkdv_atomic": DKDV_ATOMIC_CONFIGS, "dq": DQ_CONFIGS}

# One small config for the Triton interpreter (no GPU timer to autotune with): fast, and still multi-tile loops.
INTERPRETER_FWD = KernelConfig(32, 32, 4, 1, "interpreter: smallest tile that tl.dot accepts x2")
INTERPRETER_BWD = KernelConfig(32, 32, 4, 1, "interpreter: smallest tile that tl.dot accepts x2")


def candidates(kind: str, head_dim: int, head_dim_v: int | None = None) -> tuple[KernelConfig, ...]:
    """The table's configs for a kernel kind ("fwd", "dkdv", "dkdv_atomic", "dq") and head dim; with
    a V head dim ``head_dim_v``, the table of the wider of the two."""
    return TABLES[kind][_head_dim_bucket(max(head_dim, head_dim if head_dim_v is None else head_dim_v))]


def fwd_candidates(head_dim: int) -> tuple[KernelConfig, ...]:
    return candidates("fwd", head_dim)


def bwd_candidates(head_dim: int) -> tuple[KernelConfig, ...]:
    """dK/dV candidates (the backward kernel that bounds the tile shape)."""
    return candidates("dkdv", head_dim)


def fitting(configs: Iterable[KernelConfig], head_dim: int, elem_bytes: int, smem_limit: int,
            backward: bool = False, kind: str | None = None, head_dim_v: int | None = None) -> list[KernelConfig]:
    """The configs whose shared-memory estimate fits ``smem_limit`` bytes; if none
    fits, the smallest one (the compiler then reports the real requirement).
    ``head_dim_v``: V's head dim where it differs from ``head_dim``."""
    kernel_est = SMEM_ESTIMATORS[kind or ("dkdv" if backward else "fwd")]

    def est(c):
        return kernel_est(c.block_m, c.block_n, head_dim, elem_bytes, c.num_stages, head_dim_v)
    configs = list(configs)
    ok = [c for c in configs if est(c) <= smem_limit]
    return ok or [min(configs, key=est)]


# Above this head dim (the 512 bucket) every table's estimates were checked
# against the compiler (sm_90a and sm_89, docs/perf-notes.md v13): each
# estimate is at or above the compiled kernel's shared memory, the
# backward's smallest float32 tiles within 2 % of it.  A call there whose
# smallest tile does not fit is refused (check_fits) before anything runs.
# At or below it the smallest tile is launched and the compiler has the
# last word: the estimate overshoots float32 there (d = 64, M64-N64-s3 on
# sm_89: 116,736 B estimated, 98,304 B compiled, which runs).
SMEM_CHECKED_ABOVE = 256

KERNEL_NAMES = {"fwd": "forward kernel", "dkdv": "backward's dK/dV kernel", "dq": "backward's dQ kernel",
                "dkdv_atomic": "atomic backward's dK/dV kernel (deterministic=False)"}


def check_fits(kinds: Iterable[str], head_dim: int, elem_bytes: int, smem_limit: int,
               head_dim_v: int | None = None, dtype: str = "") -> None:
    """ValueError when a kernel of ``kinds`` has no config of its table whose
    estimate fits ``smem_limit`` bytes per block, for head dims above
    ``SMEM_CHECKED_ABOVE`` (the launch would fail in the compiler);
    ``dtype`` names the inputs' dtype in the message."""
    dv = head_dim if head_dim_v is None else head_dim_v
    if max(head_dim, dv) <= SMEM_CHECKED_ABOVE:
        return
    for kind in kinds:
        est = SMEM_ESTIMATORS[kind]
        smallest = min(candidates(kind, head_dim, head_dim_v),
                       key=lambda c: est(c.block_m, c.block_n, head_dim, elem_bytes, c.num_stages, head_dim_v))
        need = est(smallest.block_m, smallest.block_n, head_dim, elem_bytes, smallest.num_stages, head_dim_v)
        if need > smem_limit:
            dims = f"head_dim={head_dim}" + ("" if dv == head_dim else f", v's head_dim={dv}")
            hint = "float16 or bfloat16, or " if elem_bytes > 2 else ""
            raise ValueError(
                f"{dims} in {dtype or f'{elem_bytes}-byte elements'} does not fit this GPU's shared memory: "
                f"the {KERNEL_NAMES[kind]}'s smallest tile ({smallest.name}) needs {need:,} bytes per block, "
                f"the GPU has {smem_limit:,}; use {hint}head dims of at most {SMEM_CHECKED_ABOVE}")


def all_configs() -> list[tuple[str, int, KernelConfig]]:
    """Every (kind, head-dim bucket, config) in the tables, for tests that force each once."""
    return [(kind, bucket, c) for kind, table in TABLES.items() for bucket, cfgs in table.items() for c in cfgs]


# Hopper forward (Gluon, kernels/fwd_hopper.py): block_m query rows a softmax warpgroup, a one-warp loader.
@dataclasses.dataclass(frozen=True)
class HopperFwdConfig:
    block_m: int = 64           # query rows per softmax warpgroup
    block_n: int = 128
    num_stages: int = 2
    overlap: bool = True        # issue Q K_j^T with P_{j-1} V_{j-1}; softmax j under the latter
    pingpong: bool = True       # the warpgroups take turns issuing their products
    persistent: bool = False    # d <= 128: one program an SM walks query tiles; the next tile's Q lands under this one
    defer_o: bool = False       # persistent: O's (and a staged remainder's) copy waited on under the next tile
    row_tree: bool = False      # a tile's row max as a tree of register blocks; row sums a thread's own till the end
    stream_k: bool = False      # persistent, non-causal: the last wave's key tiles cut evenly over the programs
    group_rows: int | None = None   # causal, not persistent: as HopperBwdConfig's (query tiles of G (head, batch))
    warpgroups: int = 2         # softmax warpgroups: 2 (maxnreg 168: 240 registers each), 3 (d <= 64, 128: 160)
    early_p: bool = False       # overlap: P made 16-bit once the last P V completed (not at the next P V's issue)
    num_warps: int = 4          # per softmax warpgroup (the default partition)
    maxnreg: int = 168
    source: str = ""

    @property
    def name(self) -> str:
        flags = (("-ov", self.overlap), ("-pp", self.pingpong), ("-pers", self.persistent), ("-dfo", self.defer_o),
                 ("-rt", self.row_tree), ("-sk", self.stream_k), (f"-g{self.group_rows}", self.group_rows),
                 ("-ep", self.early_p))
        return f"hopper-M{self.block_m}x{self.warpgroups}-N{self.block_n}-s{self.num_stages}" + "".join(
            f for f, on in flags if on)


@dataclasses.dataclass(frozen=True)
class HopperBwdConfig:
    block_m: int = 64           # query rows per tile
    block_n: int = 64           # keys per compute warpgroup (a program owns 2 * block_n)
    num_stages: int = 2         # Q/dO ring slots
    dk_from_smem: bool = False  # dK += dSᵀ Q reads dSᵀ from shared memory (else registers)
    defer_sums: bool = False    # sinks, d = 64/128: a tile's dS row sums added under the next tile's products
    pair_blocks: bool | None = None  # d = 64/128: key blocks j, n-1-j a program (None: causal where pairs_pay)
    stats_tma: bool = False     # d = 64/128: lse₂ and Δ by the copy engine into shared memory (else loads)
    dq_turns: bool = False      # d = 64/128: the warpgroups take turns forming a tile's whole dQ (else half each)
    head_slices: int | None = None  # GQA, d = 64/128: grid rows a kv head (None: launch.hopper.head_slices)
    sink_sums: bool = False     # sinks, no remainder: their gradient from per-head sums (else dS row sums); v53: lost
    group_rows: int | None = None   # causal: grid rows whose key blocks go out together (None: launch.grid_order)
    persistent: bool = False    # d = 64 plain calls: a program an SM walks key blocks, K/V in two buffers
    split_tail: bool = False    # persistent, non-causal: the last round's blocks cut along their query tiles
    num_warps: int = 4          # per compute warpgroup (the default partition)
    maxnreg: int = 168
    source: str = ""

    @property
    def name(self) -> str:
        on = (("-dks", self.dk_from_smem), ("-ds", self.defer_sums), ("-st", self.stats_tma), ("-dqt", self.dq_turns),
              ("-paired", self.pair_blocks is True), ("-unpaired", self.pair_blocks is False),
              (f"-hs{self.head_slices}", self.head_slices is not None), (f"-g{self.group_rows}", self.group_rows),
              ("-ss", self.sink_sums), ("-pers", self.persistent), ("-tail", self.split_tail))
        return f"hopper-bwd-M{self.block_m}-N{self.block_n}x2-s{self.num_stages}" + "".join(f for f, x in on if x)


# (head dim, causal) -> the fewest keys at which the default dispatch takes the Hopper kernel (a forced config always
# does); below it the portable kernel was as fast or faster on the H200 (perf-notes v11, v15, v19).
HOPPER_FWD_MIN_KEYS = {**{(d, c): 2048 for d in (64, 128, 192, 256) for c in (False, True)}, (192, False): 1024}
# head dim -> narrowest window (left + right + 1) the Hopper forward takes, widest it runs persistent (v48, v50)
HOPPER_FWD_WINDOW_MIN_SPAN = {64: 513, 128: 1}
HOPPER_FWD_WINDOW_PERSISTENT_SPAN = {64: 4095, 128: 2049}
# (head dim, causal) -> the most keys at which the table's forward runs persistent, with sinks or without (v19, v26,
# v27, v41; v45: d = 64 causal 8k one program a tile 423 TFLOP/s against 409 persistent, 16k 457 / 433)
HOPPER_FWD_PERSISTENT_MAX_KEYS = {(64, False): 8192, (64, True): 4096, (128, False): 4096, (128, True): 4096}
# (head dim, causal) -> early_p in the persistent form (H100, d = 64 causal 2k / 4k: +4.8 / +0.9 % v51, +3.1 / +1.2 % v54)
HOPPER_FWD_PERSISTENT_EARLY_P = {(64, True)}
# (QK head dim, V head dim) -> config.  QK 192 / V 128 (MLA): 2 Q tiles of 64 x 192 + 2 stages of K (128 x 192)
# and V (128 x 128) = 212,992 B; O (as wide as V) is staged in the Q tile's first piece.  256: 64-key tiles
# (2 Q tiles of 64 KB + 2 stages of 2 x 32 KB = 196,608 B; O is 128 registers a thread of the 240).
HOPPER_FWD = {
    # d = 64 without ping-pong turns: +0.7-2.7 % one program a tile, causal +1.0-2.2 % persistent (two runs, v26);
    # row_tree: persistent +2.5-7 % at 2k-4k, level at 8k; one program a tile +1-5 % at 8k-16k (H100, v45)
    (64, 64): HopperFwdConfig(num_stages=2, pingpong=False, row_tree=True,
                              source="sm_90a compile report; H200 timing in perf-notes v11, v26; H100 v45"),
    (128, 128): HopperFwdConfig(num_stages=2, row_tree=True,   # row_tree: -1.4..+3.6 % 2k-16k (H100, v45)
                                source="sm_90a compile report; H200 timing in perf-notes v11; H100 v45"),
    (192, 128): HopperFwdConfig(num_stages=2, source="sm_90a compile report; H200 timing in perf-notes v14, v15"),
    (256, 256): HopperFwdConfig(block_n=64, num_stages=2, source="sm_90a compile report; H200 timing, v14, v15")}
# (QK, V) -> non-causal calls' config (no window, not packed) where not HOPPER_FWD's; d = 64: three warpgroups
HOPPER_FWD_NONCAUSAL = {(64, 64): HopperFwdConfig(pingpong=False, row_tree=True, warpgroups=3, maxnreg=128,
                                                  early_p=True, source="H100: +3..+12 % at 2k-16k; perf-notes v51")}
# (QK, V head dim) -> config (perf-notes v12: dk_from_smem; v16: defer_sums; v17: stats_tma; v19: dq_turns; v15)
HOPPER_BWD = {
    (64, 64): HopperBwdConfig(dk_from_smem=True, defer_sums=True, stats_tma=True, dq_turns=True,
                              source="H200 timing, v12, v16, v17, v19"),
    (128, 128): HopperBwdConfig(dk_from_smem=False, stats_tma=True, source="H200 timing, perf-notes v12, v17"),
    (192, 128): HopperBwdConfig(block_m=32, num_stages=2, source="sm_90a compile report, perf-notes v15"),
    (256, 256): HopperBwdConfig(block_m=64, block_n=32, num_stages=1,   # kernels/bwd_hopper_split.py
                                source="sm_90a compile report (229,904 B, no spills); H200 timing, v28, v30")}
# (head dim, causal) -> the keys (fewest, most) at which plain backward calls (no sinks, window or packing, no GQA)
# run persistent, the last round cut without causal (H200 v56: +2.4..+2.7 % non-causal 2k-16k, causal +3..+4 % 2k-4k)
HOPPER_BWD_PERSISTENT_KEYS = {(64, False): (2048, 16384), (64, True): (2048, 4096)}


# ---- KV-cache decoding (kernels/decode.py, launched by launch/decode.py) ----
@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Key tile, warps and pipeline depth of the partial kernel (BLOCK_M, the
    packed query rows, follows from the group size and Nq), and the cache
    layouts it is a candidate for ("contiguous", "paged" or "any")."""
    block_n: int
    num_warps: int
    num_stages: int
    source: str = ""
    layout: str = "any"

    def as_meta(self) -> dict:
        return {"BLOCK_N": self.block_n}

    @property
    def name(self) -> str:
        return f"N{self.block_n}-w{self.num_warps}-s{self.num_stages}"

    def serves(self, paged: bool) -> bool:
        return self.layout == "any" or self.layout == ("paged" if paged else "contiguous")


# query rows packed per program: group size x Nq, padded to >= 16 for tl.dot
MAX_DECODE_BLOCK_M = 64


def decode_block_m(group_size: int, n_q: int) -> int:
    """BLOCK_M of the partial kernel: the group's query rows (group size x
    Nq) rounded up to a power of two, at least 16, at most MAX_DECODE_BLOCK_M."""
    rows = group_size * n_q
    return min(MAX_DECODE_BLOCK_M, max(16, 1 << (rows - 1).bit_length()))


def decode_pipeline_buffers(num_stages: int, paged: bool) -> int:
    """K/V tiles the pipeliner buffers ahead at ``num_stages`` (see DECODE_CONFIGS)."""
    return max(1, (num_stages - 1) // 2 if paged else num_stages - 1)


# float32 accumulator registers a thread may hold (BLOCK_M x V's tile / threads):
# 64 x 512 over 8 warps is 128; more leaves too few for the tiles and spills
MAX_ACC_REGS = 128


def decode_acc_regs(block_m: int, head_dim_v: int, num_warps: int) -> int:
    """Registers a thread holds of the partial kernel's float32 accumulator."""
    return block_m * block_d(head_dim_v) // (32 * num_warps)


def decode_uses_wgmma(block_m: int, elem_bytes: int) -> bool:
    """Whether the partial kernel's products are warpgroup MMAs on sm_90
    (64 or more packed rows of a 16-bit cache; fewer rows take mma.sync)."""
    return block_m >= 64 and elem_bytes == 2


_U = "untuned: chosen for H200 bandwidth (K+V stage >= 16 KB, >= 2 programs/SM), to be measured"
_SWEEP = ("H200 sweep, B=16 Hq=32 Hkv=8 d=128 bf16, one split, 16k / 64k keys "
          "(docs/results/h200/v5/cfg_sweep; SDPA-cuDNN 254 / 954 us)")

# Candidates per cache layout, in order of preference (measured for 16-bit caches and up to 16 packed
# query rows): there a decoding call takes the first that fits, without timing -- the configs of a layout
# are within a few percent, and the autotuner's short first-call timings picked a 4 % slower one in a
# benchmark run (docs/perf-notes.md, v6); other shapes autotune (launch/decode.py, decode_autotune_enabled).
# A stage holds a K and a V tile: 2 x BLOCK_N x D x elem.  On a paged cache each tile's address comes from
# a block-table load, and the pipeliner gives that load a stage of its own: num_stages s buffers
# (s - 1) // 2 tiles ahead there, against s - 1 on a contiguous cache (sm_90 TTGIR, triton 3.6), so paged
# candidates run deeper.
DECODE_CONFIGS: tuple[DecodeConfig, ...] = (
    DecodeConfig(128, 4, 3, _SWEEP + ": 254 / 956 us", "contiguous"),
    DecodeConfig(64, 4, 4, _SWEEP + ": 257 / 959 us", "contiguous"),
    DecodeConfig(64, 4, 3, _SWEEP + ": 265 / 1001 us", "contiguous"),
    DecodeConfig(128, 4, 5, _SWEEP + ": 256-token pages 254 / 961 us, 16-token pages (pointers) 267 / 998 us; "
                 "v6 gather, CUDA-graph replay (docs/results/h200/v6/cfg_page16.log): 16-token pages 245 / 958 us "
                 "against N128-w4-s7 248 / 973 and N64-w4-s7 271 / 1065 us", "paged"),
    DecodeConfig(64, 4, 7, _SWEEP + ": 256-token pages 254 / 957 us", "paged"),
    DecodeConfig(64, 4, 5, _SWEEP + ": 256-token pages 265 / 1010 us", "paged"),
    DecodeConfig(32, 4, 4, _U),
    DecodeConfig(16, 4, 4, "small tiles for head dim 256 in float32"),
)
INTERPRETER_DECODE = DecodeConfig(16, 4, 1, "interpreter: the smallest tile tl.dot accepts")

# A shared cache (v_cache = k_cache[..., :Dv], the absorbed MLA layout: D = 576, Dv = 512, one kv head): each
# stage holds one 576-wide key tile (36 KB at BLOCK_N = 32 in bf16) and Q is 64 x 576 (72 KB) at 64 packed rows.
# 8 warps: at 64 rows the 64 x 512 float32 accumulator is 128 registers a thread (MAX_ACC_REGS); at 16 rows 4
# warps need 255.  Chosen from sm_90 compiles (triton 3.6, bf16; registers / shared memory / spills a thread;
# docs/decoding.md has the table), not yet timed: 16 rows take the first that fits, 64 rows autotune over the
# table (decode_autotune_enabled).
_SHARED = "sm_90 compile, D=576 Dv=512 bf16, not timed: "
DECODE_SHARED_CONFIGS: tuple[DecodeConfig, ...] = (
    DecodeConfig(32, 8, 3, _SHARED + "16 rows 189 regs / 93 KB / 0, 2 tiles in flight; "
                 "64 rows 255 regs / 184 KB / 8 B", "contiguous"),
    DecodeConfig(32, 8, 2, _SHARED + "16 rows 189 regs / 56 KB / 0; 64 rows 252 regs / 147 KB / 0", "contiguous"),
    DecodeConfig(16, 8, 4, _SHARED + "16 rows 168 regs / 74 KB / 0; 64 rows 245 regs / 147 KB / 0", "contiguous"),
    DecodeConfig(32, 8, 5, _SHARED + "16 rows, 256-token pages by descriptor 190 regs / 129 KB / 0; 64 rows "
                 "(pages by pointer) 255 regs / 185 KB / 4 B", "paged"),
    DecodeConfig(32, 8, 3, _SHARED + "16 rows, 256-token pages by descriptor 187 regs / 92 KB / 0", "paged"),
    DecodeConfig(16, 8, 2, "small tiles for float32 caches"),
)
