"""The ring schedule: which K/V block a rank holds at each step, and which part
of it its queries see.

At step ``t`` rank ``r`` holds the K/V block that rank ``(r - t) mod W`` owns
(it arrived from rank ``r - 1`` and leaves for rank ``r + 1``).  Under a causal
mask each (query shard, key block) pair is one of:

``diagonal``      the rank's own block: causal attention of the shard on itself
                  (correct for both layouts, because each shard lists its
                  tokens in sequence order);
``full``          every query sees every key of the block;
``early-keys``    zigzag, source < rank: all queries see the block's first
                  chunk (chunk ``s``), none sees its second;
``late-queries``  zigzag, source > rank: only the shard's second chunk
                  (chunk ``2W-1-r``) sees the block, and sees all of it;
``hidden``        contiguous, source > rank: no query sees any key; skipped.

With zigzag every non-diagonal step is half a block pair, so every rank does
the same work.  Plain Python (no torch), shared with the cost model.
"""
from __future__ import annotations

import dataclasses

from .layout import check_layout

__all__ = ["BlockPlan", "KINDS", "block_plan", "ring_plan", "source_rank"]

KINDS = ("diagonal", "full", "early-keys", "late-queries", "hidden")


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """What one rank computes against one K/V block: local query rows
    ``[q_start, q_stop)`` against block rows ``[k_start, k_stop)``, causal
    (bottom-right aligned, here square) or not."""

    kind: str
    source: int
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    causal: bool

    @property
    def computes(self) -> bool:
        return self.kind != "hidden"

    @property
    def n_q(self) -> int:
        return self.q_stop - self.q_start

    @property
    def n_k(self) -> int:
        return self.k_stop - self.k_start

    def pairs(self) -> int:
        """Visible (query, key) pairs per head."""
        if not self.computes:
            return 0
        if self.causal:  # square diagonal block
            return self.n_q * (self.n_q + 1) // 2
        return self.n_q * self.n_k


def source_rank(rank: int, step: int, world_size: int) -> int:
    """The rank whose K/V block rank ``rank`` holds at ``step``."""
    return (rank - step) % world_size


def block_plan(layout: str, causal: bool, rank: int, source: int, n_local: int) -> BlockPlan:
    """The part of ``source``'s K/V block that ``rank``'s queries see."""
    layout = check_layout(layout)
    if not causal:
        return BlockPlan("full", source, 0, n_local, 0, n_local, False)
    if source == rank:
        return BlockPlan("diagonal", source, 0, n_local, 0, n_local, True)
    if layout == "contiguous":
        if source < rank:
            return BlockPlan("full", source, 0, n_local, 0, n_local, False)
        return BlockPlan("hidden", source, 0, 0, 0, 0, False)
    half = n_local // 2
    if source < rank:
        return BlockPlan("early-keys", source, 0, n_local, 0, half, False)
    return BlockPlan("late-queries", source, half, n_local, 0, n_local, False)


def ring_plan(layout: str, causal: bool, rank: int, world_size: int, n_local: int) -> list[BlockPlan]:
    """``rank``'s plan for each of the ``world_size`` steps."""
    return [block_plan(layout, causal, rank, source_rank(rank, t, world_size), n_local)
            for t in range(world_size)]
