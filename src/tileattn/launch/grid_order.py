"""The order of the Hopper kernels' one-program-a-block grids: the
backward's key blocks (``kernels/bwd_hopper*.py``) and the forward's query
tiles where it does not run persistent (``kernels/fwd_hopper.py``).

A backward program owns one key block (two with pairing) of one grid row
(a kv head, or a slice of its query heads) of one batch element; a forward
program one query tile of one head.  Without causal every program has the
same work.  With it, key block j sees the query tiles from its diagonal on
(the first block all of them, the last one), and query tile i the key tiles
up to its diagonal.  The GPU hands programs out in launch order to the
first free SM, so the order decides how well the SMs stay busy at the end;
:func:`balance` simulates that list schedule (tiles as the unit of work).

Two remedies, both chosen here from the simulation:

* **grouped rows** (every such kernel): the blocks of ``G`` (row, batch)
  pairs go out together, longest first (block 0 of the G pairs, then block
  1, ...), with G pairs about one wave of programs (G x blocks ~ SMs), so
  that the programs running at once still span about as many heads as one
  pair after another does (the L2 holds their operands and dQ sums) while
  no long program starts last;
* **pairs** (``kernels/bwd_hopper.py``, d = 64/128): a program takes key
  blocks j and n-1-j, one after the other (equal work a program, but half
  the programs, and the pipeline drains between the two blocks).
"""
from __future__ import annotations

import functools
import heapq

from ..configs import HopperBwdConfig, HopperFwdConfig
from .runtime import sm_count

# Pairing blocks j and n-1-j: on the H200 (perf-notes v16) it won 31 % at GQA 8,
# 4k (the one-row-after-another grid kept the SMs busy 63 % of the time by the
# list schedule below, paired 97 %) and lost 1-10 % where the grid was already
# balanced (MHA, GQA at 16k).
PAIR_MARGIN = 0.1       # pair where the simulated balance gains at least this


def balance(works: tuple, sms: int) -> float:
    """The SMs' busy fraction when programs of these works (in launch order)
    go to the first free SM, each with half a tile of fixed cost."""
    free = [0.0] * min(sms, len(works))
    for w in works:
        heapq.heappush(free, heapq.heappop(free) + w + 0.5)
    return sum(works) / (max(free) * sms) if works else 1.0


def block_tiles(n_q: int, n_k: int, block_keys: int, block_m: int) -> tuple[int, ...]:
    """The query tiles of each key block of a causal call (bottom-right:
    row i sees key j iff j <= i + n_k - n_q)."""
    def tiles(j):
        m_lo = max(j * block_keys - (n_k - n_q), 0) // block_m * block_m
        return max(-(-(n_q - m_lo) // block_m), 0)
    return tuple(tiles(j) for j in range(-(-n_k // block_keys)))


def grouped_order(works: tuple, copies: int, rows: int) -> tuple:
    """Launch order of ``copies`` (row, batch) pairs of these key blocks'
    works, the blocks of ``rows`` pairs at a time interleaved (``rows``
    divides ``copies``; as ``_grid_coords`` in ``kernels/fwd_hopper_load.py``
    walks them); 1: one pair after another."""
    assert copies % rows == 0, (copies, rows)
    return tuple(w for _ in range(copies // rows) for w in works for _ in range(rows))


GRID_Z_MAX = 65535   # a CUDA grid's third dimension


def _divisor(copies: int, target: int) -> int:
    """The largest divisor of ``copies`` at most ``target`` (at least 1), raised
    to the smallest that leaves at most ``GRID_Z_MAX`` groups."""
    best = next(d for d in range(max(1, min(copies, target)), 0, -1) if copies % d == 0)
    if copies // best > GRID_Z_MAX:   # the first divisor from there that fits (the search stops at it)
        best = next(d for d in range(max(best, -(-copies // GRID_Z_MAX)), copies + 1) if copies % d == 0)
    return best


def rule_rows(n_blocks: int, copies: int, sms: int) -> int:
    """The pairs a group: about one wave of programs (the largest divisor of
    ``copies`` at most round(SMs / key blocks))."""
    return _divisor(copies, round(sms / max(n_blocks, 1)))


def group_rows(causal: bool, n_blocks: int, copies: int, cfg: HopperBwdConfig | HopperFwdConfig, sms: int) -> int:
    """The (row, batch) pairs a group of a one-program-a-block grid:
    ``cfg.group_rows`` where set (the largest divisor of ``copies`` not
    above it), else :func:`rule_rows` for a causal call and 1 (the order
    does not matter) without causal, unless the grid's limit needs more."""
    if cfg.group_rows is not None:
        return _divisor(copies, cfg.group_rows)
    return rule_rows(n_blocks, copies, sms) if causal else _divisor(copies, 1)


def compiled_grouped(causal: bool, cfg: HopperBwdConfig | HopperFwdConfig, other_grid: bool = False) -> bool:
    """Whether a compile report builds the grouped variant (``GROUPED``): as
    a causal launch of ``cfg`` takes it where the rule groups more than one
    pair; not with ``group_rows=1``, nor where the call runs another grid
    (``other_grid``: the persistent forward, the paired backward)."""
    return bool(causal) and not other_grid and cfg.group_rows != 1


def grid(n_blocks: int, n_rows: int, batch: int, rows: int) -> tuple[tuple[int, int, int], bool]:
    """(the launch grid, GROUPED): (key blocks, rows, batch) for groups of
    one pair, else (G, key blocks, groups) (``_grid_coords``' GROUPED)."""
    if rows == 1 and batch <= GRID_Z_MAX:
        return (n_blocks, n_rows, batch), False
    return (rows, n_blocks, n_rows * batch // rows), True


@functools.lru_cache(maxsize=256)
def pairs_pay(n_q: int, n_k: int, copies: int, block_keys: int, block_m: int, sms: int,
              rows: int | None = None) -> bool:
    """Whether the causal backward should take key blocks in mirror-image
    pairs (``HopperBwdConfig.pair_blocks=None``): the simulated balance of
    the paired grid beats the plain one's, in groups of ``rows`` pairs
    (None: :func:`rule_rows`), by ``PAIR_MARGIN``.  ``copies``: batch x grid
    rows; ``block_keys``: keys a program's block."""
    plain = block_tiles(n_q, n_k, block_keys, block_m)
    n_blocks = len(plain)
    pairs = tuple(plain[j] + (plain[n_blocks - 1 - j] if n_blocks - 1 - j > j else 0)
                  for j in range(-(-n_blocks // 2)))
    rows = rule_rows(n_blocks, copies, sms) if rows is None else _divisor(copies, rows)
    return balance(pairs * copies, sms) >= balance(grouped_order(plain, copies, rows), sms) + PAIR_MARGIN


def paired(q, k, causal: bool, cfg: HopperBwdConfig, slices: int = 1) -> bool:
    """Whether this call's d = 64/128 backward takes key blocks in pairs:
    ``cfg.pair_blocks`` where set (without causal too: two key blocks of
    equal work a program, half the programs), else for a causal call where
    :func:`pairs_pay`."""
    if cfg.pair_blocks is not None:
        return bool(cfg.pair_blocks)
    if not causal:
        return False
    b, _, n_q, _ = q.shape
    return pairs_pay(n_q, k.shape[2], b * k.shape[1] * slices, 2 * cfg.block_n, cfg.block_m, sm_count(q.device),
                     cfg.group_rows)


def tail_split(total: int, programs: int) -> tuple[int, int]:
    """(MAIN, SPLIT) of a persistent walk of ``total`` equal work items over
    ``programs`` programs (the backward's, ``HopperBwdConfig.split_tail``):
    the items before MAIN go whole, in full rounds; each of the rest (fewer
    than ``programs``) is cut along its query tiles into SPLIT pieces, one a
    program, where SPLIT >= 2 (else (total, 1): no split)."""
    main = total // programs * programs
    tail = total - main
    split = programs // tail if tail else 0
    return (main, split) if split >= 2 else (total, 1)
