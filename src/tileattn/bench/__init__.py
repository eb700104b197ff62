"""``tileattn bench``: tileattn beside PyTorch's attention implementations.

One process runs every provider side by side on the same inputs:
tileattn, ``torch.nn.functional.scaled_dot_product_attention`` with each
backend forced (flash, cuDNN, memory-efficient), FlexAttention (compiled),
FlashAttention-4 (``flash_attn.cute``, when installed) and standard
(materialized) attention, each point's providers timed in interleaved rounds.
The default sweep is the FlashAttention-2 protocol (bf16, 16k tokens in
total, hidden 2048, d in {64, 128}, N in {512, ..., 16k}, causal and not,
forward / backward / forward+backward).

Modules: :mod:`~tileattn.bench.providers` (the registry),
:mod:`~tileattn.bench.runner` (the sweep: timing, memory, correctness),
:mod:`~tileattn.bench.results` (row schema, CSV / JSON lines, metadata),
:mod:`~tileattn.bench.plots` (figures from a results file) and
:mod:`~tileattn.bench.cli` (the subcommand).
"""
from .providers import PROVIDERS, Provider, available_reason, get_provider, register, unregister
from .results import Row, collect_metadata, load_rows
from .runner import BenchConfig, run_sweep

__all__ = ["PROVIDERS", "Provider", "available_reason", "get_provider", "register", "unregister",
           "Row", "collect_metadata", "load_rows", "BenchConfig", "run_sweep"]
