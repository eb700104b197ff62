"""Reading the environment switches (``TILEATTN_*``, ``TRITON_INTERPRET``).

The switches are read on every launch.  ``os.environ.get`` encodes the name,
and a missing name goes through a raised KeyError: ~1.5 us a read, several
reads a decoding step.  On POSIX, os.environ keeps its contents in ``_data``
(bytes names to bytes values; setenv, monkeypatched variables and
os.environ[...] = ... all go through it), so a read there sees the same
values in a fraction of the time.  Elsewhere (or should that mapping change
shape) the plain lookup runs.
"""
from __future__ import annotations

import os

__all__ = ["env", "interpreter_active"]

_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_FAST = (isinstance(_ENV_DATA, dict) and os.name == "posix"
             and type(next(iter(_ENV_DATA), b"")) is bytes)

_ENV_NAMES: dict = {}


def env(name: str, default: str) -> str:
    """``os.environ.get(name, default)``, faster on POSIX."""
    if _ENV_FAST:
        key = _ENV_NAMES.get(name)
        if key is None:
            key = _ENV_NAMES[name] = os.fsencode(name)
        value = _ENV_DATA.get(key)
        return default if value is None else os.fsdecode(value)
    return os.environ.get(name, default)


def interpreter_active() -> bool:
    """Whether Triton kernels run under the interpreter (``TRITON_INTERPRET``)."""
    return env("TRITON_INTERPRET", "0") not in ("", "0")
