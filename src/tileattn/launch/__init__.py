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
* ``hopper``: the Hopper training kernels' launchers and sm_90a compile reports;
* ``stream_k``: the persistent forward's cut last wave (its walk, workspace
  and combine);
* ``hopper_calls``: the Hopper forward and backward as ``attention`` runs
  them (the backward's steps around the dK/dV kernel, launch plans);
* ``bwd_steps``: the backward's steps both paths share (the float32 dQ sum,
  the preprocess, the dQ convert); ``bwd_memory``: the Hopper backward's
  memory chunks.

``ops.py`` calls ``launch.attn_fwd`` / ``launch.attn_bwd`` through this
package's attributes (tests wrap them there).
"""
from . import attention, bwd_memory, bwd_steps, decode, decode_hopper, hopper, hopper_calls, runtime, stream_k, tuning
from .attention import attn_bwd, attn_fwd

__all__ = ["attn_fwd", "attn_bwd", "attention", "bwd_memory", "bwd_steps", "decode", "decode_hopper", "hopper",
           "hopper_calls", "runtime", "tuning"]
