"""tileattn: exact, IO-aware attention for PyTorch.

``attention`` computes softmax(scale * q k^T) v tile by tile, never writing the
N x N score matrix to memory (Triton kernels on GPUs; elsewhere
``tileattn.cpu``: torch's fused CPU kernel for the calls it means the same
way, a tiled PyTorch path for the rest).  ``tileattn.reference`` holds the textbook
(materialized) version; ``tileattn.cpu.tiled_attention`` is the readable tiled
one; ``tileattn.cost`` models the FLOPs and bytes of both.
"""
from . import cpu, reference
from .api import attention, attention_varlen
from .decode import attention_with_kvcache
from .block_mask import BLOCK_K, BLOCK_Q, block_mask_from_fn
from .dispatch import use_backend
from .sdpa import patched_sdpa, scaled_dot_product_attention
from .integrations import register_transformers  # imports transformers only when called

__version__ = "0.1.0"

__all__ = ["attention", "attention_with_kvcache", "attention_varlen", "block_mask_from_fn", "BLOCK_Q", "BLOCK_K",
           "cpu", "reference", "use_backend", "scaled_dot_product_attention", "patched_sdpa", "register_transformers",
           "__version__"]
