"""``attention_with_kvcache`` with a V head dim of its own (Dv != D) and with a
shared cache (``v_cache = k_cache[..., :Dv]``; the absorbed MLA layout at
D = 576, Dv = 512, one kv head, 16 or 128 query heads), on the Triton
kernels and the PyTorch path, against float64 ``standard_attention`` on the
gathered logical sequence under the accuracy rule of ``tileattn.testing``:
contiguous and paged caches (shuffled block tables, NaN in every slot that
holds no entry), GQA/MQA, odd cache lengths, forced split counts, the append
of k_new (alone, or with v_new = k_new[..., :Dv], on a shared cache), both
load paths and both loop structures, the variants; bad input (before any
launch or cache write); the call key, which must tell a shared cache from a
look-alike.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import pytest
import torch

import tileattn
from tileattn import configs, reference_decode, validation
from tileattn.launch import decode as launch_decode
from tileattn.reference import standard_attention
from tileattn.testing import check_accuracy, forbidden, seed_case
from tileattn.testing_decode import shuffled_block_table, write_tokens
from tileattn.testing_decode import Inputs, assert_cache_appended, reference, run
from tileattn.validation_kvcache import MLA_HEAD_DIM, MLA_HEAD_DIM_V, shares_kv

from conftest import DEVICE, DT_NAME as DT, HAS_CUDA, INTERPRETED

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@dataclasses.dataclass(frozen=True)
class Case:
    hq: int
    hkv: int
    nq: int
    d: int
    dv: int
    dtype: torch.dtype
    seqlens: tuple            # valid entries per batch element before the append
    n_new: int = 0
    page: int = 0             # 0: contiguous
    splits: int = 1
    shared: bool = False      # v_cache = k_cache[..., :dv]
    v_new_view: bool = False  # shared: v_new = k_new[..., :dv] (else None)
    causal: bool = True
    window: Optional[tuple] = None
    softcap: Optional[float] = None
    layout: str = "bhnd"      # "bnhd": caches and new tokens stored (B, N, H, D), transposed

    @property
    def id(self) -> str:
        parts = [f"B{len(self.seqlens)}", f"H{self.hq}x{self.hkv}", f"Nq{self.nq}", f"D{self.d}", f"Dv{self.dv}",
                 DT[self.dtype], "L" + "-".join(map(str, self.seqlens)), f"new{self.n_new}",
                 f"page{self.page}" if self.page else "contig", f"split{self.splits}"]
        if self.shared:
            parts.append("shared" + ("-vview" if self.v_new_view else ""))
        if not self.causal:
            parts.append("full")
        if self.window:
            parts.append(f"win{self.window[0]}_{self.window[1]}")
        if self.softcap:
            parts.append(f"cap{self.softcap}")
        return "-".join(parts + [self.layout])


def _tensor(shape, dtype, layout, fill=None):
    b, h, n, d = shape
    if layout == "bnhd":
        x = torch.randn(b, n, h, d, device=DEVICE).to(dtype).transpose(1, 2)
    else:
        x = torch.randn(b, h, n, d, device=DEVICE).to(dtype)
    return x.fill_(fill) if fill is not None else x


def make_inputs(c: Case) -> Inputs:
    seed_case(c.id)
    b = len(c.seqlens)
    need = max([s + c.n_new for s in c.seqlens] + [1])
    if c.page:
        used = [-(-(s + c.n_new) // c.page) for s in c.seqlens]
        num_pages = sum(used) + 2
        table = shuffled_block_table(used, -(-need // c.page) + 1, num_pages, num_pages + 100).to(DEVICE)
        rows, first = c.page, num_pages
    else:
        table, rows, first = None, need + 5, b
    k_cache = _tensor((first, c.hkv, rows, c.d), c.dtype, c.layout, float("nan"))
    v_cache = k_cache[..., :c.dv] if c.shared else _tensor((first, c.hkv, rows, c.dv), c.dtype, c.layout,
                                                           float("nan"))
    q = torch.randn(b, c.hq, c.nq, c.d, device=DEVICE).to(c.dtype)
    k_new = v_new = None
    if c.n_new:
        k_new = _tensor((b, c.hkv, c.n_new, c.d), c.dtype, c.layout)
        if c.shared:
            v_new = k_new[..., :c.dv] if c.v_new_view else None
        else:
            v_new = _tensor((b, c.hkv, c.n_new, c.dv), c.dtype, c.layout)
    k_seq, v_seq = [], []
    for i, s in enumerate(c.seqlens):
        ks = torch.randn(c.hkv, s, c.d, device=DEVICE).to(c.dtype)
        write_tokens(k_cache, table, i, 0, ks)
        if c.shared:
            vs = ks[..., :c.dv]
        else:
            vs = torch.randn(c.hkv, s, c.dv, device=DEVICE).to(c.dtype)
            write_tokens(v_cache, table, i, 0, vs)
        if c.n_new:
            ks = torch.cat([ks, k_new[i]], dim=1)
            vs = ks[..., :c.dv] if c.shared else torch.cat([vs, v_new[i]], dim=1)
        k_seq.append(ks)
        v_seq.append(vs)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    if c.n_new:
        for i, s in enumerate(c.seqlens):
            write_tokens(k_expected, table, i, s, k_new[i])
            if not c.shared:
                write_tokens(v_expected, table, i, s, v_new[i])
        if c.shared:
            v_expected = k_expected[..., :c.dv]
    seqlens = torch.tensor(c.seqlens, dtype=torch.int32, device=DEVICE)
    return Inputs(q, k_cache, v_cache, seqlens, table, k_new, v_new, None, k_seq, v_seq, k_expected, v_expected)


def assert_case(c: Case, path: str = "kernels"):
    if c.dtype == BF16 and INTERPRETED and path == "kernels":
        pytest.skip("the interpreter's bf16 arithmetic is not faithful (conftest.py); bf16 runs on a GPU")
    x = make_inputs(c)
    assert shares_kv(x.k_cache, x.v_cache) == c.shared
    out, lse = run(c, x)
    assert out.shape == (len(c.seqlens), c.hq, c.nq, c.dv) and out.dtype == c.dtype
    assert_cache_appended(x)
    ref_out, ref_lse = reference(c, x, torch.float64)
    low_out, low_lse = reference(c, x, c.dtype)
    check_accuracy(f"{c.id} out", out, ref_out, low_out, c.dtype)
    check_accuracy(f"{c.id} lse", lse, ref_lse, low_lse, c.dtype)


# ---------------------------------------------------------------------------
# V of its own head dim
# ---------------------------------------------------------------------------
DV_CASES = [
    Case(4, 2, 1, 32, 16, F16, (37, 5), n_new=1),                       # GQA, odd lengths
    Case(8, 2, 1, 64, 32, F32, (70, 0, 17), splits=3),                  # an empty cache among the splits
    Case(4, 4, 2, 16, 48, F16, (29, 40), n_new=2, splits=2),            # V wider than K, not a power of 2
    Case(8, 1, 1, 40, 24, F32, (101,), n_new=3, splits=4),              # MQA, odd widths
    Case(4, 2, 3, 32, 64, F32, (0, 2), n_new=1),                        # Nq > Nk: rows that see no key
    Case(8, 2, 1, 32, 64, F16, (45, 16), n_new=1, page=16, splits=2),   # paged, pointers (16-token pages)
    Case(4, 2, 3, 48, 32, F32, (33, 60), n_new=3, page=32),             # paged, descriptors
    Case(4, 2, 1, 32, 16, F16, (50, 19), n_new=1, page=16, layout="bnhd", splits=0),
    Case(4, 2, 2, 32, 16, F32, (40, 13), n_new=2, window=(9, -1), softcap=2.0, splits=2),
    Case(4, 1, 1, 64, 32, BF16, (33, 70), n_new=1, splits=2),
]


@pytest.mark.parametrize("case", DV_CASES, ids=lambda c: c.id)
def test_head_dim_v(case, path):
    assert_case(case, path)


@pytest.mark.parametrize("case", [DV_CASES[0], DV_CASES[6]], ids=lambda c: c.id)
def test_head_dim_v_pointer_path(case, pointer_path):
    assert_case(case)


@pytest.mark.parametrize("splits", [3, 20])
def test_combine_of_512_wide_partials(splits, kernels):
    """The combine keeps a load at 128 floats a thread for 512-wide partials
    (two rows a program at 16 splits a chunk) and still merges exactly."""
    b, hq, n_q, d = 1, 3, 1, 512
    o_part = torch.randn(b, hq, n_q, splits, d, device=DEVICE)
    l_part = torch.randn(b, hq, n_q, splits, device=DEVICE) * 3
    l_part[0, 1, 0, ::2] = float("-inf")
    out = torch.full((b, hq, n_q, d), float("nan"), device=DEVICE)
    lse = torch.full((b, hq, n_q), float("nan"), device=DEVICE)
    launch_decode.combine_splits(o_part, l_part, out, lse)
    w = torch.softmax(l_part.double(), dim=-1)
    torch.testing.assert_close(out.double(), (w[..., None] * o_part.double()).sum(-2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), torch.logsumexp(l_part.double(), -1), rtol=1e-6, atol=1e-5)


# ---------------------------------------------------------------------------
# a shared cache: v_cache = k_cache[..., :Dv]
# ---------------------------------------------------------------------------
SHARED_SMALL = [
    Case(8, 2, 1, 48, 32, F16, (37, 5), n_new=1, shared=True),
    Case(8, 1, 2, 40, 24, F32, (61, 17), n_new=2, shared=True, splits=3),
    Case(4, 2, 1, 48, 32, F16, (45, 20), n_new=1, page=32, shared=True, v_new_view=True),
    Case(4, 1, 1, 48, 32, F32, (50, 3), n_new=1, page=16, shared=True, splits=2),
    Case(4, 2, 1, 48, 32, F32, (33, 70), shared=True, window=(12, -1), softcap=3.0, splits=2),
    Case(4, 2, 1, 48, 16, F16, (20, 41), n_new=1, shared=True, layout="bnhd"),
]


@pytest.mark.parametrize("case", SHARED_SMALL, ids=lambda c: c.id)
def test_shared_cache(case, path):
    assert_case(case, path)


@pytest.mark.parametrize("case", [SHARED_SMALL[0], SHARED_SMALL[2]], ids=lambda c: c.id)
def test_shared_cache_pointer_path(case, pointer_path):
    assert_case(case)


@pytest.mark.parametrize("one_loop", [True, False], ids=["one-loop", "three-loops"])
@pytest.mark.parametrize("loads", ["descriptors", "pointers"])
def test_shared_cache_loop_structures(one_loop, loads, kernels, decode_loops):
    """Both loop structures of the partial kernel on a shared cache, 32-key tiles."""
    decode_loops(one_loop, loads, "DECODE_SHARED_CONFIGS")
    assert_case(Case(8, 2, 1, 48, 32, F16, (0, 30, 33, 97), n_new=1, window=(40, -1), shared=True, splits=2))


# the absorbed MLA layout: D = 576 (Dv = 512 channels of value, 64 of rope key), one kv head
MLA = [
    Case(16, 1, 1, MLA_HEAD_DIM, MLA_HEAD_DIM_V, F16, (37,), n_new=1, shared=True),
    Case(16, 1, 1, MLA_HEAD_DIM, MLA_HEAD_DIM_V, F32, (300, 37), shared=True, splits=3),
    Case(16, 1, 1, MLA_HEAD_DIM, MLA_HEAD_DIM_V, F16, (37, 300), n_new=1, page=64, shared=True, v_new_view=True),
    Case(128, 1, 1, MLA_HEAD_DIM, MLA_HEAD_DIM_V, F16, (300,), n_new=1, shared=True, splits=2),
    Case(128, 1, 1, MLA_HEAD_DIM, MLA_HEAD_DIM_V, F16, (37, 90), n_new=1, page=64, shared=True),  # pointers
    Case(16, 1, 1, MLA_HEAD_DIM, MLA_HEAD_DIM_V, BF16, (300,), n_new=1, shared=True, splits=0),
]


@pytest.mark.parametrize("case", MLA, ids=lambda c: c.id)
def test_absorbed_mla(case, path):
    assert_case(case, path)


def test_absorbed_mla_decode_loop(path):
    """Three steps appending k_new alone, the values read from the keys."""
    c = Case(16, 1, 1, MLA_HEAD_DIM, MLA_HEAD_DIM_V, F32, (20, 35), page=32, shared=True)
    x = make_inputs(c)
    seq = x.cache_seqlens.clone()
    k_all = list(x.k_seq)
    for step in range(3):
        q = torch.randn(2, 16, 1, MLA_HEAD_DIM, device=DEVICE)
        kn = torch.randn(2, 1, 1, MLA_HEAD_DIM, device=DEVICE)
        out = tileattn.attention_with_kvcache(q, x.k_cache, x.v_cache, seq, k_new=kn, block_table=x.block_table)
        for i in range(2):
            k_all[i] = torch.cat([k_all[i], kn[i]], dim=1)
            k = k_all[i][None]
            want = standard_attention(q[i:i + 1].double(), k.double(), k[..., :MLA_HEAD_DIM_V].double(), causal=True)
            low = standard_attention(q[i:i + 1], k, k[..., :MLA_HEAD_DIM_V], causal=True)
            check_accuracy(f"step {step} batch {i}", out[i:i + 1], want, low, F32)
        seq += 1


def test_shares_kv():
    k = torch.randn(2, 1, 8, 48, device=DEVICE)
    assert shares_kv(k, k[..., :32]) and shares_kv(k.transpose(1, 2), k.transpose(1, 2)[..., :16])
    assert not shares_kv(k, k[..., :32].clone())        # a copy
    assert not shares_kv(k, k[..., 8:40])               # not the first channels
    assert not shares_kv(k, k)                          # Dv = D: the plain layout
    assert not shares_kv(k, k[:, :, :4, :32])           # fewer rows
    e = torch.empty(2, 1, 0, 48, device=DEVICE)
    assert not shares_kv(e, e[..., :32])                # no storage to share


def test_call_key_tells_a_shared_cache_from_a_look_alike(path):
    """A shared cache and a v_cache of the same shape and strides over other
    storage have one key but for the addresses: the second call must read
    its own values, and after a valid absorbed call a look-alike with
    D = 576 must still raise."""
    s = torch.tensor([30], dtype=torch.int32, device=DEVICE)
    q = torch.randn(1, 4, 1, 48, device=DEVICE)
    k = torch.randn(1, 1, 32, 48, device=DEVICE)
    other = torch.randn(1, 1, 32, 48, device=DEVICE)
    for v in (k[..., :32], other[..., :32]):
        out = tileattn.attention_with_kvcache(q, k, v, s)
        ref = standard_attention(q.double(), k[:, :, :30].double(), v[:, :, :30].double(), causal=True)
        low = standard_attention(q, k[:, :, :30], v[:, :, :30], causal=True)
        check_accuracy("look-alike", out, ref, low, F32)
    q = torch.randn(1, 16, 1, 576, device=DEVICE)
    k = torch.randn(1, 1, 16, 576, device=DEVICE)
    s = torch.tensor([8], dtype=torch.int32, device=DEVICE)
    tileattn.attention_with_kvcache(q, k, k[..., :512], s)
    with pytest.raises(ValueError, match="head_dim 576 is only supported"):
        tileattn.attention_with_kvcache(q, k, torch.randn(1, 1, 16, 576, device=DEVICE)[..., :512], s)


def test_usable_configs_keep_the_accumulator_in_registers():
    """64 packed rows x 512 float32 need 8 warps (128 registers a thread);
    the shared table's first fitting config then has 8, and a 4-warp config
    is never chosen there."""
    assert configs.decode_acc_regs(64, 512, 8) == configs.MAX_ACC_REGS
    assert configs.decode_acc_regs(64, 512, 4) > configs.MAX_ACC_REGS
    # the plain table at its widest (64 rows, head dim 256, 4 warps) is at the bound, not over it
    assert configs.decode_acc_regs(configs.MAX_DECODE_BLOCK_M, 256, 4) <= configs.MAX_ACC_REGS
    from tileattn.launch import decode_configs
    four = configs.DecodeConfig(32, 4, 2, layout="contiguous")
    assert not decode_configs._usable(four, 64, 576, 2, 0, True, 227 * 1024, 512, True)
    assert decode_configs._usable(four, 16, 576, 2, 0, True, 227 * 1024, 512, True)
    assert not decode_configs._usable(four, 16, 576, 2, 0, True, 48 * 1024, 512, True)   # shared memory
    h200 = 227 * 1024
    first = next(c for c in configs.DECODE_SHARED_CONFIGS
                 if decode_configs._usable(c, 64, 576, 2, 0, True, h200, 512, True))
    assert first.num_warps == 8


# ---------------------------------------------------------------------------
# bad input: a clear error naming the argument, before any launch or write
# ---------------------------------------------------------------------------
def _t(*shape):
    return torch.randn(*shape, device=DEVICE).half()


def _seq(*vals):
    return torch.tensor(vals, dtype=torch.int32, device=DEVICE)


def _mla(**over):
    """A valid absorbed call: B=2, Hq=16, one kv head, capacity 32."""
    k = _t(2, 1, 32, 576)
    args = dict(q=_t(2, 16, 1, 576), k_cache=k, v_cache=k[..., :512], cache_seqlens=_seq(3, 5))
    args.update(over)
    return args


def _dv(**over):
    """A valid Dv != D call: D = 32, Dv = 16."""
    args = dict(q=_t(2, 4, 1, 32), k_cache=_t(2, 2, 32, 32), v_cache=_t(2, 2, 32, 16), cache_seqlens=_seq(3, 5))
    args.update(over)
    return args


def _k_new_mla():
    return _t(2, 1, 1, 576)


BAD = {
    "576-separate-v": (lambda: _mla(v_cache=_t(2, 1, 32, 512)), ValueError,
                       r"head_dim 576 is only supported for decoding with v_cache = k_cache\[\.\.\., :512\]"),
    "576-copied-v": (lambda: _mla(v_cache=_mla()["k_cache"][..., :512].clone()), ValueError,
                     r"head_dim 576 is only supported .* \(not a view of k_cache\)"),
    "576-view-of-256": (lambda: (lambda k: _mla(k_cache=k, v_cache=k[..., :256]))(_t(2, 1, 32, 576)), ValueError,
                        r"head_dim 576 is only supported .* head dim 256 \(a view of k_cache\)"),
    "576-v-576": (lambda: (lambda k: _mla(k_cache=k, v_cache=k))(_t(2, 1, 32, 576)), ValueError,
                  "head_dim 576 is only supported"),
    "640-shared": (lambda: (lambda k: _mla(q=_t(2, 16, 1, 640), k_cache=k, v_cache=k[..., :512]))(_t(2, 1, 32, 640)),
                   ValueError, rf"1\.\.{validation.MAX_DECODE_HEAD_DIM}"),
    "v-head-dim-too-big": (lambda: _dv(v_cache=_t(2, 2, 32, validation.MAX_DECODE_HEAD_DIM + 1)), ValueError,
                           rf"last dimension of v_cache\) must be in 1\.\.{validation.MAX_DECODE_HEAD_DIM}"),
    "v-shape": (lambda: _dv(v_cache=_t(2, 2, 24, 16)), ValueError, "same shape but for the head dim"),
    "v_new-not-a-view": (lambda: (lambda kn: _mla(k_new=kn, v_new=kn[..., :512].clone()))(_k_new_mla()),
                         ValueError, r"v_new must be None or k_new\[\.\.\., :512\]"),
    "v_new-other-view": (lambda: (lambda kn: _mla(k_new=kn, v_new=kn[..., 64:]))(_k_new_mla()),
                         ValueError, r"v_new must be None or k_new\[\.\.\., :512\]"),
    "v_new-without-k_new": (lambda: _mla(v_new=_k_new_mla()[..., :512]), ValueError, "k_new and v_new"),
    "k_new-alone-unshared": (lambda: _dv(k_new=_t(2, 2, 1, 32)), ValueError, "k_new and v_new"),
    "k_new-head-dim": (lambda: _mla(k_new=_t(2, 1, 1, 512)), ValueError, "k_new/v_new must have shape"),
    "v_new-head-dim": (lambda: _dv(k_new=_t(2, 2, 1, 32), v_new=_t(2, 2, 1, 32)), ValueError,
                       r"v_new's head dim \(32\) must equal v_cache's \(16\)"),
    "v_new-rows": (lambda: _dv(k_new=_t(2, 2, 1, 32), v_new=_t(2, 2, 2, 16)), ValueError,
                   "k_new and v_new must have the same shape"),
    "mla-dtype": (lambda: _mla(q=_t(2, 16, 1, 576).float()), TypeError, "k_cache dtype"),
    "mla-seqlens": (lambda: _mla(cache_seqlens=_seq(3, 40)), ValueError, r"cache_seqlens\[1\] = 40 exceeds"),
}
if MLA_HEAD_DIM_V > validation.MAX_DECODE_HEAD_DIM:
    BAD["v-512-unshared"] = (lambda: _dv(v_cache=_t(2, 2, 32, 512)), ValueError,
                             r"v_cache head dim 512 is only supported as v_cache = k_cache\[\.\.\., :512\]")


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_raises_before_launch(name, path, monkeypatch):
    make, exc, msg = BAD[name]
    args = make()
    caches = [args["k_cache"].clone(), args["v_cache"].clone()]
    no_launch = forbidden("a kernel was launched (or the cache written) for bad input")
    for mod, fn in ((launch_decode, "append_kv"), (launch_decode, "kvcache_attention"),
                    (reference_decode, "append_kv_"), (reference_decode, "kvcache_attention")):
        monkeypatch.setattr(mod, fn, no_launch)
    q, kc, vc, seq = args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("cache_seqlens")
    with pytest.raises(exc, match=msg):
        tileattn.attention_with_kvcache(q, kc, vc, seq, **args)
    assert torch.equal(kc, caches[0]) and torch.equal(vc, caches[1])


# ---------------------------------------------------------------------------
# on a GPU: bf16 at sizes the interpreter cannot afford
# ---------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("hq", [16, 128])
@pytest.mark.parametrize("page", [0, 64], ids=lambda p: f"page{p}" if p else "contig")
def test_gpu_absorbed_mla(hq, page):
    assert_case(Case(hq, 1, 1, MLA_HEAD_DIM, MLA_HEAD_DIM_V, BF16, (4000, 1037, 17), n_new=1, page=page,
                     shared=True, splits=0))


# ---------------------------------------------------------------------------
# the benchmark's absorbed mode, checked end to end on the CPU (PyTorch path)
# ---------------------------------------------------------------------------
def test_decode_bench_absorbed_on_cpu(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_bench.py"
    spec = importlib.util.spec_from_file_location("decode_bench", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--absorbed", "--out", str(tmp_path), "--device", "cpu", "--dtype", "fp16", "--batch", "1",
                     "--absorbed-heads", "16", "128", "--cache-lens", "48", "80", "--splits", "2",
                     "--sdpa", "math", "--copy-gib", "0.001", "--profile"])
    assert rc == 0
    data = json.loads((tmp_path / "decode_bench.json").read_text())
    rows = data["rows"]
    # --profile: a breakdown of tileattn's call per point (here the CPU ops' self time)
    prof = [r for r in rows if r["provider"].startswith("kernel: ")]
    assert {(r["heads"], r["cache_len"]) for r in prof} == {(16, 48), (128, 48), (16, 80), (128, 80)}
    assert all(r["us_per_call"] > 0 and r["launches_per_call"] > 0 for r in prof)
    mine = [r for r in rows if r["provider"] == "tileattn"]
    assert {(r["heads"], r["cache_len"]) for r in mine} == {(16, 48), (128, 48), (16, 80), (128, 80)}
    assert [r["check"] for r in mine if r["cache_len"] == 48] == ["passed", "passed"]
    # tileattn reads K once; SDPA reads K and the copied V
    sdpa = [r for r in rows if r["provider"].startswith("sdpa-math")]
    assert all(r["status"] == "ok" for r in sdpa) and all(r["check"] == "passed" for r in sdpa if r["cache_len"] == 48)
    assert all(s["read_bytes"] == m["read_bytes"] * 1088 / 576 for s, m in zip(sdpa, mine))
    assert {(s["heads"], s["cache_len"]) for s in data["summary"]} == {(r["heads"], r["cache_len"]) for r in mine}
    assert all(s["speedup_vs_sdpa"] for s in data["summary"])


@pytest.mark.parametrize("case", [Case(16, 1, 1, MLA_HEAD_DIM, MLA_HEAD_DIM_V, F32, (37, 0), n_new=1, shared=True,
                                       splits=2),
                                  Case(4, 2, 1, 32, 16, F32, (37, 5), n_new=1, splits=3)], ids=lambda c: c.id)
def test_sinks_with_head_dim_v(case, path):
    """Sinks fold in after the split combine whatever V's width (a
    one-token sequence beside a long one, the shared layout included)."""
    x = make_inputs(case)
    sinks = torch.randn(case.hq, device=DEVICE)
    out, lse = run(case, x, sinks=sinks)
    for i in range(len(case.seqlens)):
        q, k, v = x.q[i:i + 1], x.k_seq[i][None], x.v_seq[i][None]
        want = standard_attention(q.double(), k.double(), v.double(), causal=True, sinks=sinks.double(),
                                  return_lse=True)
        low = standard_attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
        for j, name in enumerate(("out", "lse")):
            check_accuracy(f"{case.id} batch {i} {name}", (out, lse)[j][i:i + 1], want[j].reshape(low[j].shape),
                           low[j], case.dtype)


def test_decode_bench_same_size_copy_takes_the_models_float_bytes():
    """The absorbed runs' same-size copy (timed from CUDA graphs on a GPU) is
    sized from the cost model's byte count, a float: it moves that many bytes
    (read + write), rounded down to an even count."""
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(folder))   # decode_absorbed imports decode_bench beside it
    try:
        spec = importlib.util.spec_from_file_location("decode_absorbed", folder / "decode_absorbed.py")
        absorbed = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(absorbed)
    finally:
        sys.path.remove(str(folder))
    step, moved = absorbed.same_size_copy(1001.0, torch.device("cpu"))
    assert moved == 1000
    out = step()
    assert out.dtype == torch.uint8 and out.numel() == 500
