"""The Hopper grids' program order (``launch/grid_order.py``): the
simulated balance of causal grids, the grouped-rows rule, pairing, the
launch grid and the configs' overrides.  Pure host code: runs everywhere.
The kernels' side of the order (every program takes a distinct block of a
distinct (head, batch) pair) is the forced ``group_rows`` configs of
``test_hopper_bwd.py`` and ``test_hopper_fwd.py`` against float64 on the GPU."""
import pytest
import torch

from tileattn.configs import HopperBwdConfig
from tileattn.launch import grid_order, hopper as launch_hopper

SMS = 132   # the H200's

# (name, n, grid rows x batch): the FA2 protocol's causal grids on the H200 (16k tokens a batch,
# 16 heads; GQA 8: 2 kv heads, 4 slices from 4k), 128 keys a program and 64-query tiles (d = 64/128)
GRIDS = [("mha-1k", 1024, 256), ("mha-2k", 2048, 128), ("mha-4k", 4096, 64), ("mha-8k", 8192, 32),
         ("mha-16k", 16384, 16), ("gqa8-2k", 2048, 16), ("gqa8-4k", 4096, 32), ("gqa8-16k", 16384, 8)]


@pytest.mark.parametrize("n,copies", [g[1:] for g in GRIDS], ids=[g[0] for g in GRIDS])
def test_grouped_rows_keep_the_sms_busy(n, copies):
    """The rule's groups (about one wave of programs) keep the simulated SMs
    at least 93 % busy (short grids lose the rest to the programs' fixed cost
    and the last wave) and never less than one row after another does."""
    works = grid_order.block_tiles(n, n, 128, 64)
    rows = grid_order.rule_rows(len(works), copies, SMS)
    grouped = grid_order.balance(grid_order.grouped_order(works, copies, rows), SMS)
    plain = grid_order.balance(grid_order.grouped_order(works, copies, 1), SMS)
    assert grouped >= plain - 1e-9
    assert grouped >= 0.93, f"{n} keys, {copies} rows: {grouped:.3f} busy in groups of {rows}"


def test_grouped_order_is_a_permutation_of_the_grid():
    """Every (pair, block) once, blocks of 3 pairs at a time, longest first."""
    works = tuple(range(10, 0, -1))   # distinct works name the block
    order = grid_order.grouped_order(works, 6, 3)
    assert sorted(order) == sorted(works * 6)
    assert order[:4] == (10, 10, 10, 9) and order[27:33] == (1, 1, 1, 10, 10, 10)


@pytest.mark.parametrize("n_blocks,copies,expected", [(128, 16, 1), (64, 32, 2), (32, 64, 4), (16, 128, 8),
                                                      (16, 3, 3), (32, 6, 3), (32, 7, 1), (1, 4, 4), (0, 2, 2)])
def test_rule_rows(n_blocks, copies, expected):
    """About one wave of programs a group, a divisor of the pairs (no short group)."""
    assert grid_order.rule_rows(n_blocks, copies, SMS) == expected


def test_group_rows_follows_the_config():
    table = HopperBwdConfig()
    assert grid_order.group_rows(False, 32, 64, table, SMS) == 1        # no causal: equal programs, the grid's order
    assert grid_order.group_rows(True, 32, 64, table, SMS) == 4
    assert grid_order.group_rows(True, 32, 64, HopperBwdConfig(group_rows=1), SMS) == 1
    assert grid_order.group_rows(False, 32, 64, HopperBwdConfig(group_rows=5), SMS) == 4   # forced: a divisor not above
    assert grid_order.group_rows(True, 32, 3, HopperBwdConfig(group_rows=5), SMS) == 3     # at most every pair


def test_grid_layouts():
    """One pair a group: the plain (blocks, rows, batch) grid; else (G, blocks,
    groups), also where the batch alone would pass CUDA's grid limit."""
    assert grid_order.grid(32, 16, 4, 1) == ((32, 16, 4), False)
    assert grid_order.grid(32, 16, 4, 4) == ((4, 32, 16), True)
    big = grid_order.GRID_Z_MAX + 1
    rows = grid_order.group_rows(False, 8, 2 * big, HopperBwdConfig(), SMS)
    grid, grouped = grid_order.grid(8, 2, big, rows)
    assert grouped and grid[0] * grid[2] == 2 * big and grid[2] <= grid_order.GRID_Z_MAX


# (name, n, batch x grid rows, group rows, pairing expected): the v16 cases (16 query heads, d = 128,
# 16k tokens a batch); one row after another pairing pays only at GQA 8, 4k (the SMs 63 % busy, paired
# 97 %, +31 % measured); in groups of rows no shape here gains the margin
PAIRING = [("gqa8-4k-one-by-one", 4096, 8, 1, True), ("gqa8-4k", 4096, 8, None, False),
           ("gqa8-16k", 16384, 2, None, False), ("mha-2k", 2048, 128, None, False),
           ("mha-2k-one-by-one", 2048, 128, 1, False), ("mha-4k", 4096, 64, None, False),
           ("mha-16k", 16384, 16, None, False), ("one-wave-333", 333, 6, None, False)]


@pytest.mark.parametrize("n,copies,rows,expected", [c[1:] for c in PAIRING], ids=[c[0] for c in PAIRING])
def test_pairing_rule(n, copies, rows, expected):
    """Where the table's config (pair_blocks=None) takes key blocks in pairs:
    only where the simulated balance of the plain grid is poor."""
    assert grid_order.pairs_pay(n, n, copies, 128, 64, SMS, rows) is expected


def test_pairing_follows_the_config():
    q = torch.empty(1, 16, 4096, 128)
    k = torch.empty(1, 2, 4096, 128)
    assert grid_order.paired(q, k, False, HopperBwdConfig(pair_blocks=True))   # forced: without causal too
    assert grid_order.paired(q, k, True, HopperBwdConfig(pair_blocks=True))
    assert not grid_order.paired(q, k, True, HopperBwdConfig(pair_blocks=False))
    assert not grid_order.paired(q, k, False, HopperBwdConfig())   # the rule pairs causal calls only


@pytest.mark.parametrize("rows", [0, True, 2.0, -1], ids=["zero", "bool", "float", "negative"])
def test_group_rows_config_refused(rows):
    """A forced group_rows that is not a positive int: a ValueError naming the
    config, before any launch (CPU tensors: nothing reaches a kernel)."""
    q = torch.zeros(1, 4, 256, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    stats = torch.zeros(1, 4, 256)
    with pytest.raises(ValueError, match="config: group_rows"):
        launch_hopper.attn_bwd_dkdv(q, q, k, k, torch.zeros(1, 4, 256, 64), torch.empty_like(k),
                                    torch.empty_like(k), stats, stats, True, 0.125, HopperBwdConfig(group_rows=rows))
