"""The stream-K tail of the persistent Hopper forward (launch/stream_k.py,
kernels/stream_k.py).

Everywhere (the combine is a Triton kernel; on the CPU it runs under the
interpreter): the walk gives every tail key tile to exactly one program in
even shares, and the combine merges pieces built from a float64 softmax into
out / lse (with sinks and the remainder's code) for exactly the tail units
that were cut, leaving every other unit to the kernel.  The Gluon kernel's
own pieces run on a GPU (tests/attention/test_hopper_fwd.py: the forced
``-sk`` configs and :func:`test_stream_k_tails_on_the_gpu` here).
"""
import math

import pytest
import torch

from tileattn.configs import HopperFwdConfig
from tileattn.launch import stream_k
from tileattn.sinks import decode_remainder, remainder_like
from tileattn.testing import DEVICE

SK = HopperFwdConfig(persistent=True, stream_k=True)
LOG2E = 1.0 / math.log(2.0)

# name -> (units, programs, key tiles a unit)
WALKS = {
    "short-tail": (268, 132, 8),        # a partial wave of 4 units
    "long-tail": (263, 132, 2),         # a partial wave of 131 units of 2 tiles
    "fa2-d128": (2048, 132, 16),        # the FA2 protocol's d = 128 walk at 2k
    "fa2-d64": (4096, 132, 64),         # d = 64 at 8k
    "odd": (19, 7, 5),
}


@pytest.mark.parametrize("walk", list(WALKS))
def test_tail_tiles_go_to_one_program_each_in_even_shares(walk):
    units, programs, key_tiles = WALKS[walk]
    whole, n_tail, sk_tiles = stream_k.tail(SK, False, units, programs, key_tiles)
    assert whole == programs * (units // programs - 1) and n_tail == units - whole and sk_tiles == n_tail * key_tiles
    seen = torch.zeros(sk_tiles, dtype=torch.int64)
    per_program = torch.zeros(programs, dtype=torch.int64)
    slots = []
    for p, k, i, j0, n, slot in stream_k.pieces(programs, whole, sk_tiles, key_tiles):
        assert 0 <= i < n_tail and 0 <= j0 and n >= 1 and j0 + n <= key_tiles and k in (0, 1, 2)
        seen[i * key_tiles + j0: i * key_tiles + j0 + n] += 1
        per_program[p] += n
        assert (slot == -1) == (n == key_tiles) and slot in (-1, 3 * p + k)
        slots += [slot] if slot >= 0 else []
    assert bool((seen == 1).all()), "a tail key tile run by no program or by two"
    assert int(per_program.max()) - int(per_program.min()) <= 1, "uneven shares"
    assert len(slots) == len(set(slots))
    per_unit = torch.zeros(n_tail, dtype=torch.int64)
    for p, k, i, j0, n, slot in stream_k.pieces(programs, whole, sk_tiles, key_tiles):
        per_unit[i] += 1
    assert int(per_unit.max()) <= 2, "a unit cut into more than two pieces"


def test_no_tail_where_the_walk_has_no_partial_wave():
    assert stream_k.tail(SK, False, 264, 132, 8) is None                       # a multiple of the programs
    assert stream_k.tail(SK, False, 100, 132, 8) is None                       # no whole wave
    assert stream_k.tail(SK, False, 268, 132, 1) is None                       # one key tile a unit
    assert stream_k.tail(SK, True, 268, 132, 8) is None                        # causal
    assert stream_k.tail(HopperFwdConfig(persistent=True), False, 268, 132, 8) is None   # not asked for


def _reference(q, k, v, scale, sinks):
    """float64 out (B, H, N, Dv) and lse (B, H, N), the sink as one more logit."""
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if sinks is not None:
        s = torch.cat([s, sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])[..., :k.shape[2]]
    return torch.einsum("bhqk,bhkd->bhqd", p, v.double()), lse


def _fill_pieces(q, k, v, scale, walk, block_m, block_n, ws_o, ws_ml):
    """Each cut piece's partial softmax, float32, as the kernel stores it."""
    b, h, n_q, _ = q.shape
    n_m_tiles = -(-n_q // (2 * block_m))
    programs, whole, sk_tiles, key_tiles = walk
    dv = v.shape[-1]
    for p, kk, i, j0, n, slot in stream_k.pieces(programs, whole, sk_tiles, key_tiles):
        if slot < 0:
            continue
        unit = whole + i
        bh, k_m = divmod(unit, n_m_tiles)
        mt = n_m_tiles - 1 - k_m   # a head's query tiles are walked last first
        bb, hh = divmod(bh, h)
        keys = slice(j0 * block_n, min((j0 + n) * block_n, k.shape[2]))
        for wg in range(2):
            r0 = mt * 2 * block_m + wg * block_m
            rows = q.new_zeros(block_m, q.shape[-1], dtype=torch.float64)
            real = q[bb, hh, r0:r0 + block_m].double()
            rows[:real.shape[0]] = real   # rows past N read as zeros, as the copy engine gives them
            s2 = rows @ k[bb, hh, keys].double().T * scale * LOG2E
            m = s2.max(dim=1).values
            e = torch.exp2(s2 - m[:, None])
            cell = (2 * slot + wg)
            ws_o[cell * block_m * dv:(cell + 1) * block_m * dv] = (e @ v[bb, hh, keys].double()).float().reshape(-1)
            ws_ml[cell * 2 * block_m:cell * 2 * block_m + block_m] = m.float()
            ws_ml[cell * 2 * block_m + block_m:(cell + 1) * 2 * block_m] = e.sum(dim=1).float()


@pytest.mark.parametrize("with_sinks", [False, True], ids=["plain", "sinks"])
@pytest.mark.parametrize("shape", [(1, 7, 32, 32, 2, 4), (2, 3, 70, 75, 5, 7), (1, 5, 50, 90, 6, 4)],
                         ids=["whole-pieces", "odd", "short-tail"])
def test_combine_merges_the_cut_units_only(shape, with_sinks):
    """Pieces from a float64 softmax, merged by the combine kernel: the cut
    tail units' out (fp16), its remainder's code and lse match the float64
    reference; every unit the kernel itself ends (whole units, a tail unit
    one program ran whole) keeps the poison."""
    b, h, n_q, n_k, key_tiles, programs = shape
    block_m, block_n, d, dv = 16, -(-n_k // shape[4]), 16, 32
    assert -(-n_k // block_n) == key_tiles
    g = torch.Generator().manual_seed(11)
    q, k = (torch.randn(b, h, n, d, generator=g).to(DEVICE) for n in (n_q, n_k))
    v = torch.randn(b, h, n_k, dv, generator=g).to(DEVICE)
    sinks = torch.linspace(-2.0, 3.0, h).to(DEVICE) if with_sinks else None
    scale = d ** -0.5
    n_m_tiles = -(-n_q // (2 * block_m))
    tail = stream_k.tail(SK, False, b * h * n_m_tiles, programs, key_tiles)
    whole, n_tail, sk_tiles = tail
    ws = stream_k.workspace(programs, block_m, dv, DEVICE)
    ws["ws_o"].fill_(float("nan"))
    ws["ws_ml"].fill_(float("nan"))
    _fill_pieces(q, k, v, scale, (programs, whole, sk_tiles, key_tiles), block_m, block_n, ws["ws_o"], ws["ws_ml"])
    o = torch.full((b, h, n_q, dv), float("nan"), dtype=torch.float16, device=DEVICE)
    o_lo = remainder_like(o).fill_(-128)
    lse = torch.full((b, h, n_q), float("nan"), device=DEVICE)
    stream_k.combine(o, o_lo, lse, sinks, ws["ws_o"], ws["ws_ml"], n_m_tiles, h, tail, programs, key_tiles, block_m)

    ref, ref_lse = _reference(q, k, v, scale, sinks)
    cut = {whole + i for p, kk, i, j0, n, slot in stream_k.pieces(programs, whole, sk_tiles, key_tiles) if slot >= 0}
    cut -= {whole + i for p, kk, i, j0, n, slot in stream_k.pieces(programs, whole, sk_tiles, key_tiles) if slot < 0}
    assert cut, "the case cuts no unit"
    for unit in range(b * h * n_m_tiles):
        bh, k_m = divmod(unit, n_m_tiles)
        mt = n_m_tiles - 1 - k_m
        bb, hh = divmod(bh, h)
        rows = slice(mt * 2 * block_m, (mt + 1) * 2 * block_m)
        if unit in cut:
            torch.testing.assert_close(o[bb, hh, rows].double(), ref[bb, hh, rows].to(torch.float16).double(),
                                       atol=2e-3, rtol=2e-3)
            torch.testing.assert_close(lse[bb, hh, rows].double(), ref_lse[bb, hh, rows], atol=1e-5, rtol=1e-5)
            fine = decode_remainder(o[bb, hh, rows], o_lo[bb, hh, rows]).double()
            err, err16 = (fine - ref[bb, hh, rows]).abs().max(), (o[bb, hh, rows].double() - ref[bb, hh, rows]).abs().max()
            assert err < 0.05 * err16 + 1e-6, f"unit {unit}: out + remainder {err:.2e}, out alone {err16:.2e}"
        else:
            assert torch.isnan(o[bb, hh, rows].float()).all() and torch.isnan(lse[bb, hh, rows]).all(), \
                f"the combine wrote unit {unit}, which the kernel ends"
            assert bool((o_lo[bb, hh, rows] == -128).all())
