"""A V head dim Dv different from the Q/K head dim D: v (B, Hkv, Nk, Dv), the
output (B, Hq, Nq, Dv), on the kernels and the PyTorch path, dense, packed,
block-sparse and windowed, with and without attention sinks, forward and
backward under the accuracy rule against float64 references built from
``standard_attention``."""
from unittest import mock

import pytest
import torch

import tileattn
from tileattn import dispatch
from tileattn.reference import standard_attention, standard_attention_varlen
from tileattn.testing import DEVICE, check_accuracy, cu_seqlens, forbidden, output_loss, seed_case

# (D, Dv): smaller and larger V, the MLA training shape, odd widths, V of 256
PAIRS = [(64, 32), (32, 64), (192, 128), (40, 24), (128, 256)]
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _inputs(case_id, b, hq, hkv, nq, nk, d, dv, dtype):
    seed_case(case_id)
    q = torch.randn(b, hq, nq, d, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(b, hkv, nk, d, device=DEVICE).to(dtype).requires_grad_()
    v = torch.randn(b, hkv, nk, dv, device=DEVICE).to(dtype).requires_grad_()
    do = torch.randn(b, hq, nq, dv, device=DEVICE).to(dtype)
    dlse = torch.randn(b, hq, nq, device=DEVICE)
    return q, k, v, do, dlse


def _fwd_bwd(fn, q, k, v, do, dlse):
    out, lse = fn(q, k, v)
    return (out, lse) + torch.autograd.grad(output_loss(out, lse, do, dlse), (q, k, v))


def _check(case_id, fn, ref, q, k, v, do, dlse, dtype):
    """tileattn ``fn`` against ``ref`` in ``dtype`` and in float64."""
    mine = _fwd_bwd(fn, q, k, v, do, dlse)
    lowp = _fwd_bwd(ref, q, k, v, do, dlse)
    hi = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref64 = _fwd_bwd(ref, *hi, do.double(), dlse)
    assert mine[0].shape == ref64[0].shape and mine[0].dtype == dtype
    for name, got, r64, rlp in zip(("out", "lse", "dq", "dk", "dv"), mine, ref64, lowp):
        check_accuracy(f"{case_id} {name}", got, r64, rlp, dtype)


def _dense(case_id, b, hq, hkv, nq, nk, d, dv, dtype, deterministic=None, **kw):
    q, k, v, do, dlse = _inputs(case_id, b, hq, hkv, nq, nk, d, dv, dtype)

    def mine(qq, kk, vv):
        return tileattn.attention(qq, kk, vv, return_lse=True, deterministic=deterministic, **kw)

    def ref(qq, kk, vv):
        return standard_attention(qq, kk, vv, return_lse=True, **kw)
    _check(case_id, mine, ref, q, k, v, do, dlse, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=lambda t: NAMES[t])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d,dv", PAIRS, ids=[f"d{d}-dv{dv}" for d, dv in PAIRS])
def test_dense(path, d, dv, causal, dtype):
    """GQA (4 query heads on 2 kv heads), Nq != Nk, odd lengths."""
    _dense(f"dv-dense-{path}-d{d}-dv{dv}-{causal}-{NAMES[dtype]}", 2, 4, 2, 37, 53, d, dv, dtype, causal=causal)


# past 256 (the 512 configs, chosen by the wider of the two): a wide K with a
# narrower V, a narrower K with V of 512
WIDE_PAIRS = [(512, 256), (320, 512)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=lambda t: NAMES[t])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d,dv", WIDE_PAIRS, ids=[f"d{d}-dv{dv}" for d, dv in WIDE_PAIRS])
def test_dense_head_dims_above_256(path, d, dv, causal, dtype):
    """GQA, Nq < Nk, odd lengths."""
    _dense(f"dv-wide-{path}-d{d}-dv{dv}-{causal}-{NAMES[dtype]}", 1, 4, 2, 33, 70, d, dv, dtype, causal=causal)


@pytest.mark.parametrize("d,dv", WIDE_PAIRS, ids=[f"d{d}-dv{dv}" for d, dv in WIDE_PAIRS])
def test_head_dims_above_256_bf16_and_atomic(path, d, dv):
    """bf16, Nq > Nk causal (rows that see no key), and the atomic backward (dQ's accumulator D wide)."""
    _dense(f"dv-wide-bf16-{path}-d{d}-dv{dv}", 1, 2, 1, 70, 33, d, dv, torch.bfloat16, causal=True)
    _dense(f"dv-wide-atomic-{path}-d{d}-dv{dv}", 1, 4, 2, 33, 70, d, dv, torch.float32, deterministic=False)


@pytest.mark.parametrize("d,dv", [(64, 32), (40, 24)], ids=["d64-dv32", "d40-dv24"])
def test_fully_masked_rows(path, d, dv):
    """Causal with Nq > Nk: the first Nq - Nk rows see no key (out 0, lse -inf)."""
    _dense(f"dv-empty-{path}-d{d}-dv{dv}", 1, 2, 2, 45, 20, d, dv, torch.float32, causal=True)


def test_bf16(path):
    _dense(f"dv-bf16-{path}", 1, 4, 1, 33, 50, 192, 128, torch.bfloat16, causal=True)


def test_atomic_backward(path):
    """The backward that adds dQ with atomics (dQ's accumulator is D wide)."""
    _dense(f"dv-atomic-{path}", 1, 4, 2, 40, 40, 64, 32, torch.float32, deterministic=False, causal=True)


def test_window(path):
    _dense(f"dv-window-{path}", 1, 2, 1, 70, 70, 32, 64, torch.float16, window=(17, 5))


def test_block_sparse(path):
    layout = torch.tensor([[True, False], [True, True]], device=DEVICE)[None, None]
    _dense(f"dv-sparse-{path}", 1, 2, 2, 150, 150, 64, 32, torch.float16, block_mask=layout)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d,dv", [(64, 32), (32, 64)], ids=["d64-dv32", "d32-dv64"])
def test_varlen(path, d, dv, causal):
    case_id = f"dv-varlen-{path}-d{d}-dv{dv}-{causal}"
    seed_case(case_id)
    lens_q, lens_k = [5, 0, 33, 17], [9, 4, 20, 31]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    tq, tk, hq, hkv = sum(lens_q), sum(lens_k), 4, 2
    dtype = torch.float16
    q = torch.randn(tq, hq, d, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(tk, hkv, d, device=DEVICE).to(dtype).requires_grad_()
    v = torch.randn(tk, hkv, dv, device=DEVICE).to(dtype).requires_grad_()
    do = torch.randn(tq, hq, dv, device=DEVICE).to(dtype)
    dlse = torch.randn(hq, tq, device=DEVICE)

    def mine(qq, kk, vv):
        return tileattn.attention_varlen(qq, kk, vv, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         return_lse=True)

    def ref(qq, kk, vv):
        return standard_attention_varlen(qq, kk, vv, cu_q, cu_k, causal=causal, return_lse=True)
    _check(case_id, mine, ref, q, k, v, do, dlse, dtype)


def _sinks_dense(case_id, b, hq, hkv, nq, nk, d, dv, dtype, deterministic=None, **kw):
    """``_dense`` with attention sinks: their gradient sums p_sink * (rowsum(dO o O) - dlse) over rows
    of the output's width Dv."""
    q, k, v, do, dlse = _inputs(case_id, b, hq, hkv, nq, nk, d, dv, dtype)
    sinks = torch.randn(hq, device=DEVICE).requires_grad_()

    def run(fn, leaves, do, dlse):
        out, lse = fn(*leaves)
        return (out, lse) + torch.autograd.grad(output_loss(out, lse, do, dlse), leaves)

    def mine(qq, kk, vv, ss):
        return tileattn.attention(qq, kk, vv, sinks=ss, return_lse=True, deterministic=deterministic, **kw)

    def ref(qq, kk, vv, ss):
        return standard_attention(qq, kk, vv, sinks=ss, return_lse=True, **kw)
    leaves = (q, k, v, sinks)
    got = run(mine, leaves, do, dlse)
    lowp = run(ref, leaves, do, dlse)
    ref64 = run(ref, [t.detach().double().requires_grad_() for t in leaves], do.double(), dlse)
    assert got[0].shape == (b, hq, nq, dv) and got[0].dtype == dtype
    for name, g, r64, rlp in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), got, ref64, lowp):
        check_accuracy(f"{case_id} {name}", g, r64, rlp, dtype)
    return got


SINK_PAIRS = [(64, 32), (32, 64), (192, 128)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d,dv", SINK_PAIRS, ids=[f"d{d}-dv{dv}" for d, dv in SINK_PAIRS])
def test_sinks(path, d, dv, causal):
    """Sinks with Dv != D: GQA, Nq != Nk, odd lengths, fp16."""
    _sinks_dense(f"dv-sinks-{path}-d{d}-dv{dv}-{causal}", 2, 4, 2, 37, 53, d, dv, torch.float16, causal=causal)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda t: NAMES[t])
def test_sinks_dtypes(path, dtype):
    _sinks_dense(f"dv-sinks-{path}-{NAMES[dtype]}", 1, 4, 1, 33, 50, 64, 24, dtype, causal=True)


def test_sinks_rows_that_see_nothing(path):
    """Causal with Nq > Nk and Dv != D: the blind rows return Dv zeros and lse = sink."""
    out, lse = _sinks_dense(f"dv-sinks-empty-{path}", 1, 2, 2, 45, 20, 40, 24, torch.float32, causal=True)[:2]
    blind = 45 - 20
    assert out.shape[-1] == 24 and torch.equal(out[:, :, :blind], torch.zeros_like(out[:, :, :blind]))
    assert torch.isfinite(lse).all()


def test_sinks_atomic_backward(path):
    """The dK/dV kernel that adds dQ with atomics also gathers the sinks' sum over Dv-wide dP tiles."""
    _sinks_dense(f"dv-sinks-atomic-{path}", 1, 4, 2, 40, 70, 64, 32, torch.float32, deterministic=False,
                 causal=True)


def test_sinks_with_window(path):
    _sinks_dense(f"dv-sinks-window-{path}", 1, 2, 1, 70, 70, 32, 64, torch.float16, window=(17, 5))


def test_sinks_varlen(path):
    case_id = f"dv-sinks-varlen-{path}"
    seed_case(case_id)
    lens_q, lens_k = [5, 0, 33, 17], [9, 4, 20, 1]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    tq, tk, hq, hkv, d, dv = sum(lens_q), sum(lens_k), 4, 2, 48, 16
    dtype = torch.float16
    q = torch.randn(tq, hq, d, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(tk, hkv, d, device=DEVICE).to(dtype).requires_grad_()
    v = torch.randn(tk, hkv, dv, device=DEVICE).to(dtype).requires_grad_()
    sinks = torch.randn(hq, device=DEVICE).requires_grad_()
    do = torch.randn(tq, hq, dv, device=DEVICE).to(dtype)

    def run(fn, leaves):
        out = fn(*leaves)
        return (out,) + torch.autograd.grad((out.to(do.dtype) * do).sum(), leaves)

    def mine(qq, kk, vv, ss):
        return tileattn.attention_varlen(qq, kk, vv, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, sinks=ss)

    def ref(qq, kk, vv, ss):
        return standard_attention_varlen(qq, kk, vv, cu_q, cu_k, causal=True, sinks=ss)
    leaves = (q, k, v, sinks)
    got, lowp = run(mine, leaves), run(ref, leaves)
    ref64 = run(ref, [t.detach().double().requires_grad_() for t in leaves])
    assert got[0].shape == (tq, hq, dv)
    for name, g, r64, rlp in zip(("out", "dq", "dk", "dv", "dsinks"), got, ref64, lowp):
        check_accuracy(f"{case_id} {name}", g, r64, rlp, dtype)


def test_custom_ops_with_sinks_pass_opcheck(kernels):
    """The dense ops' fake kernels give the output v's head dim, with sinks too."""
    seed_case("dv-sinks-opcheck")
    q, k = (torch.randn(1, 2, 40, 32, device=DEVICE) for _ in range(2))
    v = torch.randn(1, 2, 40, 16, device=DEVICE)
    sinks = torch.randn(2, device=DEVICE)
    torch.library.opcheck(torch.ops.tileattn.attention_fwd.default,
                          (q, k, v, True, 0.25, -1, -1, 0.0, None, None, True, sinks))
    out, lse, _ = torch.ops.tileattn.attention_fwd(q, k, v, True, 0.25, -1, -1, 0.0, None, None, True, sinks)
    assert out.shape == (1, 2, 40, 16)
    torch.library.opcheck(torch.ops.tileattn.attention_bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, None, True, 0.25, -1, -1, 0.0, None, None,
                           True, sinks))


def test_sdpa_drop_in(path):
    """torch's SDPA takes Dv != D (with enable_gqa); so does the drop-in, with torch's result."""
    seed_case(f"dv-sdpa-{path}")
    q = torch.randn(2, 4, 9, 48, device=DEVICE)
    k = torch.randn(2, 2, 13, 48, device=DEVICE)
    v = torch.randn(2, 2, 13, 24, device=DEVICE)
    for causal in (False, True):
        got = tileattn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        assert got.shape == (2, 4, 9, 24)
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dv", [0, 513], ids=["dv0", "dv513"])
def test_bad_v_head_dim(dv):
    q = torch.randn(1, 2, 8, 32, device=DEVICE)
    k = torch.randn(1, 2, 8, 32, device=DEVICE)
    v = torch.randn(1, 2, 8, dv, device=DEVICE)
    with mock.patch("tileattn.launch.attn_fwd", forbidden()), mock.patch("tileattn.cpu.attention_fwd", forbidden()):
        with pytest.raises(ValueError, match=r"last dimension of v\)"):
            tileattn.attention(q, k, v)
        with pytest.raises(ValueError, match=r"last dimension of v\)"):
            cu = cu_seqlens([8])
            tileattn.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu,
                                      8, 8)


def test_kvcache_refuses_v_new_of_another_width_than_v_cache():
    """Decoding takes a V head dim of its own (tests/decode/test_decode_head_dim_v.py),
    but v_new must match v_cache's: a ValueError naming v_new, raised before
    either cache is written."""
    q = torch.randn(1, 2, 1, 32, device=DEVICE)
    k_cache = torch.zeros(1, 2, 16, 32, device=DEVICE)
    v_cache = torch.zeros(1, 2, 16, 16, device=DEVICE)
    k_new = torch.randn(1, 2, 1, 32, device=DEVICE)
    v_new = torch.randn(1, 2, 1, 24, device=DEVICE)
    seqlens = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="v_new's head dim"):
        tileattn.attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new=k_new, v_new=v_new)
    assert not k_cache.any() and not v_cache.any()


class _CudaTensorShape:
    """What the Hopper eligibility rules read of a tensor (shape, dtype,
    device, strides, address), as if it lived on a CUDA device: the rules
    can then be run on a machine without one."""

    is_cuda = True

    def __init__(self, *shape, dtype=torch.bfloat16):
        self._t = torch.empty(shape, dtype=dtype, device="meta")
        self.shape, self.dtype, self.device = self._t.shape, dtype, torch.device("cuda", 0)

    def stride(self, *dim):
        return self._t.stride(*dim)

    def dim(self):
        return self._t.dim()

    def element_size(self):
        return self._t.element_size()

    def data_ptr(self):
        return 0


@pytest.mark.parametrize("d,dv", [(128, 64), (64, 128), (128, 256), (192, 128)],
                         ids=["d128-dv64", "d64-dv128", "d128-dv256", "d192-dv128"])
def test_hopper_kernels_and_separate_v_head_dim(d, dv):
    """On a (pretended) compute capability 9.0 device: the same call with v
    as wide as q is eligible for both Hopper kernels where they have that
    head dim; with Dv != D both are eligible only for a (D, Dv) pair they
    have a config for (192/128), so the portable kernels run the rest and
    the default backward there is the deterministic one."""
    q, k = _CudaTensorShape(1, 2, 4096, d), _CudaTensorShape(1, 2, 4096, d)
    same, other = _CudaTensorShape(1, 2, 4096, d), _CudaTensorShape(1, 2, 4096, dv)
    do_same, do_other = _CudaTensorShape(1, 2, 4096, d), _CudaTensorShape(1, 2, 4096, dv)
    with mock.patch.object(dispatch, "_hopper_device", return_value=True), \
            mock.patch.object(dispatch, "interpreter_active", return_value=False), \
            mock.patch.object(dispatch, "HOPPER_FWD", True), mock.patch.object(dispatch, "HOPPER_BWD", True), \
            mock.patch.dict("os.environ", {"TILEATTN_HOPPER_FWD": "1", "TILEATTN_HOPPER_BWD": "1"}):
        has_same = d in (64, 128)   # both Hopper kernels have these head dims (and no other here)
        assert dispatch.hopper_fwd_eligible(q, k, same) is has_same
        assert dispatch.hopper_bwd_eligible(q, k, same, do_same) is has_same
        assert dispatch.hopper_fwd_eligible(q, k, other) is ((d, dv) == (192, 128))
        wide = (d, dv) == (192, 128)
        assert dispatch.hopper_bwd_eligible(q, k, other, do_other) is wide
        assert not dispatch.hopper_bwd_eligible(q, k, other, do_other, sinks=True)   # the wide kernel has none
        assert dispatch.default_deterministic(q, k, same, True) is (not has_same)
        assert dispatch.default_deterministic(q, k, other, True) is (not wide)


@pytest.mark.parametrize("d,dv", [(256, 256), (512, 512), (512, 256)], ids=["d256", "d512", "d512-dv256"])
def test_hopper_kernels_above_128(d, dv):
    """On a (pretended) compute capability 9.0 device: the Hopper forward and
    backward have configs for 256 (the backward's split kernel; without the
    forward's remainder, no calls with sinks), none for 512, so the portable
    kernels run the rest (with their 512 configs) and the default backward
    there is the deterministic one."""
    q, k, v, do = (_CudaTensorShape(1, 2, 4096, w) for w in (d, d, dv, dv))
    with mock.patch.object(dispatch, "_hopper_device", return_value=True), \
            mock.patch.object(dispatch, "interpreter_active", return_value=False), \
            mock.patch.object(dispatch, "HOPPER_FWD", True), mock.patch.object(dispatch, "HOPPER_BWD", True), \
            mock.patch.dict("os.environ", {"TILEATTN_HOPPER_FWD": "1", "TILEATTN_HOPPER_BWD": "1"}):
        hopper = (d, dv) == (256, 256)
        assert dispatch.hopper_fwd_eligible(q, k, v) is hopper
        assert dispatch.hopper_bwd_eligible(q, k, v, do) is hopper
        assert not dispatch.hopper_bwd_eligible(q, k, v, do, sinks=True)   # the split kernel sums no dS
        assert dispatch.default_deterministic(q, k, v, True) is (not hopper)


def test_cost_model_flops():
    """FLOPs with a V head dim: forward 2 B H pairs (D + Dv), backward 2 B H pairs (3 D + 2 Dv);
    the default (Dv = D) keeps the 4 B H pairs D of before."""
    from tileattn.cost.flops import attention_flops, flop_breakdown
    from tileattn.cost.shape import AttentionShape
    b, h, nq, nk, d, dv = 2, 3, 100, 120, 192, 128
    pairs = nq * nk
    assert attention_flops(b, h, nq, nk, d, head_dim_v=dv) == 2.0 * b * h * pairs * (d + dv)
    assert attention_flops(b, h, nq, nk, d, head_dim_v=dv, mode="bwd") == 2.0 * b * h * pairs * (3 * d + 2 * dv)
    assert attention_flops(b, h, nq, nk, d, mode="fwd_bwd") == 3.5 * 4.0 * b * h * pairs * d
    assert attention_flops(b, h, nq, nk, d, head_dim_v=d) == attention_flops(b, h, nq, nk, d)
    same = flop_breakdown(AttentionShape(b, h, nq, d, nk))
    assert same == flop_breakdown(AttentionShape(b, h, nq, d, nk, head_dim_v=d))
    narrow = flop_breakdown(AttentionShape(b, h, nq, d, nk, head_dim_v=dv))
    assert narrow.useful_fwd == attention_flops(b, h, nq, nk, d, head_dim_v=dv)
    assert narrow.tiled_bwd_executed < same.tiled_bwd_executed
    with pytest.raises(ValueError, match="head_dim_v"):
        AttentionShape(b, h, nq, d, head_dim_v=513)
    assert AttentionShape(b, h, nq, 320, head_dim_v=512).head_dim_v == 512


def test_config_tables_by_the_wider_head_dim():
    from tileattn import configs
    assert configs.candidates("fwd", 64, 256) == configs.candidates("fwd", 256)
    assert configs.candidates("dkdv", 320, 512) == configs.candidates("dkdv", 512)
    assert configs.candidates("dq", 512, 64) == configs.candidates("dq", 512) != configs.candidates("dq", 256)
    assert configs.candidates("dkdv", 192, 128) == configs.candidates("dkdv", 256)
    assert configs.candidates("dq", 64) == configs.candidates("dq", 64, 64)
    for est in configs.SMEM_ESTIMATORS.values():
        assert est(64, 64, 128, 2, 2) == est(64, 64, 128, 2, 2, 128)
        assert est(64, 64, 128, 2, 2, 64) < est(64, 64, 128, 2, 2) < est(64, 64, 128, 2, 2, 256)
