"""Which config a launch runs, for every configurable kernel.

In order: a config the caller forces; under the interpreter, the kernel's
single interpreter config (no GPU timer to tune with); the first config of
the table that fits, where the launcher says so (``TILEATTN_AUTOTUNE=0``,
the atomic backward, decoding in the class its table was measured for);
otherwise Triton's autotuner, once per (kind, device, dtype, autotune key):
its choice is kept in one cache (``_CHOICES``) shared by every kernel, and
later calls launch it directly, past the autotuner's per-call bookkeeping.
"""
from __future__ import annotations

from typing import Callable

from .._env import interpreter_active
from . import runtime

# (kind, device, dtype, autotune key values) -> (meta-parameters, launch options)
# of the config the autotuner chose
_CHOICES: dict = {}
# kind -> the autotuned kernel (built on first use, GPU only)
_AUTOTUNERS: dict = {}


def autotuner(kind: str, build: Callable):
    """The autotuned kernel of ``kind``, built by ``build()`` on first use."""
    tuned = _AUTOTUNERS.get(kind)
    if tuned is None:
        tuned = _AUTOTUNERS[kind] = build()
    return tuned


def launch_options(config) -> dict:
    return {"num_warps": config.num_warps, "num_stages": config.num_stages}


def launch(kind: str, kernel, grid, args: dict, *, config, interpreter_config, first_fit: Callable,
           build_autotuner: Callable, key: tuple, set_boxes: Callable, check: Callable | None = None) -> None:
    """Run ``kernel`` over ``grid`` (a tuple, or a function of the
    meta-parameters) with ``args`` and the chosen config's meta-parameters.

    ``config``: forced (or None); ``first_fit()``: the table's first fitting
    config when this launch does not autotune, else None; ``key``: the
    autotune key values (with device and dtype) under which a choice is
    kept; ``set_boxes(full_args)`` gives descriptors the chosen tile's box;
    ``check(config)`` may reject a config (ValueError)."""
    if config is None and interpreter_active():
        config = interpreter_config
    if config is None:
        config = first_fit()
    if config is not None:
        if check is not None:
            check(config)
        meta, options = config.as_meta(), launch_options(config)
    else:
        chosen = _CHOICES.get((kind, *key))
        if chosen is None:
            runtime.record(None)
            tuned = autotuner(kind, build_autotuner)
            tuned[grid](**args)
            best = tuned.best_config
            _CHOICES[(kind, *key)] = (best.kwargs, {k: v for k, v in best.all_kwargs().items()
                                                    if k not in best.kwargs})
            return
        meta, options = chosen
    full = {**args, **meta}
    set_boxes(full)
    runtime.run(kernel, grid(meta) if callable(grid) else grid, options, full)
