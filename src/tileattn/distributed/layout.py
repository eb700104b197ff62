"""Sequence layouts: which tokens of the full sequence each rank holds.

``contiguous``
    the sequence is cut into ``W`` equal chunks; rank ``r`` holds chunk ``r``.
``zigzag``
    the sequence is cut into ``2W`` equal chunks; rank ``r`` holds chunk ``r``
    followed by chunk ``2W - 1 - r``.  Under a causal mask every rank then has
    the same number of visible (query, key) pairs (docs/distributed.md).

``shard_sequence`` and ``unshard_sequence`` convert between a full sequence and
the per-rank shards; ``shard_sequence(torch.arange(N), r, W, layout, dim=0)``
gives the global positions of rank ``r``'s tokens (e.g. for rotary embeddings).
"""
from __future__ import annotations

import operator
from typing import Sequence

import torch

__all__ = ["LAYOUTS", "check_layout", "shard_sequence", "unshard_sequence", "chunks_per_rank"]

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout) -> str:
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a string, one of {LAYOUTS}, got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def chunks_per_rank(layout: str) -> int:
    """Equal chunks a rank's shard is made of (the local length must divide by it)."""
    return 2 if check_layout(layout) == "zigzag" else 1


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_dim(dim, ndim: int, what: str) -> int:
    dim = _check_int("dim", dim, -ndim if ndim else 0)
    if not -ndim <= dim < ndim:
        raise ValueError(f"dim={dim} is out of range for {what} with {ndim} dimensions")
    return dim % ndim


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, layout: str = "zigzag", dim: int = 2):
    """Rank ``rank``'s shard of the full sequence ``x`` (sequence along ``dim``).

    ``x.shape[dim]`` must be a multiple of ``world_size`` (``contiguous``) or
    of ``2 * world_size`` (``zigzag``).  A contiguous shard is a view of ``x``;
    a zigzag shard is a new tensor (two chunks concatenated).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    layout = check_layout(layout)
    world_size = _check_int("world_size", world_size, 1)
    rank = _check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1} for world_size={world_size}, got {rank}")
    dim = _check_dim(dim, x.dim(), "x")
    n_chunks = world_size * chunks_per_rank(layout)
    n = x.shape[dim]
    if n % n_chunks:
        raise ValueError(f"x: sequence length {n} (dim {dim}) must be a multiple of {n_chunks} for "
                         f"layout={layout!r} with world_size={world_size}")
    c = n // n_chunks
    if layout == "contiguous":
        return x.narrow(dim, rank * c, c)
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (n_chunks - 1 - rank) * c, c)], dim=dim)


def unshard_sequence(parts: Sequence[torch.Tensor], layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """The full sequence from the shards of all ranks, ``parts[r]`` being rank
    ``r``'s (the inverse of :func:`shard_sequence`)."""
    if isinstance(parts, torch.Tensor) or not isinstance(parts, Sequence):
        raise TypeError(f"parts must be a list or tuple of tensors (one per rank), got {type(parts).__name__}")
    if not parts:
        raise ValueError("parts must hold one tensor per rank, got none")
    for i, p in enumerate(parts):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"parts[{i}] must be a torch.Tensor, got {type(p).__name__}")
    layout = check_layout(layout)
    shape = parts[0].shape
    for i, p in enumerate(parts):
        if p.shape != shape:
            raise ValueError(f"parts must all have one shape: parts[0] is {tuple(shape)}, "
                             f"parts[{i}] is {tuple(p.shape)}")
    dim = _check_dim(dim, len(shape), "parts[0]")
    if layout == "contiguous":
        return torch.cat(list(parts), dim=dim)
    n_local = shape[dim]
    if n_local % 2:
        raise ValueError(f"parts: zigzag shards hold two equal chunks, so their length along dim {dim} "
                         f"must be even, got {n_local}")
    c = n_local // 2
    w = len(parts)
    chunks = [None] * (2 * w)
    for r, p in enumerate(parts):
        chunks[r] = p.narrow(dim, 0, c)
        chunks[2 * w - 1 - r] = p.narrow(dim, c, c)
    return torch.cat(chunks, dim=dim)
