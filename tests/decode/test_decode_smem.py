"""The decoding launcher's shared-memory estimate (``launch_decode.decode_smem_bytes``)
against the compiler: the partial kernel compiled ahead of time for sm_90 (no
GPU needed), contiguous and paged caches, descriptor and pointer loads, a V
head dim of its own and a shared cache (the absorbed MLA layout).  The
estimate decides which configs the launcher keeps, so it must never be below
the compiler's figure, and should not be far above it.

The compile runs in a subprocess without ``TRITON_INTERPRET`` (under the
interpreter ``@triton.jit`` gives functions that cannot be compiled)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from tileattn.launch import decode as launch_decode

ROOT = Path(__file__).resolve().parents[2]

# (block_n, num_warps, num_stages, page_size, descriptors, extra arguments of compile_decode)
MLA = dict(head_dim=576, head_dim_v=512, shared_kv=True, row_strides_16=True)
BUILDS = [
    (128, 4, 3, 0, True, {}),      # contiguous, first config
    (128, 4, 5, 256, True, {}),    # paged, descriptors, 2 tiles buffered
    (64, 4, 7, 256, True, {}),     # paged, descriptors, 3 tiles buffered
    (128, 4, 5, 16, False, {}),    # paged, pointers (16-token pages)
    (128, 4, 3, 0, True, dict(head_dim_v=64)),                # V narrower than K
    (32, 8, 2, 0, True, dict(MLA, block_m=64)),               # absorbed MLA, 64 rows (warpgroup MMAs)
    (32, 8, 5, 256, True, dict(MLA, block_m=16)),             # absorbed MLA, 16 rows, pages by descriptor
]

_SCRIPT = """
import json, sys
sys.path.insert(0, {bench!r})
from compile_report import compile_decode
out = []
for bn, w, s, page, desc, extra in {builds!r}:
    ck = compile_decode(bn, w, s, **{{"head_dim": 128, **extra}}, page_size=page, descriptors=desc)
    out.append(ck.metadata.shared)
print(json.dumps(out))
"""


@pytest.mark.skipif(not triton.__version__.startswith("3.6"),
                    reason="the estimate describes triton 3.6's pipeliner; re-measure it on another version")
def test_decode_smem_estimate_matches_compiler():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = _SCRIPT.format(bench=str(ROOT / "benchmarks"), builds=BUILDS)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    shared = json.loads(res.stdout.strip().splitlines()[-1])
    for (bn, w, s, page, desc, extra), actual in zip(BUILDS, shared):
        est = launch_decode.decode_smem_bytes(extra.get("block_m", 16), bn, extra.get("head_dim", 128), 2, s,
                                              paged=page > 0, descriptors=desc, head_dim_v=extra.get("head_dim_v"),
                                              shared_kv=extra.get("shared_kv", False))
        assert actual <= est <= actual + 2048, (bn, w, s, page, desc, extra, actual, est)
