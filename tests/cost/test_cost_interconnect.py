"""The interconnect term of the cost model (ring attention across GPUs)."""
import json
import shlex
from pathlib import Path

import pytest

from tileattn.cost import CATALOGUE, attention_flops, get_hardware, hardware_from_dict
from tileattn.cost import interconnect as ic
from tileattn.cost.interconnect import (RingShape, break_even_tokens, link_bandwidth, predict_ring, ring_step_bytes,
                                        ring_step_flops, step_costs, transfer_hidden)

DOC = Path(__file__).resolve().parents[2] / "docs" / "distributed.md"
H100 = get_hardware("nvidia-h100-sxm")


# ---- catalogue -----------------------------------------------------------------
@pytest.mark.parametrize("name,fabric,gpus,pcie", [
    ("nvidia-a100-80gb-sxm4", 300e9, 8, 32e9),
    ("nvidia-h100-sxm", 450e9, 8, 64e9),
    ("nvidia-h200", 450e9, 8, 64e9),
    ("nvidia-rtx-4090", None, None, 32e9),
    ("nvidia-rtx-3090", 56.25e9, 2, 32e9),
    ("amd-instinct-mi300x", 64e9, 8, 64e9),
])
def test_catalogue_links_per_direction_with_sources(name, fabric, gpus, pcie):
    hw = CATALOGUE[name]
    assert (hw.interconnect_bandwidth and hw.interconnect_bandwidth.value) == fabric
    assert (hw.interconnect_gpus and hw.interconnect_gpus.value) == gpus
    assert hw.pcie_bandwidth.value == pcie
    for v in (hw.interconnect_bandwidth, hw.interconnect_gpus, hw.pcie_bandwidth):
        assert v is None or v.source
    # a file written from the entry reads back with the same links
    again = hardware_from_dict(json.loads(json.dumps(hw.as_dict())))
    assert again.interconnect_bandwidth == hw.interconnect_bandwidth and again.pcie_bandwidth == hw.pcie_bandwidth


@pytest.mark.parametrize("name,world,want", [
    ("nvidia-h100-sxm", 8, (450e9, "fabric")), ("nvidia-h200", 2, (450e9, "fabric")),
    ("nvidia-rtx-3090", 2, (56.25e9, "fabric")), ("nvidia-rtx-3090", 4, (32e9, "pcie")),
    ("nvidia-rtx-4090", 8, (32e9, "pcie")), ("amd-instinct-mi300x", 8, (64e9, "fabric")),
])
def test_link_choice(name, world, want):
    assert link_bandwidth(get_hardware(name), world) == want


def test_ring_beyond_one_host_needs_a_given_link():
    with pytest.raises(ValueError, match="link_bw="):
        link_bandwidth(H100, 16)
    shape = RingShape(1, 8, 8, 32 * 1024, 64, 16)
    assert predict_ring(shape, H100, link_bw=50e9).link == "given"


# ---- bytes and FLOPs ---------------------------------------------------------
def test_step_bytes_by_hand():
    s = RingShape(batch=2, heads=8, kv_heads=2, seqlen=4096, head_dim=64, world_size=4, dtype="bf16")
    kv = 2 * 2 * 2 * 1024 * 64  # K and V elements of one shard
    assert ring_step_bytes(s, "fwd") == kv * 2
    assert ring_step_bytes(s, "bwd") == kv * (2 + 4)  # the dK/dV accumulator travels in float32
    assert ring_step_bytes(s, "fwd_bwd") == kv * 8
    # V of its own head dim: K at 64, V at 32 channels
    s = RingShape(batch=2, heads=8, kv_heads=2, seqlen=4096, head_dim=64, world_size=4, dtype="bf16", head_dim_v=32)
    kv = 2 * 2 * 1024 * (64 + 32)
    assert ring_step_bytes(s, "fwd") == kv * 2 and ring_step_bytes(s, "bwd") == kv * (2 + 4)
    assert step_costs(s, H100, "bwd")[-1].bytes == kv * 4  # the last dK/dV hop


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("phase", ["fwd", "bwd"])
@pytest.mark.parametrize("dv", [64, 40], ids=["Dv64", "Dv40"])
def test_step_flops_add_up_to_the_whole_attention(dv, world, causal, layout, phase):
    s = RingShape(1, 4, 2, 2 * world * 96, 64, world, causal, layout, head_dim_v=dv)
    total = sum(ring_step_flops(s, r, t, phase) for r in range(world) for t in range(world))
    assert total == attention_flops(1, 4, s.seqlen, s.seqlen, 64, causal=causal, mode=phase, head_dim_v=dv)
    single = ic._single_gpu_s(s, H100, phase, None, "datasheet")
    assert single > ic._single_gpu_s(RingShape(1, 4, 2, s.seqlen, 64, world, causal, layout, head_dim_v=8), H100,
                                     phase, None, "datasheet")


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zigzag_steps_are_balanced_and_faster_than_contiguous(world):
    z = RingShape(1, 32, 8, world * 16384, 128, world, True, "zigzag")
    for t in range(1, world):
        assert len({ring_step_flops(z, r, t) for r in range(world)}) == 1
    c = RingShape(1, 32, 8, world * 16384, 128, world, True, "contiguous")
    tz, tc = predict_ring(z, H100, "fwd_bwd"), predict_ring(c, H100, "fwd_bwd")
    # contiguous: every step after the first waits for a rank with a full
    # block: (1/2 + W - 1) full-block times against zigzag's W halves
    assert tc.time_s / tz.time_s == pytest.approx((2 * world - 1) / world, rel=0.05)
    assert 0 < tz.efficiency <= 1 and tz.speedup <= world


def test_prediction_sums_its_steps():
    s = RingShape(1, 32, 8, 8 * 8192, 128, 8)
    fwd, bwd, both = (predict_ring(s, H100, ph) for ph in ("fwd", "bwd", "fwd_bwd"))
    assert both.time_s == pytest.approx(fwd.time_s + bwd.time_s)
    assert both.single_gpu_s == pytest.approx(fwd.single_gpu_s + bwd.single_gpu_s)
    assert len(fwd.steps) == 8 and len(bwd.steps) == 9  # + the dK/dV return hop
    assert fwd.steps[-1].bytes == 0 and bwd.steps[-1].flops == 0
    assert fwd.exposed_transfer_s == pytest.approx(0.0, abs=1e-12)
    assert bwd.exposed_transfer_s == pytest.approx(bwd.steps[-1].transfer_s)


# ---- when the transfer hides --------------------------------------------------
BREAK_EVEN = [(name, hkv, 128) for name in sorted(CATALOGUE) for hkv in (8, 32)] + \
    [("nvidia-h100-sxm", 8, 64), ("nvidia-h200", 32, 256)]   # V of its own head dim (D = 128)


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
@pytest.mark.parametrize("name,hkv,dv", BREAK_EVEN, ids=[f"{n}-Hkv{h}-Dv{d}" for n, h, d in BREAK_EVEN])
def test_break_even_separates_hidden_from_exposed(name, hkv, dv, phase):
    hw = get_hardware(name)
    world = 2 if name == "nvidia-rtx-3090" else 8
    n = break_even_tokens(hw, heads=32, kv_heads=hkv, head_dim=128, world_size=world, phase=phase, head_dim_v=dv)

    def hidden(n_local):
        n_local += n_local % 2  # zigzag: even shards
        return transfer_hidden(RingShape(1, 32, hkv, world * n_local, 128, world, head_dim_v=dv), hw, phase)

    assert hidden(int(n * 1.1) + 2)
    assert not hidden(max(2, n // 2))


def test_faster_link_or_slower_compute_hides_more():
    s = RingShape(1, 32, 32, 8 * 8192, 128, 8)
    assert not transfer_hidden(s, H100, link_bw=10e9)
    assert transfer_hidden(s, H100, link_bw=1e12)
    assert transfer_hidden(s, H100, tflops=5, link_bw=10e9)
    costs = step_costs(s, H100, "fwd", link_bw=10e9)
    assert all(c.time_s == max(c.compute_s, c.transfer_s) for c in costs)


@pytest.mark.parametrize("kw,match", [
    (dict(seqlen=1000), "seqlen=1000 must be a multiple of 16"),
    (dict(layout="ring"), "layout must be one of"),
    (dict(kv_heads=3), "kv_heads=3 must divide"),
    (dict(dtype="fp8"), "dtype="),
    (dict(world_size=0), "world_size=0 must be >= 1"),
    (dict(head_dim_v=0), "head_dim_v=0 must be >= 1"),
])
def test_shape_validation_names_the_argument(kw, match):
    args = dict(batch=1, heads=8, kv_heads=2, seqlen=1024, head_dim=64, world_size=8)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        RingShape(**args)


def test_bad_phase_and_link():
    s = RingShape(1, 8, 8, 1024, 64, 2)
    with pytest.raises(ValueError, match="phase="):
        ring_step_bytes(s, "forward")
    with pytest.raises(ValueError, match="link_bw"):
        step_costs(s, H100, "fwd", link_bw="fast")


# ---- the tables in docs/distributed.md -----------------------------------------
def test_docs_tables_are_generated(capsys, tmp_path):
    """Each table in docs/distributed.md sits between markers naming the
    command that prints it; it must be that command's current output."""
    text = DOC.read_text()
    blocks = ic.generated_blocks(text)
    assert len(blocks) >= 4, "docs/distributed.md lost its generated tables"
    for args, body in blocks:
        assert ic.main(shlex.split(args)) == 0
        assert capsys.readouterr().out.strip() == body.strip(), \
            "stale table: python -m tileattn.cost.interconnect --update-doc docs/distributed.md"
    # regenerating in place changes nothing
    copy = tmp_path / "d.md"
    copy.write_text(text)
    assert ic.main(["--update-doc", str(copy)]) == 0
    assert copy.read_text() == text


def test_cli_errors_and_token_suffixes(capsys):
    assert ic.main(["--hw", "nvidia-b9000"]) == 2
    assert "unknown hardware" in capsys.readouterr().err
    assert ic.main(["--hw", "nvidia-h200", "--world", "2", "--seqlens", "32k", "1M"]) == 0
    out = capsys.readouterr().out
    assert "| 32k |" in out and "| 1M |" in out
