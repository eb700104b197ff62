"""IO cost model: hand-computed values, scaling laws, catalogue, solver, and
the model against measured bytes."""
import json
import math

import pytest

from tileattn import configs
from tileattn.cost import (CATALOGUE, AttentionShape, attention_flops, compare, executed_pairs, feasible_tiles,
                           flop_breakdown, get_hardware, load_hardware_file, max_block_n, paper_block_sizes,
                           resident_memory, standard_traffic, tiled_traffic, visible_pairs)
from tileattn.cost.hardware import BASES, SCALAR_FIELDS, UnknownHardwareError
from tileattn.cost.io import KernelConfig, parse_config_name
from tileattn.cost import validation


# ---- FLOPs ---------------------------------------------------------------
def test_flops_hand_computed_small_case():
    # B=1, H=1, N=4, d=2: 4 * 16 pairs * 2 = 128
    assert attention_flops(1, 1, 4, 4, 2) == 128
    assert attention_flops(1, 1, 4, 4, 2, mode="bwd") == 320        # 2.5x
    assert attention_flops(1, 1, 4, 4, 2, mode="fwd_bwd") == 448    # 3.5x
    # causal N=4: 1+2+3+4 = 10 visible pairs
    assert attention_flops(1, 1, 4, 4, 2, causal=True) == 4 * 10 * 2


@pytest.mark.parametrize("nq,nk", [(1, 1), (4, 4), (5, 3), (3, 7), (128, 200), (200, 128)])
def test_visible_pairs_matches_brute_force(nq, nk):
    brute = sum(1 for i in range(nq) for j in range(nk) if j <= i + nk - nq)
    assert visible_pairs(nq, nk, True) == brute
    assert visible_pairs(nq, nk, False) == nq * nk


def test_executed_pairs_count_whole_tiles():
    # N=256, tiles 128x128, causal: the tile above the diagonal is skipped, 3 of 4 run
    assert executed_pairs(256, 256, True, 128, 128) == 3 * 128 * 128
    assert executed_pairs(256, 256, False, 128, 128) == 256 * 256
    assert executed_pairs(256, 256, True, 128, 128) >= visible_pairs(256, 256, True)


def test_flop_breakdown_terms():
    s = AttentionShape(2, 4, 512, 64)
    cfg = KernelConfig(128, 128, 4, 2)
    f = flop_breakdown(s, cfg, cfg)
    assert f.tiled_fwd_executed == f.useful_fwd == f.standard_fwd_executed
    assert f.standard_bwd_executed == pytest.approx(2.0 * f.useful_fwd)
    assert f.tiled_bwd_gradients + f.tiled_bwd_recompute == pytest.approx(f.useful_bwd)
    assert f.tiled_bwd_executed == pytest.approx(3.5 * f.useful_fwd)


# ---- bytes -----------------------------------------------------------------
def test_standard_textbook_bytes_hand_computed():
    # B=H=1, N=4, d=2, fp16: S is 32 bytes, Q/K/V/O 16 bytes
    s = AttentionShape(1, 1, 4, 2, dtype="fp16")
    t = standard_traffic(s, fusion="textbook", backward=False)
    # S = QK^T: read 32 write 32; softmax: 32 + 32; O = PV: read 32 + 16, write 16
    assert t.reads("fwd") == 32 + 32 + 48
    assert t.writes("fwd") == 32 + 32 + 16
    assert t.kernels("fwd") == 3


def test_tiled_bytes_hand_computed_without_cache():
    # B=H=1, N=256, d=64, bf16, BLOCK_M=128: Q once, K and V twice (2 query blocks)
    s = AttentionShape(1, 1, 256, 64)
    cfg = KernelConfig(128, 64, 4, 2)
    t = tiled_traffic(s, fwd_config=cfg, bwd_config=cfg, backward=False)
    row = 64 * 2
    assert t.reads("fwd") == 256 * row + 2 * 2 * 256 * row
    assert t.writes("fwd") == 256 * row + 256 * 4


def test_tiled_causal_skips_tiles():
    s = AttentionShape(1, 1, 1024, 64, causal=True)
    cfg = KernelConfig(128, 128, 4, 2)
    full = tiled_traffic(AttentionShape(1, 1, 1024, 64), fwd_config=cfg, bwd_config=cfg).bytes()
    assert tiled_traffic(s, fwd_config=cfg, bwd_config=cfg).bytes() < 0.7 * full


def test_gqa_reuse_option_divides_kv_reads():
    s = AttentionShape(1, 8, 1024, 64, kv_heads=2)
    cfg = KernelConfig(128, 64, 4, 2)
    a = tiled_traffic(s, fwd_config=cfg, bwd_config=cfg, backward=False)
    b = tiled_traffic(s, fwd_config=cfg, bwd_config=cfg, backward=False, gqa_reuse=True)
    assert b.reads() < a.reads()


def test_seed_example_256_gib():
    s = AttentionShape(batch=8, heads=32, seqlen_q=16384, head_dim=128, dtype="bf16")
    assert resident_memory(s, "standard").peak_extra_bytes == 256 * 2 ** 30
    assert resident_memory(s, "tiled").saved_for_backward_bytes == 8 * 32 * 16384 * 4


def test_bytes_saved_grow_as_n_squared_and_kv_bytes_as_n():
    hw = get_hardware("nvidia-h200")
    saved, tiled = [], []
    for n in (1024, 2048, 4096, 8192):
        c = compare(AttentionShape(1, 16, n, 64), hw)
        saved.append(c.standard_pred["fwd"].bytes - c.tiled_pred["fwd"].bytes)
        tiled.append(c.tiled_pred["fwd"].bytes)
    for a, b in zip(saved, saved[1:]):
        assert b / a == pytest.approx(4.0, rel=0.05)
    for a, b in zip(tiled, tiled[1:]):
        assert b / a == pytest.approx(2.0, rel=0.05)


def test_no_cache_tile_loads_grow_as_n_squared():
    cfg = KernelConfig(128, 64, 4, 2)
    b = [tiled_traffic(AttentionShape(1, 1, n, 64), fwd_config=cfg, backward=False).tile_reads() for n in (4096, 8192)]
    assert b[1] / b[0] == pytest.approx(4.0, rel=0.1)


# ---- hardware / roofline ----------------------------------------------------
def test_a100_ridge_about_156():
    hw = get_hardware("nvidia-a100-80gb-sxm4")
    assert hw.ridge_point("bf16") == pytest.approx(156, rel=0.03)


def test_catalogue_complete_and_sourced():
    for name in ("nvidia-a100-80gb-sxm4", "nvidia-h100-sxm", "nvidia-h200", "nvidia-rtx-4090",
                 "nvidia-rtx-3090", "amd-instinct-mi300x"):
        hw = CATALOGUE[name]
        vals = list(hw.peak_flops.values()) + [getattr(hw, f) for f in SCALAR_FIELDS if getattr(hw, f)]
        vals += list(hw.measured.values())
        for v in vals:
            assert v.source and v.basis in BASES
        assert {"bf16", "fp16", "tf32", "fp32"} <= set(hw.peak_flops)
        assert hw.smem_per_block.value <= hw.smem_per_sm.value
    h200 = CATALOGUE["nvidia-h200"]
    assert h200.value("hbm_bandwidth", "measured").basis == "measured"
    assert h200.peak("bf16", "measured") < h200.peak("bf16")


def test_unknown_hardware_lists_valid_names():
    with pytest.raises(UnknownHardwareError, match="nvidia-h200"):
        get_hardware("nvidia-b9000")


@pytest.mark.parametrize("kw,arg", [(dict(batch=-1), "batch"), (dict(head_dim=0), "head_dim"),
                                    (dict(dtype="fp64"), "dtype"), (dict(kv_heads=3), "kv_heads")])
def test_bad_shape_names_argument(kw, arg):
    base = dict(batch=1, heads=4, seqlen_q=16, head_dim=64)
    base.update(kw)
    with pytest.raises(ValueError, match=arg):
        AttentionShape(**base)


def test_user_hardware_file_toml_and_json(tmp_path):
    toml = tmp_path / "mine.toml"
    toml.write_text('name = "my-gpu"\nhbm_bandwidth = 1e12\nsmem_per_block = 65536\n'
                    '[peak_flops]\nbf16 = { value = 1e14, source = "spec sheet" }\n')
    hw = load_hardware_file(toml)
    assert hw.ridge_point("bf16") == pytest.approx(100)
    js = tmp_path / "mine.json"
    js.write_text(json.dumps(hw.as_dict()))
    assert get_hardware("my-gpu", hw_file=js).peak("bf16") == 1e14
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "hbm_bandwidth": 1, "peak_flops": {"fp7": 1}}))
    with pytest.raises(ValueError, match="fp7"):
        load_hardware_file(bad)


def test_tiled_beats_standard_and_is_compute_bound_at_long_n():
    c = compare(AttentionShape(8, 32, 16384, 128), get_hardware("nvidia-a100-80gb-sxm4"))
    assert c.standard_pred["fwd"].bound == "memory"
    assert c.tiled_pred["fwd"].bound == "compute"
    assert c.speedup("fwd") > 1


# ---- tile solver --------------------------------------------------------------
@pytest.mark.parametrize("hw", sorted(CATALOGUE))
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_solver_never_exceeds_smem(hw, backward):
    smem = CATALOGUE[hw].get_int("smem_per_block")
    for d in (64, 128, 256):
        for o in feasible_tiles(smem, d, "bf16", backward=backward, num_stages=3):
            est = configs.bwd_smem_bytes if backward else configs.fwd_smem_bytes
            assert o.smem_bytes == est(o.block_m, o.block_n, d, 2, 3) <= smem


def test_solver_agrees_with_kernel_configs_on_h200():
    smem = CATALOGUE["nvidia-h200"].get_int("smem_per_block")
    for d, cfgs in configs.FWD_CONFIGS.items():
        for c in cfgs:
            feas = {(o.block_m, o.block_n) for o in feasible_tiles(smem, d, num_stages=c.num_stages)}
            fits = configs.fwd_smem_bytes(c.block_m, c.block_n, d, 2, c.num_stages) <= smem
            assert ((c.block_m, c.block_n) in feas) == fits


def test_smem_not_theory_bounds_block_n():
    smem = CATALOGUE["nvidia-a100-80gb-sxm4"].get_int("smem_per_block")
    _, bc = paper_block_sizes(smem, 128)
    assert max_block_n(smem, 128, block_m=128, num_stages=3) < bc


def test_solver_bytes_fall_with_block_m():
    s = AttentionShape(1, 1, 4096, 64)
    opts = {(o.block_m, o.block_n): o.hbm_bytes for o in feasible_tiles(10 ** 7, 64, shape=s)}
    assert opts[(128, 64)] < opts[(64, 64)] and opts[(128, 64)] == opts[(128, 128)]


def test_parse_config_name_roundtrip():
    c = configs.FWD_CONFIGS[64][0]
    assert parse_config_name(c.name).name == c.name
    with pytest.raises(ValueError, match="config"):
        parse_config_name("big")


# ---- against measurement -------------------------------------------------------
def test_validation_logic_on_synthetic_record():
    row = {"shape_name": "tiny", "batch": 2, "heads": 4, "kv_heads": 4, "seqlen_q": 1024, "seqlen_k": 1024,
           "head_dim": 64, "causal": False, "dtype": "bf16", "impl": "standard", "mode": "fwd",
           "measured_read_bytes": 0, "measured_write_bytes": 0}
    pred = validation.predict_row(row, "nvidia-h200")
    row["measured_read_bytes"], row["measured_write_bytes"] = 0.6 * pred, 0.5 * pred
    chk = validation.check_row(row, "nvidia-h200")
    assert chk.ok and chk.ratio == pytest.approx(1.1)
    row["measured_write_bytes"] = pred
    assert not validation.check_row(row, "nvidia-h200").ok
    row["impl"] = "tiled"
    row["mode"] = "fwdbwd"
    row["configs"] = {"fwd": "M128-N64-w4-s3", "dkdv": "M64-N64-w4-s3"}
    assert validation.predict_row(row, "nvidia-h200") > 0
    assert validation.row_label(row) == "tiny-tiled-fwdbwd"


_HW, _ROWS = validation.load_rows()


@pytest.mark.parametrize("row", _ROWS, ids=[validation.row_label(r) for r in _ROWS])
def test_model_within_20_percent_of_measured_h200(row):
    chk = validation.check_row(row, _HW)
    assert chk.ok, f"{chk.label}: measured {chk.measured / 1e9:.3f} GB, model {chk.predicted / 1e9:.3f} GB"
