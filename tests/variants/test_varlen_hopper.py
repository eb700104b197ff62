"""Packed sequences on the Hopper kernels (``kernels/fwd_hopper.py`` and
``kernels/bwd_hopper.py`` with ``IS_VARLEN``): forced Hopper configs through
the launchers against a float64 reference per sequence (poisoned outputs;
lengths around the kernels' tiles, empty sequences, Nq != Nk, rows that see
no key, GQA, a sliding window, bf16 and fp16, d = 64 and 128), the default
dispatch of ``attention_varlen`` and its switch, and the launchers'
refusals (CPU)."""
import dataclasses

import pytest
import torch

import tileattn
from tileattn import dispatch, launch
from tileattn.configs import HopperBwdConfig, HopperFwdConfig
from tileattn.launch import hopper as launch_hopper, runtime
from tileattn.reference import standard_attention
from tileattn.testing import case_number, check_accuracy, counting_calls, cu_seqlens

from conftest import HAS_CUDA

ON_HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not ON_HOPPER, reason="GPU-only case: needs a compute capability 9.0 GPU")

# name: (query lengths, key lengths or None (the same), hq, hkv, d, causal, window)
CASES = {
    "mixed-causal-d128": ((300, 1, 0, 257, 1024, 129), None, 4, 4, 128, True, None),
    "mixed-full-d64": ((255, 256, 511, 3, 700), None, 4, 4, 64, False, None),
    "nq<nk-causal-gqa": ((100, 40, 600), (900, 41, 1300), 8, 2, 128, True, None),
    "nq>nk-causal-rows-see-nothing": ((700, 130), (129, 5), 2, 2, 64, True, None),   # early rows: out 0, lse -inf
    "empty-keys": ((64, 300, 20), (0, 300, 0), 2, 1, 128, False, None),
    "window-causal-d64": ((1500, 77, 900), None, 4, 2, 64, True, (128, -1)),
    "window-both-sides-d128": ((333, 1000), (1000, 333), 2, 2, 128, False, (100, 37)),
    "one-long-one-short": ((4100, 7), None, 2, 2, 128, True, None),
}


def _packed(lens, h, d, dtype, g):
    return torch.randn(sum(lens), h, d, device="cuda", dtype=dtype, generator=g)


def _references(q, k, v, lens_q, lens_k, causal, window):
    """(out, lse) of float64 and of low-precision standard attention, one
    sequence at a time, packed as the kernel's: out (total, H, D), lse (H, total)."""
    parts = []
    cq, ck = cu_seqlens(lens_q).tolist(), cu_seqlens(lens_k).tolist()
    for i in range(len(lens_q)):
        qi, ki, vi = (t[a:b].transpose(0, 1)[None] for t, a, b in ((q, cq[i], cq[i + 1]), (k, ck[i], ck[i + 1]),
                                                                     (v, ck[i], ck[i + 1])))
        if ki.shape[2] == 0:   # no key: out 0, lse -inf
            zero = torch.zeros_like(qi, dtype=torch.float64)
            lse = torch.full(qi.shape[:3], float("-inf"), device=qi.device, dtype=torch.float64)
            parts.append((zero, lse, zero.to(qi.dtype), lse.float()))
            continue
        hq, hkv = qi.shape[1], ki.shape[1]
        ki, vi = (t.repeat_interleave(hq // hkv, 1) for t in (ki, vi))
        ref = standard_attention(qi.double(), ki.double(), vi.double(), causal=causal, window=window,
                                 return_lse=True)
        parts.append(ref + standard_attention(qi, ki, vi, causal=causal, window=window, return_lse=True))
    outs = [torch.cat([p[j][0].transpose(0, 1) for p in parts]) for j in (0, 2)]
    lses = [torch.cat([p[j][0] for p in parts], dim=-1) for j in (1, 3)]
    return outs[0], lses[0], outs[1], lses[1]


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", list(CASES))
def test_varlen_against_float64(case, dtype):
    """The forced table config on packed sequences (poisoned outputs): out
    and lse against float64 per sequence, under the accuracy rule, and the
    launch took the kernel's packed build."""
    lens_q, lens_k, hq, hkv, d, causal, window = CASES[case]
    lens_k = lens_q if lens_k is None else lens_k
    g = torch.Generator(device="cuda").manual_seed(case_number(case) % 1000)
    q, k, v = _packed(lens_q, hq, d, dtype, g), _packed(lens_k, hkv, d, dtype, g), _packed(lens_k, hkv, d, dtype, g)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    view = (lambda t: t.transpose(0, 1)[None])   # (1, H, total, D), as the varlen op hands the launcher
    runtime.POISON_OUTPUTS = True
    cfg = launch_hopper.config_for(d, d)
    variants = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    if window is not None:
        variants["window"] = window
    with counting_calls(launch_hopper, "attn_fwd") as calls:
        out, lse = launch.attn_fwd(view(q), view(k), view(v), causal, d ** -0.5, config=cfg, **variants)
    assert calls and calls[0][1]["varlen"] is not None, "packed sequences did not run on the Hopper kernel"
    out, lse = out[0].transpose(0, 1), lse[0]
    ref, ref_lse, low, low_lse = _references(q, k, v, lens_q, lens_k, causal, window)
    check_accuracy(f"{case} out", out, ref, low, dtype)
    check_accuracy(f"{case} lse", lse, ref_lse, low_lse.float(), dtype)


def _reference_grads(q, k, v, do, lens_q, lens_k, causal, window):
    """(dq, dk, dv) of float64 and of low-precision standard attention, one
    sequence at a time (GQA: the key heads' gradients summed over their group)."""
    cq, ck = cu_seqlens(lens_q).tolist(), cu_seqlens(lens_k).tolist()
    out = []
    for dtype in (torch.float64, q.dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        grads = [torch.zeros_like(t) for t in leaves]
        for i in range(len(lens_q)):
            sq, sk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
            if cq[i] == cq[i + 1] or ck[i] == ck[i + 1]:
                continue   # no query or no key: every gradient of the sequence is 0
            qi, ki, vi = (t.transpose(0, 1)[None] for t in (leaves[0][sq], leaves[1][sk], leaves[2][sk]))
            group = qi.shape[1] // ki.shape[1]
            o = standard_attention(qi, ki.repeat_interleave(group, 1), vi.repeat_interleave(group, 1),
                                   causal=causal, window=window)
            gi = torch.autograd.grad(o, (leaves[0], leaves[1], leaves[2]), do[sq].to(dtype).transpose(0, 1)[None])
            grads = [a + b for a, b in zip(grads, gi)]
        out.append(grads)
    return out


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", list(CASES))
def test_varlen_backward_against_float64(case, dtype, monkeypatch):
    """The forced backward table config (the atomic dQ sum) on packed
    sequences after the Hopper forward: dq, dk, dv against float64 per
    sequence, under the accuracy rule; the launch took the packed build
    (opt-in: ``TILEATTN_HOPPER_VARLEN_BWD=1``, set here)."""
    monkeypatch.setenv("TILEATTN_HOPPER_VARLEN_BWD", "1")
    lens_q, lens_k, hq, hkv, d, causal, window = CASES[case]
    lens_k = lens_q if lens_k is None else lens_k
    g = torch.Generator(device="cuda").manual_seed(case_number(case) % 1000 + 1)
    q, k, v = _packed(lens_q, hq, d, dtype, g), _packed(lens_k, hkv, d, dtype, g), _packed(lens_k, hkv, d, dtype, g)
    do = _packed(lens_q, hq, d, dtype, g)
    view = (lambda t: t.transpose(0, 1)[None])
    variants = dict(cu_seqlens_q=cu_seqlens(lens_q), cu_seqlens_k=cu_seqlens(lens_k), max_seqlen_q=max(lens_q),
                    max_seqlen_k=max(lens_k), **({} if window is None else dict(window=window)))
    runtime.POISON_OUTPUTS = True
    scale = d ** -0.5
    out, lse = launch.attn_fwd(view(q), view(k), view(v), causal, scale, config=launch_hopper.config_for(d, d),
                               **variants)
    with counting_calls(launch_hopper, "attn_bwd_dkdv") as calls:
        got = launch.attn_bwd(view(do), view(q), view(k), view(v), out, lse, causal, scale,
                              config=launch_hopper.bwd_config_for(d, d), deterministic=False, **variants)
    assert calls and calls[0][1]["varlen"] is not None, "packed sequences did not run the Hopper backward"
    ref, low = _reference_grads(q, k, v, do, lens_q, lens_k, causal, window)
    for part, gt, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        check_accuracy(f"{case} {part}", gt[0].transpose(0, 1), r, lo, dtype)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("part", [pytest.param("forward", marks=needs_hopper),
                                  pytest.param("backward", marks=needs_hopper)])
def test_varlen_sequences_are_isolated(d, part, monkeypatch):
    """NaN in one packed sequence stays in it on the Hopper kernels (forced
    configs; the forward, or forward and backward): the tiles that end past
    a sequence read zeros there, not the next sequence's rows; the other
    sequences match the run without the NaN (bit for bit but dq, whose
    float32 sum takes its adds in any order)."""
    monkeypatch.setenv("TILEATTN_HOPPER_VARLEN_BWD", "1")
    lens = (200, 130, 300)   # the first and middle sequences end inside a tile
    g = torch.Generator(device="cuda").manual_seed(d)
    q, k, v, do = (_packed(lens, 2, d, torch.bfloat16, g) for _ in range(4))
    cu = cu_seqlens(lens)
    view = (lambda t: t.transpose(0, 1)[None])
    variants = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=300, max_seqlen_k=300)

    def run(q, k, v, do):
        out, lse = launch.attn_fwd(view(q), view(k), view(v), True, 0.1, config=launch_hopper.config_for(d, d),
                                   **variants)
        if part == "forward":
            return [out[0].transpose(0, 1)]
        grads = launch.attn_bwd(view(do), view(q), view(k), view(v), out, lse, True, 0.1,
                                config=launch_hopper.bwd_config_for(d, d), deterministic=False, **variants)
        return [t[0].transpose(0, 1) for t in (out, *grads)]

    clean = run(q, k, v, do)
    for t in (q, k, v, do):
        t[200:330] = float("nan")   # the middle sequence
    keep = torch.cat([torch.arange(200), torch.arange(330, 630)]).cuda()
    for name, a, b in zip(("out", "dq", "dk", "dv"), run(q, k, v, do), clean):
        assert torch.isfinite(a[keep]).all(), f"NaN of another sequence reached {name}"
        if name == "dq":
            torch.testing.assert_close(a[keep], b[keep], rtol=2e-2, atol=2e-3, msg="dq of the other sequences changed")
        else:
            assert torch.equal(a[keep], b[keep]), f"{name} of the other sequences changed"


@needs_hopper
def test_varlen_default_dispatch_and_switch(monkeypatch):
    """By default ``attention_varlen`` takes the Hopper forward for bf16
    d = 128 packed sequences whose longest has ``configs.HOPPER_FWD_MIN_KEYS``
    keys, with sinks applied after the kernel (out and lse against float64),
    and the backward runs after it (the portable deterministic one: the
    packed backward build is experimental); not for a short batch nor with
    ``TILEATTN_HOPPER_VARLEN=0``."""
    monkeypatch.delenv("TILEATTN_HOPPER_VARLEN", raising=False)
    monkeypatch.delenv("TILEATTN_HOPPER_VARLEN_BWD", raising=False)
    lens = (2048, 300, 1)
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (_packed(lens, 4, 128, torch.bfloat16, g).requires_grad_() for _ in range(3))
    cu = cu_seqlens(lens)
    sinks = torch.linspace(-2.0, 2.0, 4, device="cuda")
    with counting_calls(launch_hopper, "attn_fwd") as calls, counting_calls(launch_hopper, "attn_bwd_dkdv") as bwd:
        out, lse = tileattn.attention_varlen(q, k, v, cu, cu, 2048, 2048, causal=True, sinks=sinks, return_lse=True)
        assert calls, "a 2,048-token packed batch (bf16, d = 128) did not take the Hopper forward"
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        assert not bwd, "its backward took the experimental packed Hopper backward"
        assert all(torch.isfinite(t).all() for t in grads)
        calls.clear()
        short = [t[:600].detach() for t in (q, k, v)]
        cu_short = cu_seqlens((300, 300))
        tileattn.attention_varlen(*short, cu_short, cu_short, 300, 300, causal=True)
        monkeypatch.setenv("TILEATTN_HOPPER_VARLEN", "0")
        tileattn.attention_varlen(q.detach(), k.detach(), v.detach(), cu, cu, 2048, 2048, causal=True)
        assert not calls, "a short packed batch, or TILEATTN_HOPPER_VARLEN=0, took the Hopper forward"
    cq, out, lse = cu.tolist(), out.detach(), lse.detach()
    for i in range(len(lens)):
        qi, ki, vi = (t.detach()[cq[i]:cq[i + 1]].transpose(0, 1)[None] for t in (q, k, v))
        ref, ref_lse = standard_attention(qi.double(), ki.double(), vi.double(), causal=True, return_lse=True,
                                          sinks=sinks.double())
        low, low_lse = standard_attention(qi, ki, vi, causal=True, return_lse=True, sinks=sinks)
        check_accuracy(f"seq {i} out", out[cq[i]:cq[i + 1]].transpose(0, 1)[None], ref, low, torch.bfloat16)
        check_accuracy(f"seq {i} lse", lse[:, cq[i]:cq[i + 1]][None], ref_lse, low_lse.float(), torch.bfloat16)


def test_varlen_rule(monkeypatch):
    """The default dispatch's rule for packed sequences (no GPU needed): QK = V
    head dim 64 or 128, a longest sequence of at least the dense call's
    ``HOPPER_FWD_MIN_KEYS`` keys, the switch (``TILEATTN_HOPPER_VARLEN`` over
    ``dispatch.HOPPER_VARLEN``); a forced config skips the length and the
    switch; the backward's packed build only with ``TILEATTN_HOPPER_VARLEN_BWD=1``."""
    from tileattn import configs
    q64, q128, q192 = (torch.empty(1, 1, 1, d) for d in (64, 128, 192))
    least = configs.HOPPER_FWD_MIN_KEYS[(128, True)]
    monkeypatch.delenv("TILEATTN_HOPPER_VARLEN", raising=False)
    monkeypatch.delenv("TILEATTN_HOPPER_VARLEN_BWD", raising=False)
    assert dispatch.HOPPER_VARLEN and dispatch.hopper_varlen_fwd(q128, q128, True, least)
    assert not dispatch.hopper_varlen_bwd(q128, q128) and not dispatch.hopper_varlen_bwd(q128, q128, forced=True)
    monkeypatch.setenv("TILEATTN_HOPPER_VARLEN_BWD", "1")
    assert dispatch.hopper_varlen_fwd(q128, q128, True, least) and dispatch.hopper_varlen_bwd(q128, q128)
    assert not dispatch.hopper_varlen_fwd(q128, q128, True, least - 1)
    assert dispatch.hopper_varlen_fwd(q64, q64, False, 1, forced=True)
    assert not dispatch.hopper_varlen_fwd(q192, q128, False, 10**6, forced=True)
    assert not dispatch.hopper_varlen_fwd(q128, q64, False, 10**6) and not dispatch.hopper_varlen_bwd(q192, q128)
    monkeypatch.setenv("TILEATTN_HOPPER_VARLEN", "0")
    assert not dispatch.hopper_varlen_fwd(q128, q128, True, 10**6) and not dispatch.hopper_varlen_bwd(q128, q128)
    monkeypatch.setattr(dispatch, "HOPPER_VARLEN", False)
    monkeypatch.setenv("TILEATTN_HOPPER_VARLEN", "1")
    assert dispatch.hopper_varlen_fwd(q128, q128, True, 10**6) and dispatch.hopper_varlen_bwd(q128, q128)
    monkeypatch.delenv("TILEATTN_HOPPER_VARLEN")
    assert not dispatch.hopper_varlen_fwd(q128, q128, True, 10**6) and not dispatch.hopper_varlen_bwd(q128, q128)
    assert dispatch.hopper_varlen_fwd(q128, q128, True, 10**6, forced=True)
    assert dispatch.hopper_varlen_bwd(q128, q128, forced=True)


@pytest.mark.parametrize("case", ["slices", "pairs", "dv-narrower"])
def test_varlen_backward_launcher_refuses(case):
    """The Hopper backward launcher refuses packed sequences where its packed
    build does not run, with a ValueError naming varlen (CPU tensors)."""
    d, dv = (192, 128) if case == "dv-narrower" else (128, 128)
    q, k = (torch.empty(1, 4, 300, d, dtype=torch.bfloat16) for _ in range(2))
    v = torch.empty(1, 4, 300, dv, dtype=torch.bfloat16)
    cfg = dataclasses.replace(launch_hopper.bwd_config_for(d, dv), head_slices=2 if case == "slices" else None,
                              pair_blocks=True if case == "pairs" else None)
    cu = cu_seqlens((100, 200), device="cpu")
    stats = torch.empty(1, 4, 300)
    with pytest.raises(ValueError, match="varlen: the Hopper backward runs packed"):
        launch_hopper.attn_bwd_dkdv(v, q, k, v, torch.zeros(1, 4, 300, d), k, v, stats, stats, True, 0.1, cfg,
                                    varlen=(cu, cu, 200, 200))


@pytest.mark.parametrize("case", ["persistent", "sinks", "remainder", "dv-narrower"])
def test_varlen_launcher_refuses(case):
    """The Hopper launcher refuses what its packed build does not run, with a
    ValueError naming varlen, before any launch (CPU tensors: nothing runs)."""
    d, dv = 64, 32 if case == "dv-narrower" else 64
    q, k = (torch.empty(1, 2, 300, d, dtype=torch.bfloat16) for _ in range(2))
    v = torch.empty(1, 2, 300, dv, dtype=torch.bfloat16)
    cu = cu_seqlens((100, 200), device="cpu")
    cfg = dataclasses.replace(HopperFwdConfig(pingpong=False), persistent=case == "persistent")
    kw = dict(sinks=torch.zeros(2)) if case == "sinks" else dict(remainder=True) if case == "remainder" else {}
    with pytest.raises(ValueError, match="varlen: the Hopper forward runs packed"):
        launch_hopper.attn_fwd(q, k, v, True, 0.125, cfg, varlen=(cu, cu, 200, 200), **kw)


def test_varlen_backward_config_needs_the_experimental_switch(monkeypatch):
    """A forced Hopper backward config on packed sequences without
    ``TILEATTN_HOPPER_VARLEN_BWD=1``: a ValueError naming the config and the
    switch, before any launch (CPU tensors: nothing runs)."""
    monkeypatch.delenv("TILEATTN_HOPPER_VARLEN_BWD", raising=False)
    q, k, v, do, o = (torch.empty(1, 2, 300, 64, dtype=torch.bfloat16) for _ in range(5))
    cu = cu_seqlens((100, 200), device="cpu")
    with pytest.raises(ValueError, match="config: .*TILEATTN_HOPPER_VARLEN_BWD=1"):
        launch.attn_bwd(do, q, k, v, o, torch.empty(1, 2, 300), True, 0.125,
                        config=launch_hopper.bwd_config_for(64, 64), deterministic=False, cu_seqlens_q=cu,
                        cu_seqlens_k=cu, max_seqlen_q=200, max_seqlen_k=200)


def test_scratch_allocator_fills_in_only_where_none_is_set():
    """The packed builds' device-made descriptors need Triton's scratch
    allocator: ``runtime.scratch_allocator`` sets one where Triton has none
    (each thread's context starts without), and keeps one a user set."""
    import contextvars

    import triton
    from triton.runtime import _allocation

    def run():
        assert _allocation._allocator.get() is _allocation._NULL_ALLOCATOR
        runtime.scratch_allocator()
        assert _allocation._allocator.get() is runtime._scratch

        def mine(size, alignment, stream):
            return None
        triton.set_allocator(mine)
        runtime.scratch_allocator()
        assert _allocation._allocator.get() is mine
    contextvars.Context().run(run)   # a fresh context, as a new thread has: the test leaves no allocator behind


def test_varlen_backward_call_plumbing(monkeypatch):
    """``hopper_calls.bwd`` on packed sequences with the dK/dV kernel replaced
    by a float64 reference of its contract per sequence (dk, dv written;
    dQ / scale added into the float32 sum): the kernel gets the packed
    arguments and the config with lse2 / Δ by pointer loads (``stats_tma``
    off), and the portable preprocess and convert around it give the
    reference gradients (the kernel itself is the GPU tests')."""
    from tileattn.launch import hopper_calls
    from tileattn.testing import DEVICE
    lens = (17, 40, 9)
    cu = cu_seqlens(lens, device=DEVICE)
    total = sum(lens)
    q, do = (torch.randn(1, 4, total, 64, dtype=torch.float32, device=DEVICE) for _ in range(2))
    k, v = (torch.randn(1, 2, total, 64, dtype=torch.float32, device=DEVICE) for _ in range(2))
    scale = 0.25
    bounds = cu.tolist()

    def per_sequence(q, k, v, do):
        """(out, lse, dq, dk, dv) of float64 causal attention, sequence by sequence (GQA by repeat)."""
        parts = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            leaves = [t[:, :, a:b].double().requires_grad_() for t in (q, k, v)]
            o, lse = standard_attention(leaves[0], leaves[1].repeat_interleave(2, 1), leaves[2].repeat_interleave(2, 1),
                                        causal=True, scale=scale, return_lse=True)
            parts.append((o.detach(), lse.detach()) + torch.autograd.grad(o, leaves, do[:, :, a:b].double()))
        return [torch.cat(ts, dim=2) for ts in zip(*parts)]
    out, lse, gq, gk, gv = per_sequence(q, k, v, do)
    seen = []

    def fake_dkdv(do_, q_, k_, v_, dq_acc, dk, dv, lse2, delta, causal, scale_, cfg, ds_sum, window=None, varlen=None,
                  sink_sums=None, sinks=None, workspace=None):
        assert sink_sums is None and sinks is None and workspace is None   # packed: never the persistent walk
        seen.append((cfg.stats_tma, varlen))
        dk.copy_(gk)
        dv.copy_(gv)
        dq_acc.add_(gq.float() / scale_)
    monkeypatch.setattr(launch_hopper, "attn_bwd_dkdv", fake_dkdv)
    monkeypatch.setattr(runtime, "PLANS_ON", False)
    got = hopper_calls.bwd(do, q, k, v, out.float(), lse.float(), None, True, scale, varlen=(cu, cu, 40, 40))
    assert seen and seen[0][0] is False and seen[0][1][2:] == (40, 40)
    for name, g, w in zip(("dq", "dk", "dv"), got, (gq, gk, gv)):
        assert torch.allclose(g.double(), w, atol=1e-4, rtol=1e-4), name
