"""Head dims 257..512 (the configs' 512 bucket): forward and backward against
float64 on the kernels and the PyTorch path, the atomic backward, packed
sequences and variants; bad head dims; the shared-memory refusal (float32 at
512 on a 99 KB part); the first configs compiled for sm_90a and sm_89 (no GPU
needed).  A V head dim of its own at these widths: tests/variants/test_head_dim_v.py."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
import triton

import tileattn
from tileattn import api, configs, launch
from tileattn.launch import attention as launch_attention
from tileattn.testing import (Case, VariantCase, VarlenCase, assert_case, assert_variant_case, assert_varlen_case,
                              forbidden)

from conftest import DEVICE

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
KB = 1024
H200_SMEM, A100_SMEM, RTX4090_SMEM = 227 * KB, 163 * KB, 99 * KB

# odd lengths, GQA, Nq < Nk and Nq > Nk (causal: the first rows see no key),
# 512 and widths that pad to it (257, 300, 480)
CASES = [
    Case(1, 2, 1, 33, 70, 512, False, FP32),
    Case(1, 2, 1, 33, 70, 512, True, FP32),
    Case(1, 4, 2, 70, 33, 512, True, FP16, "bnhd"),
    Case(1, 2, 2, 33, 70, 512, False, BF16),
    Case(1, 4, 1, 33, 70, 300, True, FP16),
    Case(1, 2, 1, 17, 40, 257, False, FP32),
    Case(1, 2, 2, 40, 17, 480, True, BF16, "bnhd"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_backward(case, path):
    assert_case(case)


@pytest.mark.parametrize("case", [Case(1, 4, 2, 33, 70, 512, True, FP32), Case(1, 2, 1, 70, 33, 512, False, FP16)],
                         ids=lambda c: c.id)
def test_atomic_backward(case, path):
    """deterministic=False: the dK/dV kernel adds dQ (a 512-wide float32 tile) with atomics."""
    assert_case(case, deterministic=False)


@pytest.mark.parametrize("case", [VariantCase(1, 2, 1, 70, 70, 512, FP16, causal=True, window=(20, 0), softcap=30.0),
                                  VariantCase(1, 2, 2, 150, 150, 512, FP32, alibi="h", blocks="rand-1H")],
                         ids=lambda c: c.id)
def test_variants(case, path):
    """Window and softcap; ALiBi on a block-sparse layout (tiles that divide its 128 x 128 blocks)."""
    assert_variant_case(case)


def test_varlen(path):
    assert_varlen_case(VarlenCase((5, 0, 33, 17), (9, 4, 20, 31), 4, 2, 512, FP16, causal=True))


def test_sdpa_drop_in(path):
    """The SDPA drop-in accelerates 512 (no fallback warning) and gives torch's result."""
    from tileattn.sdpa import TileattnFallbackWarning
    q, k, v = (torch.randn(1, 2, n, 512, device=DEVICE) for n in (9, 13, 13))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TileattnFallbackWarning)
        got = tileattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------
# bad head dims
# ---------------------------------------------------------------------------
BAD = {
    "q-513": ((513, 513, 64), r"last dimension of q, k\) must be in 1\.\.512"),
    "v-513": ((64, 64, 513), r"last dimension of v\) must be in 1\.\.512"),
    "all-1024": ((1024, 1024, 1024), r"last dimension of q, k\) must be in 1\.\.512"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_head_dim_above_512_raises(name, path, monkeypatch):
    dims, msg = BAD[name]
    monkeypatch.setattr(launch, "attn_fwd", forbidden())
    monkeypatch.setattr(tileattn.cpu, "attention_fwd", forbidden())
    q, k, v = (torch.randn(1, 2, 8, d, device=DEVICE) for d in dims)
    with pytest.raises(ValueError, match=msg):
        tileattn.attention(q, k, v)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]
    with pytest.raises(ValueError, match=msg):
        tileattn.attention_varlen(*packed, cu, cu, 8, 8)


def test_decoding_keeps_its_limit_of_256():
    """attention_with_kvcache stays at 256 and says so, naming the limit, before the cache is written."""
    q = torch.randn(1, 2, 1, 512, device=DEVICE)
    k_cache, v_cache = torch.zeros(1, 2, 16, 512, device=DEVICE), torch.zeros(1, 2, 16, 512, device=DEVICE)
    k_new = torch.randn(1, 2, 1, 512, device=DEVICE)
    seqlens = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"must be in 1\.\.256 in attention_with_kvcache \(MAX_DECODE_HEAD_DIM\)"):
        tileattn.attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new=k_new, v_new=k_new.clone())
    assert not k_cache.any()


def test_sdpa_drop_in_falls_back_above_512():
    from tileattn.sdpa import TileattnFallbackWarning
    q = torch.randn(1, 1, 4, 513, device=DEVICE)
    with pytest.warns(TileattnFallbackWarning, match=r"head dim 513 is not accelerated \(1\.\.512 is\)"):
        tileattn.scaled_dot_product_attention(q, q, q)


# ---------------------------------------------------------------------------
# shared memory: float32 at 512 where it fits, a ValueError where it does not
# ---------------------------------------------------------------------------
def _on_gpu_with(smem):
    """The kernels' shared-memory check as on a GPU with ``smem`` bytes per block."""
    return mock.patch.object(launch_attention, "_device_smem", return_value=smem)


def test_float32_at_512_refused_on_99kb_before_any_launch(kernels, monkeypatch):
    monkeypatch.setattr(launch, "attn_fwd", forbidden())
    q, k, v = (torch.randn(1, 2, 40, 512, device=DEVICE, requires_grad=True) for _ in range(3))
    with _on_gpu_with(RTX4090_SMEM):
        with pytest.raises(ValueError, match=r"head_dim=512 in torch\.float32 does not fit this GPU's shared "
                                             r"memory: the backward's dK/dV kernel's smallest tile"):
            tileattn.attention(q, k, v)
        with pytest.raises(ValueError, match=r"atomic backward's dK/dV kernel \(deterministic=False\)"):
            tileattn.attention(q, k, v, deterministic=False)
        with pytest.raises(ValueError, match="v's head_dim=512"):
            tileattn.attention(q[..., :320], k[..., :320], v)


def test_float32_at_512_forward_only_runs_on_99kb(kernels):
    """No gradient asked for: the forward's smallest tile (M16-N16, 100,352 B) fits 99 KB."""
    q, k, v = (torch.randn(1, 2, 40, 512, device=DEVICE) for _ in range(3))
    with _on_gpu_with(RTX4090_SMEM):
        out = tileattn.attention(q, k, v, causal=True)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("smem,dtype,ok", [(RTX4090_SMEM, BF16, True), (RTX4090_SMEM, FP16, True),
                                           (RTX4090_SMEM, FP32, False), (A100_SMEM, FP32, True),
                                           (H200_SMEM, FP32, True), (64 * KB, BF16, False)],
                         ids=["4090-bf16", "4090-fp16", "4090-fp32", "a100-fp32", "h200-fp32", "64kb-bf16"])
def test_shared_memory_check_before_the_forward(kernels, smem, dtype, ok):
    """``api.check_shared_memory``, as ``attention`` runs it before the forward of a call that needs a gradient."""
    q = torch.randn(1, 2, 8, 512, device=DEVICE).to(dtype).requires_grad_()
    with _on_gpu_with(smem):
        for det in (True, False):
            if ok:
                api.check_shared_memory(q, q, q, None, det)
            else:
                with pytest.raises(ValueError, match="does not fit this GPU's shared memory"):
                    api.check_shared_memory(q, q, q, None, det)


def test_no_refusal_at_or_below_256():
    """At d <= 256 the smallest tile is launched and the compiler decides (the estimate overshoots float32 there)."""
    for d in (64, 128, 256):
        configs.check_fits(("fwd", "dkdv", "dq", "dkdv_atomic"), d, 4, 64 * KB)
    with pytest.raises(ValueError, match="head_dim=257"):
        configs.check_fits(("dkdv",), 257, 4, RTX4090_SMEM)


@pytest.mark.parametrize("kind", ["fwd", "dkdv", "dq", "dkdv_atomic"])
@pytest.mark.parametrize("smem,name", [(H200_SMEM, "227KB"), (A100_SMEM, "163KB"), (RTX4090_SMEM, "99KB")])
def test_first_fitting_config_at_512(kind, smem, name):
    """16-bit: every kernel has a 512 config under the limit; float32: all but the backward's on 99 KB."""
    est = configs.SMEM_ESTIMATORS[kind]
    for elem in (2, 4):
        first = configs.fitting(configs.candidates(kind, 512), 512, elem, smem, kind=kind)[0]
        fits = est(first.block_m, first.block_n, 512, elem, first.num_stages) <= smem
        assert fits == (elem == 2 or kind == "fwd" or smem > RTX4090_SMEM), (kind, name, elem, first.name)
    # the table's first config fits 227 KB with 16-bit inputs (what autotuning off takes on Hopper)
    c = configs.candidates(kind, 512)[0]
    assert est(c.block_m, c.block_n, 512, 2, c.num_stages) <= H200_SMEM


def test_every_512_config_names_its_provenance():
    """Each 512 config says how it was chosen: sized for shared memory, not
    swept on a GPU (only the first ones were timed, perf-notes v14)."""
    for kind, table in configs.TABLES.items():
        for c in table[512]:
            assert "sized for shared memory" in c.source and "not swept" in c.source, (kind, c.name)


# ---------------------------------------------------------------------------
# compiled without a GPU: the first configs' shared memory and TMA boxes
# ---------------------------------------------------------------------------
_COMPILE_SCRIPT = """
import json, sys
sys.path.insert(0, {bench!r})
from compile_report import compile_one
from tileattn import configs
from tileattn.kernels.bwd import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel
from tileattn.kernels.fwd import _attn_fwd_kernel
kernels = {{"fwd": _attn_fwd_kernel, "dkdv": _attn_bwd_dkdv_kernel, "dq": _attn_bwd_dq_kernel,
           "dkdv_atomic": _attn_bwd_dkdv_kernel}}
out = []
for kind, arch, limit, tma in {builds!r}:
    cfg = configs.fitting(configs.candidates(kind, 512), 512, 2, limit, kind=kind)[0]
    regs, smem, spills, wgmma, ck = compile_one(kernels[kind], cfg, 512, "bf16", False, arch, use_tma=tma,
                                                atomic_dq=kind == "dkdv_atomic")
    boxes = [m["block_size"] for m in (ck.metadata.tensordesc_meta or [])]
    out.append([kind, arch, cfg.block_m, cfg.block_n, cfg.num_stages, smem, boxes])
print(json.dumps(out))
"""
# (kind, arch, shared memory per block, tensor descriptors)
_BUILDS = [("fwd", 90, H200_SMEM, True), ("dkdv", 90, H200_SMEM, True), ("dq", 90, H200_SMEM, True),
           ("dkdv_atomic", 90, H200_SMEM, True), ("fwd", 89, RTX4090_SMEM, False),
           ("dkdv", 89, RTX4090_SMEM, False), ("dq", 89, RTX4090_SMEM, False)]


@pytest.mark.skipif(not triton.__version__.startswith("3.6"),
                    reason="the estimates describe triton 3.6's pipeliner; re-measure them on another version")
def test_first_configs_compile_within_shared_memory():
    """bf16, d = 512, the first config that fits 227 KB (sm_90a, descriptors) and 99 KB (sm_89, pointers):
    the compiler's shared memory is at most the estimate, which is at most the limit, and every
    descriptor box is at most 256 wide (the copy engine's bound)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    res = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT.format(bench=bench, builds=_BUILDS)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(rows) == len(_BUILDS)
    for (kind, arch, limit, tma), (_, _, bm, bn, stages, shared, boxes) in zip(_BUILDS, rows):
        est = configs.SMEM_ESTIMATORS[kind](bm, bn, 512, 2, stages)
        assert shared <= est <= limit, (kind, arch, shared, est)
        assert bool(boxes) == tma and all(max(b) <= 256 for b in boxes), (kind, boxes)
