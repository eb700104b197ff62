"""Sliding window, softcap, ALiBi and block-sparse layouts on dense batches,
on the Triton kernels, the pointer path and the pure-PyTorch tiled path,
against a float64 reference built from ``standard_attention`` with explicit
masks and biases (the builders of ``tileattn.reference``), under the accuracy
rule of ``tileattn.testing``; the kernels' block lists; the custom ops and
``torch.compile`` with every variant, packed sequences included."""
import pytest
import torch

import tileattn
from tileattn import launch, reference
from tileattn.block_mask import (block_mask_from_fn, cached_kernel_block_lists, clear_block_list_cache,
                                 kernel_block_lists)
from tileattn.reference import block_mask_dense, causal_mask, standard_attention, window_mask
from tileattn.testing import (VariantCase, assert_compiled_matches, assert_variant_case, cu_seqlens, output_loss,
                              variant_inputs)

from conftest import DEVICE

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


# ---------------------------------------------------------------------------
# dense batches: window, softcap, ALiBi, block-sparse
# ---------------------------------------------------------------------------
# Interpreter tiles are 32 x 32: lengths of a few tiles cover the masked edge
# stages, the unmasked interior and the skipped tiles; block layouts need
# more than one 128 x 128 block.  The cases named here also run on the
# pointer path (test_pointer_path_variants).  Packed sequences: test_varlen.py;
# bad input: test_variant_errors.py.
CAUSAL_LEFT_WINDOW = VariantCase(2, 2, 2, 100, 80, 32, BF16, causal=True, window=(40, -1))
EVERY_VARIANT = VariantCase(2, 2, 2, 90, 60, 32, F16, alibi="h", causal=True, window=(30, -1), softcap=4.0)
CAUSAL_BLOCKS = VariantCase(1, 2, 2, 260, 260, 16, BF16, blocks="rand-BH", block_density=0.6, causal=True)

WINDOW_CASES = [
    VariantCase(1, 4, 2, 100, 100, 32, F16, window=(16, 16)),
    VariantCase(1, 2, 1, 100, 100, 40, BF16, window=(0, 0)),                # only the diagonal
    VariantCase(1, 2, 2, 67, 101, 32, F32, window=(0, -1)),                 # keys at/after the diagonal
    VariantCase(1, 2, 2, 101, 67, 32, F16, window=(-1, 0)),                 # causal written as a window
    VariantCase(1, 2, 1, 77, 90, 64, F16, window=(1000, 1000)),             # wider than N: dense
    CAUSAL_LEFT_WINDOW,                                                     # causal + left window
    VariantCase(1, 4, 2, 80, 100, 32, F16, causal=True, window=(7, 9)),     # causal wins on the right
    VariantCase(1, 2, 2, 100, 40, 16, F32, causal=True, window=(0, 0)),     # Nq > Nk: empty rows
    VariantCase(1, 2, 2, 1, 100, 32, F16, window=(20, 3)),                  # one query
    VariantCase(1, 2, 2, 40, 1, 32, F16, window=(2, 2)),                    # one key
]

SOFTCAP_ALIBI_CASES = [
    VariantCase(1, 4, 2, 83, 96, 32, F16, softcap=5.0),
    VariantCase(1, 2, 2, 80, 80, 64, F32, softcap=2.0, causal=True),
    VariantCase(1, 2, 1, 90, 70, 48, BF16, softcap=30.0, window=(20, 5)),
    VariantCase(1, 4, 2, 83, 96, 32, F16, alibi="h"),
    VariantCase(2, 2, 1, 70, 70, 32, F32, alibi="bh", causal=True),
    VariantCase(1, 2, 2, 50, 100, 64, BF16, alibi="bh"),
    EVERY_VARIANT,
]

BLOCK_CASES = [
    VariantCase(1, 2, 1, 260, 200, 16, F16, blocks="rand-1H"),
    VariantCase(2, 1, 1, 200, 260, 16, F32, blocks="rand-B1", block_density=0.4),
    CAUSAL_BLOCKS,
    VariantCase(1, 2, 1, 200, 230, 32, F16, blocks="rand-1H", block_density=0.7, window=(100, 20)),
    VariantCase(1, 1, 1, 260, 260, 16, F16, blocks="band", causal=True, window=(150, -1)),
    VariantCase(1, 2, 2, 200, 200, 16, F32, blocks="rand-1H", block_density=0.6, alibi="h", softcap=3.0),
]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: c.id)
def test_window(case, path):
    assert_variant_case(case)


@pytest.mark.parametrize("case", SOFTCAP_ALIBI_CASES, ids=lambda c: c.id)
def test_softcap_alibi(case, path):
    assert_variant_case(case)


@pytest.mark.parametrize("case", BLOCK_CASES, ids=lambda c: c.id)
def test_block_sparse(case, path):
    assert_variant_case(case)


def test_block_sparse_all_off_rows(path):
    """A query block row with every block off: output 0, lse -inf, no NaN."""
    c = VariantCase(1, 1, 1, 200, 260, 16, F16)
    q, k, v, do, dlse, _, _ = variant_inputs(c)
    layout = torch.ones(1, 1, 2, 3, dtype=torch.bool, device=DEVICE)
    layout[0, 0, 1] = False                      # rows 128..199 see nothing
    out, lse = tileattn.attention(q, k, v, block_mask=layout, return_lse=True)
    grads = torch.autograd.grad(output_loss(out, lse, do, dlse), (q, k, v))
    assert torch.equal(out[:, :, 128:].float(), torch.zeros_like(out[:, :, 128:].float()))
    assert torch.isneginf(lse[:, :, 128:]).all() and torch.isfinite(lse[:, :, :128]).all()
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[0][:, :, 128:].float(), torch.zeros_like(grads[0][:, :, 128:].float()))


def test_block_sparse_off_keys_never_read(path):
    """Keys and values of a block column that is off for every query are
    never read: NaN there leaves every output and gradient finite."""
    c = VariantCase(1, 2, 1, 150, 300, 16, F32)
    q, k, v, do, dlse, _, _ = variant_inputs(c)
    layout = torch.rand(1, 2, 2, 3, device=DEVICE) < 0.7
    layout[..., 0] = True
    layout[..., 1] = False                       # keys 128..255: never visible
    with torch.no_grad():
        k[:, :, 128:256] = float("nan")
        v[:, :, 128:256] = float("nan")
    out, lse = tileattn.attention(q, k, v, block_mask=layout, return_lse=True)
    dq, dk, dv = torch.autograd.grad(output_loss(out, lse, do, dlse), (q, k, v))
    for name, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert not torch.isnan(t).any(), f"{name} has NaN: a block that is off was read"
    assert torch.equal(dk[:, :, 128:256], torch.zeros_like(dk[:, :, 128:256]))
    clean = tuple(t.detach().clone() for t in (q, k, v))
    for t in clean[1:]:
        t[:, :, 128:256] = 0.0
    ref = standard_attention(*(t.double() for t in clean), mask=block_mask_dense(layout, c.nq, c.nk))
    assert (out.double() - ref).abs().max() < 1e-5


def test_block_sparse_off_queries_never_read(kernels):
    """The dK/dV kernel consults the layout too: NaN in the queries and output
    gradients of a block row that is off everywhere stays out of dK and dV."""
    c = VariantCase(1, 1, 1, 300, 150, 16, F32)
    q, k, v, do, _, _, _ = variant_inputs(c)
    q, k, v = q.detach().clone(), k.detach(), v.detach()
    layout = torch.ones(1, 1, 3, 2, dtype=torch.bool, device=DEVICE)
    layout[:, :, 1] = False                      # query rows 128..255 see nothing
    q[:, :, 128:256] = float("nan")
    do[:, :, 128:256] = float("nan")
    scale = c.d ** -0.5
    out, lse = launch.attn_fwd(q, k, v, False, scale, block_mask=layout)
    assert torch.equal(out[:, :, 128:256], torch.zeros_like(out[:, :, 128:256]))
    assert torch.isneginf(lse[:, :, 128:256]).all()
    dq, dk, dv = launch.attn_bwd(do, q, k, v, out, lse, False, scale, block_mask=layout)
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert torch.equal(dq[:, :, 128:256], torch.zeros_like(dq[:, :, 128:256]))
    keep = torch.cat([torch.arange(128), torch.arange(256, 300)])
    ref = standard_attention(q[:, :, keep].double(), k.double(), v.double())
    assert (out[:, :, keep].double() - ref).abs().max() < 1e-5


def test_window_skips_keys_outside_every_window(kernels):
    """Key tiles outside every row's window are never loaded: NaN there leaves
    outputs and gradients finite (forward, dK/dV and dQ kernels)."""
    torch.manual_seed(24)
    q = torch.randn(1, 2, 40, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 2, 200, 16, device=DEVICE)
    v = torch.randn(1, 2, 200, 16, device=DEVICE)
    with torch.no_grad():
        k[:, :, :128] = float("nan")             # rows see keys [i + 150, i + 160] only
        v[:, :, :128] = float("nan")
    k.requires_grad_()
    v.requires_grad_()
    out = tileattn.attention(q, k, v, causal=True, window=(10, -1))
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    for name, t in (("out", out), ("dq", dq), ("dk", dk[:, :, 128:]), ("dv", dv[:, :, 128:])):
        assert torch.isfinite(t).all(), f"{name}: a tile outside the window was read"
    assert torch.equal(dk[:, :, :128], torch.zeros_like(dk[:, :, :128]))
    mask = causal_mask(40, 200, DEVICE) | window_mask(40, 200, (10, -1), DEVICE)
    ref = standard_attention(q.detach().double(), k.detach()[:, :, 128:].double(), v.detach()[:, :, 128:].double(),
                             mask=mask[:, 128:])
    assert (out.double() - ref).abs().max() < 1e-5


# ---------------------------------------------------------------------------
# the portable pointer path (where tensor descriptors would run)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", [CAUSAL_LEFT_WINDOW, EVERY_VARIANT, CAUSAL_BLOCKS], ids=lambda c: c.id)
def test_pointer_path_variants(case, pointer_path):
    assert_variant_case(case)


def test_block_sparse_needs_tiles_inside_blocks(kernels):
    """A forced config whose tiles straddle the layout's blocks is refused."""
    from tileattn.configs import KernelConfig
    q = torch.randn(1, 1, 300, 16, device=DEVICE)
    layout = torch.ones(1, 1, 3, 3, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match="tiles that divide"):
        launch.attn_fwd(q, q, q, False, 0.25, config=KernelConfig(32, 256, 4, 1), block_mask=layout)


# ---------------------------------------------------------------------------
# block layouts: the helper and the kernels' block lists
# ---------------------------------------------------------------------------
def test_block_mask_from_fn_matches_brute_force():
    torch.manual_seed(4)
    nq, nk, h = 300, 520, 3

    def fn(b, hh, i, j):
        return ((j <= i + 40) & (j >= i - 200 * (hh + 1))) | (j < 16)

    layout = block_mask_from_fn(fn, None, h, nq, nk, rows_per_chunk=128)
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    dense = torch.stack([fn(0, hh, i, j) for hh in range(h)])[None]
    expect = torch.zeros(1, h, 3, 5, dtype=torch.bool)
    for qb in range(3):
        for kb in range(5):
            expect[:, :, qb, kb] = dense[:, :, qb * 128:(qb + 1) * 128, kb * 128:(kb + 1) * 128].flatten(2).any(-1)
    assert torch.equal(layout.mask, expect)
    assert layout.density == pytest.approx(float(expect.float().mean()))
    assert 0 < layout.density < 1
    full = block_mask_from_fn(lambda b, hh, i, j: i >= 0, 2, None, 129, 1, device=DEVICE)
    assert full.mask.shape == (2, 1, 2, 1) and full.density == 1.0


def test_block_list_cache_reuses_and_invalidates():
    """A layout's lists are built once per (layout, shape, causal, window);
    an in-place write, another shape or another window builds them anew, and
    a freed layout leaves the cache."""
    import gc
    from tileattn import block_mask as bm
    clear_block_list_cache()
    layout = torch.rand(1, 2, 3, 2) < 0.5
    first = cached_kernel_block_lists(layout, 300, 200, causal=True)
    assert cached_kernel_block_lists(layout, 300, 200, causal=True) is first
    assert cached_kernel_block_lists(layout, 300, 200, causal=False) is not first
    assert cached_kernel_block_lists(layout, 300, 200, causal=True, window=(50, 0)) is not first
    layout[0, 0, 0, 0] = not bool(layout[0, 0, 0, 0])        # in place: the version counter moves
    second = cached_kernel_block_lists(layout, 300, 200, causal=True)
    assert second is not first
    fresh = kernel_block_lists(layout, 300, 200, causal=True)
    for a, b in zip(second, fresh):
        assert torch.equal(a, b)
    n = len(bm._LIST_CACHE)
    del layout
    gc.collect()
    assert len(bm._LIST_CACHE) < n
    clear_block_list_cache()


def test_block_list_cache_size_bound():
    from tileattn import block_mask as bm
    clear_block_list_cache()
    layouts = [torch.ones(1, 1, 1, 1, dtype=torch.bool) for _ in range(bm._LIST_CACHE_SIZE + 5)]
    for lay in layouts:
        cached_kernel_block_lists(lay, 64, 64)
    assert len(bm._LIST_CACHE) == bm._LIST_CACHE_SIZE
    clear_block_list_cache()


def test_block_sparse_layout_edited_in_place_between_calls(kernels):
    """The kernels see a layout's new contents after an in-place edit (the
    cached block lists are not reused for it)."""
    c = VariantCase(1, 1, 1, 256, 256, 16, F32)
    q, k, v, _, _, _, _ = variant_inputs(c)
    q, k, v = q.detach(), k.detach(), v.detach()
    layout = torch.ones(1, 1, 2, 2, dtype=torch.bool, device=DEVICE)
    for step in range(2):
        out = tileattn.attention(q, k, v, block_mask=layout)
        ref = standard_attention(q.double(), k.double(), v.double(), mask=block_mask_dense(layout, c.nq, c.nk))
        assert (out.double() - ref).abs().max() < 1e-5, f"step {step}"
        layout[0, 0, 1, 0] = False


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, (130, 40)), (True, (200, -1)),
                                           (False, (-1, 0)), (True, (0, 0))],
                         ids=["full", "causal", "win130_40", "causal-win200", "win-1_0", "causal-win0_0"])
@pytest.mark.parametrize("nq,nk", [(300, 300), (260, 500), (500, 260), (128, 256)], ids=lambda n: str(n))
def test_kernel_block_lists(causal, window, nq, nk):
    """Full / partial block lists against a token-level count per block."""
    torch.manual_seed(9)
    nqb, nkb = -(-nq // 128), -(-nk // 128)
    layout = torch.rand(2, 1, nqb, nkb) < 0.7
    lists = kernel_block_lists(layout, nq, nk, causal=causal, window=window)
    hidden = reference.attention_mask(nq, nk, causal=causal, window=window)
    vis = torch.ones(nq, nk, dtype=torch.bool) if hidden is None else ~hidden
    for qb in range(nqb):
        for kb in range(nkb):
            blk = vis[qb * 128:(qb + 1) * 128, kb * 128:(kb + 1) * 128]
            is_full = bool(blk.all()) and (kb + 1) * 128 <= nk
            for b in range(2):
                on = bool(layout[b, 0, qb, kb]) and bool(blk.any())
                kf = lists.kv_full_idx[b, 0, qb, :lists.kv_full_num[b, 0, qb]].tolist()
                kp = lists.kv_part_idx[b, 0, qb, :lists.kv_part_num[b, 0, qb]].tolist()
                qf = lists.q_full_idx[b, 0, kb, :lists.q_full_num[b, 0, kb]].tolist()
                qp = lists.q_part_idx[b, 0, kb, :lists.q_part_num[b, 0, kb]].tolist()
                assert (kb in kf) == (on and is_full) == (qb in qf), (b, qb, kb)
                assert (kb in kp) == (on and not is_full) == (qb in qp), (b, qb, kb)
                assert kf == sorted(kf) and kp == sorted(kp)


# ---------------------------------------------------------------------------
# custom ops and torch.compile
# ---------------------------------------------------------------------------
def test_opcheck_variants(path):
    torch.manual_seed(2)
    q = torch.randn(2, 2, 40, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 1, 50, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(2, 1, 50, 16, device=DEVICE, requires_grad=True)
    slopes = torch.rand(2, 2, device=DEVICE)
    layout = torch.tensor([True, False], device=DEVICE).reshape(1, 2, 1, 1)
    op = torch.ops.tileattn.attention_fwd.default
    torch.library.opcheck(op, (q, k, v, True, 0.2, 30, -1, 4.0, slopes, layout))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    with torch.no_grad():
        out, lse, _ = op(qd, kd, vd, False, 0.2, 20, 10, 0.0, None, layout)
    torch.library.opcheck(torch.ops.tileattn.attention_bwd.default,
                          (torch.randn_like(out), qd, kd, vd, out, lse, torch.randn_like(lse), False, 0.2, 20, 10,
                           0.0, None, layout))


def test_opcheck_varlen(path):
    torch.manual_seed(3)
    lens = (17, 0, 40)
    cu = cu_seqlens(lens)
    q = torch.randn(sum(lens), 2, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(sum(lens), 1, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(sum(lens), 1, 16, device=DEVICE, requires_grad=True)
    slopes = torch.rand(2, device=DEVICE)
    torch.library.opcheck(torch.ops.tileattn.attention_varlen_fwd.default,
                          (q, k, v, cu, cu, 40, 40, True, 0.2, 8, -1, 3.0, slopes))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    with torch.no_grad():
        out, lse = torch.ops.tileattn.attention_varlen_fwd(qd, kd, vd, cu, cu, 40, 40, True, 0.2)
    torch.library.opcheck(torch.ops.tileattn.attention_varlen_bwd.default,
                          (torch.randn_like(out), qd, kd, vd, out, lse, None, cu, cu, 40, 40, True, 0.2))


def test_compile_fullgraph_variants(path):
    torch.manual_seed(4)
    q = torch.randn(1, 2, 140, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 140, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(1, 1, 140, 16, device=DEVICE, requires_grad=True)
    lens = (30, 1, 109)
    cu = cu_seqlens(lens)
    slopes = torch.rand(2, device=DEVICE)
    layout = torch.tensor([[True, False], [True, True]], device=DEVICE)[None, None]

    def layer(q, k, v):
        out, lse = tileattn.attention(q, k, v, causal=True, window=(50, -1), softcap=5.0, alibi_slopes=slopes,
                                      block_mask=layout, return_lse=True)
        packed = tileattn.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                           cu, cu, 109, 109, causal=True, alibi_slopes=slopes)
        return (out * out).sum() + lse.sum() + (packed * packed).sum()

    # aot_eager traces the ops through their fake impls and autograd formulas
    # like the default backend, without code generation (test_custom_op.py
    # covers inductor)
    assert_compiled_matches(layer, (q, k, v), backend="aot_eager")
