"""IO cost model: the hardware catalogue and user hardware files, the
driver's device names, the roofline, and the tile solver against the
kernels' shared-memory estimates and config tables, with what the model says
where no config fits."""
import json

import pytest

from tileattn import configs
from tileattn.cost import (CATALOGUE, AttentionShape, attention_flops, chosen_configs, commands, compare,
                           default_configs, feasible_tiles, flop_breakdown, get_hardware, kernel_bytes, kernel_fits,
                           load_hardware_file, max_block_n, paper_block_sizes, table_configs_check, tiled_traffic)
from tileattn.cost.format import NOT_RUNNABLE, header_lines, summary_rows
from tileattn.cost.hardware import BASES, SCALAR_FIELDS, UnknownHardwareError, catalogue_name_for_device
from tileattn.cost.io import KernelConfig, parse_config_name


# ---- hardware / roofline ----------------------------------------------------
@pytest.mark.parametrize("device,want", [
    ("NVIDIA H100 80GB HBM3", "nvidia-h100-sxm"), ("NVIDIA H200", "nvidia-h200"),
    ("NVIDIA A100-SXM4-80GB", "nvidia-a100-80gb-sxm4"), ("NVIDIA GeForce RTX 4090", "nvidia-rtx-4090"),
    ("NVIDIA GeForce RTX 3090", "nvidia-rtx-3090"), ("AMD Instinct MI300X", "amd-instinct-mi300x"),
    ("NVIDIA L4", None)], ids=["h100", "h200", "a100", "rtx4090", "rtx3090", "mi300x", "unknown"])
def test_catalogue_name_for_device(device, want):
    """The driver's device name picks the catalogue entry of that model (the
    benchmarks' and the demo's predictions), or None for a GPU it lacks."""
    assert catalogue_name_for_device(device) == want


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
@pytest.mark.parametrize("kind", ["fwd", "dkdv", "dq"])
def test_solver_never_exceeds_smem(hw, kind):
    smem = CATALOGUE[hw].get_int("smem_per_block")
    est = configs.SMEM_ESTIMATORS[kind]
    for d in (64, 128, 256, 512):
        opts = feasible_tiles(smem, d, "bf16", kind=kind, num_stages=3)
        assert all(o.kind == kind for o in opts)
        for o in opts:
            assert o.smem_bytes == est(o.block_m, o.block_n, d, 2, 3) <= smem


def test_solver_backward_flag_means_dkdv():
    smem = CATALOGUE["nvidia-h200"].get_int("smem_per_block")
    a = [(o.block_m, o.block_n) for o in feasible_tiles(smem, 128, backward=True, num_stages=3)]
    b = [(o.block_m, o.block_n) for o in feasible_tiles(smem, 128, kind="dkdv", num_stages=3)]
    assert a == b


@pytest.mark.parametrize("kind", ["fwd", "dkdv", "dq"])
def test_solver_agrees_with_kernel_configs_on_h200(kind):
    smem = CATALOGUE["nvidia-h200"].get_int("smem_per_block")
    est = configs.SMEM_ESTIMATORS[kind]
    for d, cfgs in configs.TABLES[kind].items():
        for c in cfgs:
            feas = {(o.block_m, o.block_n) for o in feasible_tiles(smem, d, kind=kind, num_stages=c.num_stages)}
            fits = est(c.block_m, c.block_n, d, 2, c.num_stages) <= smem
            assert ((c.block_m, c.block_n) in feas) == fits
    checked = [(k, c, ok) for k, c, ok in table_configs_check(smem, 128) if k == kind]
    assert [c for _, c, _ in checked] == list(configs.candidates(kind, 128))
    assert all(ok == (est(c.block_m, c.block_n, 128, 2, c.num_stages) <= smem) for _, c, ok in checked)


def test_default_configs_are_first_fitting_of_each_table():
    # measured rows ran with autotuning off: the first config of each table that fits 227 KB
    smem = 232448
    for d in (64, 128, 256, 512):
        chosen = default_configs(d, 2, smem)
        for kind in ("fwd", "dkdv", "dq"):
            want = configs.fitting(configs.candidates(kind, d), d, 2, smem, kind=kind)[0]
            assert getattr(chosen, kind) == want
            assert chosen_configs(smem, d)[kind] == want
    assert default_configs(128, 2, smem).dq == configs.DQ_CONFIGS[128][0]
    assert default_configs(128, 2, smem).dkdv == configs.DKDV_CONFIGS[128][0]


@pytest.mark.parametrize("hw", ["nvidia-h100-sxm", "nvidia-h200", "nvidia-rtx-4090", "nvidia-rtx-3090",
                                "nvidia-a100-80gb-sxm4"])
def test_solver_tiles_for_head_dim_512_fit(hw):
    """d = 512, bf16: the solver finds tiles for every kernel within the GPU's
    shared memory (227 KB on the H100/H200, 99 KB on the RTX 4090/3090, 163 KB
    on the A100), and the config each kernel runs with autotuning off is one
    of them; its HBM bytes are those of a 512-wide tile."""
    smem = CATALOGUE[hw].get_int("smem_per_block")
    assert smem == {"nvidia-h100-sxm": 227, "nvidia-h200": 227, "nvidia-a100-80gb-sxm4": 163}.get(hw, 99) * 1024
    shape = AttentionShape(1, 8, 4096, 512, causal=True)
    chosen = chosen_configs(smem, 512)
    for kind in ("fwd", "dkdv", "dq"):
        c = chosen[kind]
        est = configs.SMEM_ESTIMATORS[kind](c.block_m, c.block_n, 512, 2, c.num_stages)
        assert est <= smem, (hw, kind, c.name, est)
        opts = feasible_tiles(smem, 512, "bf16", kind=kind, num_stages=c.num_stages, shape=shape)
        assert (c.block_m, c.block_n) in {(o.block_m, o.block_n) for o in opts}
        assert all(o.smem_bytes <= smem and o.hbm_bytes > 0 for o in opts)
    if smem < 200 * 1024:   # the 227 KB tiles do not fit: the table's 99 KB ones run
        assert chosen["dq"] == configs.DQ_CONFIGS[512][1]
    else:
        assert [chosen[k] for k in ("fwd", "dkdv", "dq")] == [configs.TABLES[k][512][0] for k in ("fwd", "dkdv", "dq")]


def test_head_dim_512_traffic_and_flops():
    """d = 512 in the IO model: FLOPs 4 B H N^2 d; the standard path's Q, K, V, O
    bytes twice those at 256; the tiled forward re-reads K/V once per 64-row
    query block (the H200's first config), reads Q once and writes O and lse once."""
    s512, s256 = AttentionShape(1, 4, 2048, 512), AttentionShape(1, 4, 2048, 256)
    assert attention_flops(1, 4, 2048, 2048, 512) == 4 * 4 * 2048 ** 2 * 512
    assert flop_breakdown(s512).useful_fwd == 2 * flop_breakdown(s256).useful_fwd
    t = tiled_traffic(s512, smem_per_block=232448)
    assert t.params["fwd_config"] == "M64-N32-w8-s2"
    fwd = next(p for p in t.passes if p.kernel == "fwd")
    row = 512 * 2
    assert fwd.tile_read_bytes == 4 * (2048 * row + (2048 // 64) * 2 * 2048 * row)
    assert fwd.write_bytes == 4 * (2048 * row + 2048 * 4)
    with pytest.raises(ValueError, match="head_dim=513 exceeds 512"):
        AttentionShape(1, 4, 2048, 513)
    with pytest.raises(ValueError, match="head_dim=513 exceeds 512"):
        feasible_tiles(232448, 513)


def test_tiled_backward_uses_dq_table_and_explicit_configs():
    s = AttentionShape(1, 4, 4096, 128, causal=True)
    t = tiled_traffic(s, smem_per_block=232448)
    dkdv0, dq0 = configs.DKDV_CONFIGS[128][0].name, configs.DQ_CONFIGS[128][0].name
    assert t.params["dkdv_config"] == dkdv0 and t.params["dq_config"] == dq0
    assert [p.kernel for p in t.passes] == ["fwd", "preprocess", "dkdv", "dq"]
    small = KernelConfig(32, 32, 4, 1)
    u = tiled_traffic(s, dq_config=small, smem_per_block=232448)
    assert u.params["dq_config"] == small.name and u.params["dkdv_config"] == dkdv0
    # without L2 reuse the dQ kernel's K/V loads grow as its BLOCK_M shrinks
    dq_bytes = lambda cfg: kernel_bytes(s, "dq", cfg)  # noqa: E731
    assert dq_bytes(KernelConfig(32, 128, 8, 3)) > dq_bytes(KernelConfig(64, 128, 8, 3))
    # the dK/dV kernel's Q/dO loads fall with BLOCK_N
    assert kernel_bytes(s, "dkdv", KernelConfig(32, 64, 8, 3)) > kernel_bytes(s, "dkdv", KernelConfig(32, 128, 8, 3))


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


# ---- 6. device names ---------------------------------------------------------------
@pytest.mark.parametrize("device,want", [
    ("NVIDIA H100 80GB HBM3", "nvidia-h100-sxm"), ("NVIDIA H200", "nvidia-h200"),
    ("NVIDIA A100-SXM4-80GB", "nvidia-a100-80gb-sxm4"), ("NVIDIA GeForce RTX 4090", "nvidia-rtx-4090"),
    ("NVIDIA GeForce RTX 3090", "nvidia-rtx-3090"), ("AMD Instinct MI300X", "amd-instinct-mi300x"),
    ("nvidia h200", "nvidia-h200"),
    ("NVIDIA GH200 480GB", None), ("NVIDIA A100-SXM4-40GB", None), ("NVIDIA A100-PCIE-40GB", None),
    ("NVIDIA A100 80GB PCIe", None), ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None),
    ("NVIDIA H200 NVL", None), ("NVIDIA GeForce RTX 4090 D", None), ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
    ("NVIDIA GeForce RTX 3090 Ti", None), ("AMD Instinct MI300A", None), ("", None),
], ids=lambda x: str(x))
def test_device_name_maps_only_that_part(device, want):
    """Only the catalogue's own part maps to it: a GH200, an A100 40GB or an H100 PCIe
    has other bandwidth or SM counts and gets None (the callers fall back or skip)."""
    assert catalogue_name_for_device(device) == want


# ---- configs that do not fit: the model says so ----------------------------------
# Above d = 256 the kernels refuse a kernel none of whose configs fits
# (configs.check_fits raises ValueError); the model marks the tiled phases that
# need it "does not run" instead of printing numbers, and the report does not
# claim a fitting config.  At d <= 256 the launcher still tries the smallest
# config (the compiler decides), so the numbers stay, with a note.
FIT_SHAPE = ["--batch", "2", "--heads", "4", "--seqlen", "1024"]


@pytest.mark.parametrize("hw,dtype,need,have", [
    ("nvidia-rtx-4090", "fp32", "133,120", "101,376"),
    ("amd-instinct-mi300x", "bf16", "67,584", "65,536"),
], ids=["rtx4090-fp32", "mi300x-bf16"])
def test_backward_that_does_not_fit_is_not_runnable(hw, dtype, need, have):
    c = compare(AttentionShape(2, 4, 1024, 512, dtype=dtype), hw)
    assert c.runnable("fwd") and not c.runnable("bwd") and not c.runnable("fwd_bwd")
    assert set(c.not_runnable()) == {"dkdv", "dq"}
    smem, elem = c.hardware.get_int("smem_per_block"), 4 if dtype == "fp32" else 2
    for kind, msg in c.not_runnable().items():
        assert need in msg and have in msg
        with pytest.raises(ValueError) as refused:      # the kernels' own refusal, word for word
            configs.check_fits((kind,), 512, elem, smem, None, dtype)
        assert msg == str(refused.value)
    rows = {r[0]: r for r in summary_rows(c)}
    for q in ("HBM bytes bwd", "HBM bytes fwd+bwd", "executed FLOPs bwd", "predicted time fwd+bwd"):
        assert rows[q][2] == NOT_RUNNABLE and rows[q][3] == "-"
    assert rows["HBM bytes fwd"][2] != NOT_RUNNABLE
    notes = [line for line in header_lines(c) if "does not run" in line]
    assert len(notes) == 2 and all(need in line for line in notes)
    assert c.as_dict()["speedup"]["fwd_bwd"] is None
    assert c.as_dict()["tiled"]["runnable"] == {"fwd": True, "bwd": False, "fwd_bwd": False}


def test_io_cli_marks_the_backward(capsys):
    argv = ["io", "--hw", "nvidia-rtx-4090", *FIT_SHAPE, "--head-dim", "512", "--dtype", "fp32"]
    assert commands.main(argv) == 0
    out = capsys.readouterr().out
    assert "does not run" in out and "133,120" in out
    assert commands.main(argv + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tiled"]["kernels"]["dkdv"]["runnable"] is False and d["tiled"]["kernels"]["fwd"]["runnable"]


def test_everything_fits_on_the_h200():
    c = compare(AttentionShape(2, 4, 1024, 128), "nvidia-h200")
    assert all(f.fits and f.runnable for f in c.kernel_fit.values())
    assert not any(line.startswith("note: ") for line in header_lines(c))
    assert NOT_RUNNABLE not in {cell for r in summary_rows(c) for cell in r}


def test_small_head_dim_that_does_not_fit_keeps_numbers_with_a_note():
    """d = 128 on the RTX 4090: no forward config's estimate fits 99 KB, yet the
    launcher runs the smallest (the estimate overshoots below d = 256)."""
    s = AttentionShape(2, 4, 1024, 128)
    fits = kernel_fits(s, 101376)
    assert not fits["fwd"].fits and fits["fwd"].runnable and "compiler" in fits["fwd"].message
    c = compare(s, "nvidia-rtx-4090")
    assert c.runnable("fwd_bwd")
    assert any("forward config" in line for line in header_lines(c))


def test_report_does_not_contradict_itself(tmp_path):
    """Every config 'does not fit', so the report must not say the kernel takes one that fits."""
    from tileattn.cost.report import build_report
    c = compare(AttentionShape(1, 2, 512, 512, dtype="fp32"), "nvidia-rtx-4090")
    text = build_report(c)
    assert "takes the first config of its table that fits:" not in text
    assert "the kernels refuse this shape (ValueError)" in text
    assert "forward+backward: the tiled backward does not run on this device" in text
    assert "Not runnable here." in text
    ok = build_report(compare(AttentionShape(1, 2, 512, 64), "nvidia-h200"))
    assert "takes the first config of its table that fits:" in ok and "Not runnable here." not in ok
