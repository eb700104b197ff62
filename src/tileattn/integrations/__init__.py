"""Integrations with other libraries.  Each submodule imports its library only
when its functions are called, so ``import tileattn`` never imports them.

* ``tileattn.integrations.transformers``: :func:`register_transformers` adds
  ``attn_implementation="tileattn"`` to Hugging Face transformers.
"""
from __future__ import annotations

__all__ = ["register_transformers"]


def register_transformers(name: str = "tileattn") -> str:
    """Register tileattn as a transformers attention implementation; see
    :func:`tileattn.integrations.transformers.register_transformers`."""
    from .transformers import register_transformers as _register
    return _register(name)
