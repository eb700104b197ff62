"""Kernel launchers: allocation, grid, config choice, launch.

* ``runtime``: switches (``POISON_OUTPUTS``, ``FORCE_POINTER_PATH``), tensor
  descriptors, allocation, device queries, direct launches, launch plans;
* ``tuning``: which config a launch runs (forced, interpreter, first fit,
  autotune once; one choice cache for every kernel);
* ``attention``: the training kernels' launchers, :func:`attn_fwd` /
  :func:`attn_bwd`;
* ``decode``: the KV-cache decoding kernels' launchers and split rules;
* ``decode_hopper``: the Hopper decoding kernel for the absorbed MLA cache
  (its rules, launcher and sm_90a compile report);
* ``hopper``: the Hopper training kernels' launchers and sm_90a compile reports.

``ops.py`` calls ``launch.attn_fwd`` / ``launch.attn_bwd`` through this
package's attributes (tests wrap them there).
"""
from . import attention, decode, decode_hopper, hopper, runtime, tuning
from .attention import attn_bwd, attn_fwd

__all__ = ["attn_fwd", "attn_bwd", "attention", "decode", "decode_hopper", "hopper", "runtime", "tuning"]
