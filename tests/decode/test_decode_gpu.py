"""Decoding on a GPU: realistic shapes in bf16, every config of the decoding
table, the config choice (first fitting config or autotuning; the rule
itself is checked on the CPU too), launch plans bitwise equal to regular
launches, a decoding step captured in a CUDA graph; and the GPU benchmark
script, checked end to end on the CPU (PyTorch path).
"""
from __future__ import annotations

import pytest
import torch

import tileattn
from tileattn import configs
from tileattn.launch import decode as launch_decode, runtime, tuning
from tileattn.testing_decode import Case, assert_case

from conftest import HAS_CUDA

pytestmark = pytest.mark.usefixtures("decode_bf16_upcast")   # tests/conftest.py

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


# ---------------------------------------------------------------------------
# GPU only: realistic shapes in bf16, every config of the table
# ---------------------------------------------------------------------------
gpu = pytest.mark.skipif(not HAS_CUDA, reason="GPU-only case: needs a CUDA device")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page", [0, 16, 256], ids=lambda p: f"page{p}" if p else "contig")
def test_gpu_decode_shapes(page):
    c = Case(32, 8, 1, 128, BF16, (4096, 1, 3000, 0, 2047, 5000), n_new=1, page=page, splits=0)
    assert_case(c)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", configs.DECODE_CONFIGS, ids=lambda c: c.name)
def test_gpu_every_config(cfg, monkeypatch):
    monkeypatch.setattr(configs, "DECODE_CONFIGS", (cfg,))
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")
    cases = []
    if cfg.serves(paged=True):
        cases += [Case(32, 8, 2, 128, BF16, (1500, 700), n_new=2, page=256, splits=3, window=(900, -1)),
                  Case(32, 8, 1, 128, BF16, (1500, 701), n_new=1, page=16, splits=1, softcap=5.0)]
    if cfg.serves(paged=False):
        cases += [Case(16, 4, 1, 64, F16, (1000, 33), n_new=1, splits=2, softcap=5.0, alibi="heads")]
    assert cases
    for c in cases:
        assert_case(c)


def test_decode_autotune_rule(monkeypatch):
    """Decoding takes the table's first fitting config for the shapes its
    order was measured on (16-bit caches, <= 16 packed query rows) and
    autotunes the others; TILEATTN_DECODE_AUTOTUNE=1/0 forces either way,
    TILEATTN_AUTOTUNE=0 turns all timing off."""
    on = launch_decode.decode_autotune_enabled
    monkeypatch.delenv("TILEATTN_DECODE_AUTOTUNE", raising=False)
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "1")
    assert not on(16, 2)
    assert on(32, 2) and on(64, 2) and on(16, 4)
    monkeypatch.setenv("TILEATTN_DECODE_AUTOTUNE", "1")
    assert on(16, 2) and on(64, 4)
    monkeypatch.setenv("TILEATTN_DECODE_AUTOTUNE", "0")
    assert not on(16, 2) and not on(64, 4)
    monkeypatch.setenv("TILEATTN_DECODE_AUTOTUNE", "1")
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")
    assert not on(16, 2) and not on(64, 4)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("env", ["", "1"], ids=["default", "autotune-forced"])
def test_gpu_decode_config_choice(env, monkeypatch):
    """A 16-bit decoding step with <= 16 packed rows launches the first
    fitting config and times nothing, unless TILEATTN_DECODE_AUTOTUNE=1; a
    float32 step autotunes by default.  All exact."""
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "1")
    monkeypatch.setenv("TILEATTN_DECODE_AUTOTUNE", env)
    # no launch plans: a plan another test recorded for these shapes would
    # replay its launches without choosing a config
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    monkeypatch.setattr(tuning, "_CHOICES", {})
    firsts = []
    real = launch_decode._first_fitting
    monkeypatch.setattr(launch_decode, "_first_fitting", lambda *a: firsts.append(real(*a)) or firsts[-1])
    for c in (Case(32, 8, 1, 128, BF16, (1500, 700), n_new=1, page=16),
              Case(32, 8, 1, 128, BF16, (900, 1200), n_new=1)):
        assert_case(c)
    if env == "1":
        assert not firsts and len(tuning._CHOICES) == 2
    else:
        assert [f.name for f in firsts] == ["N128-w4-s5", "N128-w4-s3"] and not tuning._CHOICES
        assert_case(Case(8, 2, 1, 64, F32, (300, 41), n_new=1))
        assert len(firsts) == 2 and len(tuning._CHOICES) == 1


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page,splits,alibi,append", [(0, 0, False, False), (0, 3, True, False),
                                                      (16, 0, False, False), (256, 2, False, False),
                                                      (0, 0, False, True), (16, 2, False, True)],
                         ids=["contig-auto", "contig-3splits-alibi", "page16-auto", "page256-2splits",
                              "contig-auto-append", "page16-2splits-append"])
def test_gpu_decode_plans_match_regular_launches(page, splits, alibi, append, monkeypatch):
    """From the second call of a shape on, a decoding step replays a launch
    plan (runtime.PLANS, keyed by the validated call): bitwise the result of
    regular launches, with fresh cache contents and lengths each step; with
    ``append`` the plan holds the append too, and the caches after each step
    are bitwise those of regular launches."""
    if not runtime._DIRECT_SUPPORTED:
        pytest.skip("direct launches are off on this Triton version (runtime.DIRECT_LAUNCH_VERSIONS)")
    monkeypatch.setattr(runtime, "POISON_OUTPUTS", True)
    b, hq, hkv, d, cap = 4, 8, 2, 128, 1024
    gen = torch.Generator().manual_seed(5)

    def step_inputs(i):
        q = torch.randn(b, hq, 1, d, generator=gen).to("cuda", BF16)
        k = torch.randn(b, hkv, cap, d, generator=gen).to("cuda", BF16)
        v = torch.randn(b, hkv, cap, d, generator=gen).to("cuda", BF16)
        seqlens = torch.randint(1, cap - 2, (b,), generator=gen, dtype=torch.int32).to("cuda")
        kw = {"num_splits": splits}
        if append:
            kw["k_new"] = torch.randn(b, hkv, 2, d, generator=gen).to("cuda", BF16)
            kw["v_new"] = torch.randn(b, hkv, 2, d, generator=gen).to("cuda", BF16)
        if alibi:
            kw["alibi_slopes"] = torch.rand(hq, generator=gen).to("cuda")
        if page:
            perm = torch.randperm(b * cap // page, generator=gen).to("cuda")
            per = cap // page
            k = k.view(b, hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(b * per, hkv, page, d)[perm.argsort()]
            v = v.view(b, hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(b * per, hkv, page, d)[perm.argsort()]
            kw["block_table"] = perm.view(b, per).to(torch.int32)
        return (q, k, v, seqlens), kw

    steps = [step_inputs(i) for i in range(4)]
    fresh = [(a[0], a[1].clone(), a[2].clone(), a[3]) for a, _ in steps]   # caches before any append
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    want = [tileattn.attention_with_kvcache(*a, **kw, return_lse=True) for a, kw in steps]
    want_caches = [(a[1].clone(), a[2].clone()) for a, _ in steps]
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "1")
    runtime.PLANS.clear()
    replayed = []
    for i, (a, kw) in enumerate(steps):
        a = fresh[i]
        planned = len(runtime.PLANS)
        out, lse = tileattn.attention_with_kvcache(*a, **kw, return_lse=True)
        replayed.append(planned > 0 and len(runtime.PLANS) == planned)
        assert torch.equal(out, want[i][0]) and torch.equal(lse, want[i][1]), f"step {i}"
        assert torch.equal(a[1], want_caches[i][0]) and torch.equal(a[2], want_caches[i][1]), f"step {i} cache"
    assert any(key[0] == "decode-call" for key in runtime.PLANS), "no plan was recorded"
    assert all(replayed[1:]), f"steps after the first recorded again: {replayed}"


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page", [0, 16, 256], ids=lambda p: f"page{p}" if p else "contig")
def test_gpu_decode_step_in_cuda_graph(page):
    """With check_indices=False a decoding step (append, then attention)
    waits for nothing on the host, so it can be captured in a CUDA graph:
    replays on new inputs written into the captured buffers give bitwise what
    eager steps give, output and cache contents."""
    b, hq, hkv, d, cap = 4, 8, 2, 128, 1024
    gen = torch.Generator().manual_seed(13)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to("cuda", BF16)

    q, k_new, v_new = rnd(b, hq, 1, d), rnd(b, hkv, 1, d), rnd(b, hkv, 1, d)
    k_cache, v_cache = rnd(b, hkv, cap, d), rnd(b, hkv, cap, d)
    seqlens = torch.randint(1, cap - 8, (b,), generator=gen, dtype=torch.int32).to("cuda")
    kw = dict(k_new=k_new, v_new=v_new, check_indices=False)
    if page:
        per = cap // page
        perm = torch.randperm(b * per, generator=gen).to("cuda")
        k_cache = k_cache.view(b, hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(b * per, hkv, page, d)[perm.argsort()]
        v_cache = v_cache.view(b, hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(b * per, hkv, page, d)[perm.argsort()]
        kw["block_table"] = perm.view(b, per).to(torch.int32)

    # warm up on a side stream (autotuning, compiles, launch plans), as
    # torch.cuda.graphs asks; the repeated append writes the same slots
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            tileattn.attention_with_kvcache(q, k_cache, v_cache, seqlens, **kw)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tileattn.attention_with_kvcache(q, k_cache, v_cache, seqlens, **kw)

    for step in range(3):
        q.copy_(rnd(b, hq, 1, d))
        k_new.copy_(rnd(b, hkv, 1, d))
        v_new.copy_(rnd(b, hkv, 1, d))
        seqlens.add_(1)
        k_want, v_want = k_cache.clone(), v_cache.clone()
        want = tileattn.attention_with_kvcache(q, k_want, v_want, seqlens.clone(),
                                               **{**kw, "block_table": kw.get("block_table")})
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"step {step}: replayed output differs from the eager step"
        assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want), f"step {step}: cache differs"


# ---------------------------------------------------------------------------
# the GPU benchmark script, checked end to end on the CPU (PyTorch path)
# ---------------------------------------------------------------------------
def test_decode_bench_script_on_cpu(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_bench.py"
    spec = importlib.util.spec_from_file_location("decode_bench", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--out", str(tmp_path), "--device", "cpu", "--dtype", "fp16", "--batch", "2", "--heads", "4",
                     "--kv-heads", "2", "--head-dim", "16", "--cache-lens", "64", "96", "--page-sizes", "16", "32",
                     "--splits", "1", "3", "--sdpa", "flash", "--config-sweep-len", "0", "--copy-gib", "0.001"])
    assert rc == 0
    data = json.loads((tmp_path / "decode_bench.json").read_text())
    rows = data["rows"]
    assert {(r["layout"], r["provider"]) for r in rows if r["cache_len"] == 64} >= {
        ("contig", "tileattn"), ("contig", "tileattn-checked"), ("contig", "tileattn-sinks"),
        ("contig", "tileattn-splits"),
        ("page16", "tileattn"), ("page32", "tileattn")}
    assert [r["check"] for r in rows if r["provider"] == "tileattn" and r["cache_len"] == 64] == ["passed"] * 3
    assert all(r["status"] == "ok" for r in rows if r["provider"].startswith("tileattn"))
    assert (tmp_path / "decode_bench.csv").read_text().count("\n") == len(rows) + 1
    assert {s["layout"] for s in data["summary"]} == {"contig", "page16", "page32"}
