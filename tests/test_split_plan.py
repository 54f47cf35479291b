"""The split plan of the CUDA v1 / decode ops (csrc/core/split_plan.h), run on the host.

A small C++ program compiled with the host compiler reads shapes (num_seqs, num_kv_heads,
row_capacity, sm_count, tile_tokens) from stdin and prints plan_split's (num_partitions,
partition_size) for each; the checks below are written in Python from the rule's contract (the
header's SplitPlan comment), not from its arithmetic: every partition size a positive multiple of
the tile and at least the minimum, the partitions covering the row capacity with no partition
empty for a full row, the grid within CUDA's limits, no split when the rows already fill the GPU,
and enough blocks when they do not.
"""

import itertools
import os
import random
import re
import subprocess
import textwrap

from support import host_cpp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "csrc", "core", "split_plan.h")

HOST_PROGRAM = textwrap.dedent(r"""
    #include <cstdio>

    #include "core/split_plan.h"

    int main() {
      long long seqs, kv, cap, sms, tile, blocks_per_sm, min_tiles;  // -1: the default
      std::printf("%d %d %d\n", paged_attn::kSplitBlocksPerSm, paged_attn::kMinPartitionTiles,
                  paged_attn::kMaxSplitPartitions);
      while (std::scanf("%lld %lld %lld %lld %lld %lld %lld", &seqs, &kv, &cap, &sms, &tile,
                        &blocks_per_sm, &min_tiles) == 7) {
        paged_attn::SplitShape shape{seqs, kv, cap, sms, tile};
        if (blocks_per_sm >= 0) shape.blocks_per_sm = blocks_per_sm;
        if (min_tiles >= 0) shape.min_partition_tiles = min_tiles;
        const paged_attn::SplitPlan plan = paged_attn::plan_split(shape);
        std::printf("%d %d %d\n", plan.num_partitions, plan.partition_size, plan.split() ? 1 : 0);
      }
      return 0;
    }
""")

TILE = 128  # csrc/cuda/dispatch.cuh kNumWarps * kWarpSize
INT32_MAX = 2**31 - 1
GRID_Z = 65535


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """plan(shapes) -> (constants, [(num_partitions, partition_size, split)]); a shape is
    (num_seqs, num_kv_heads, row_capacity, sm_count, tile_tokens[, blocks_per_sm[,
    min_partition_tiles]])."""
    exe = host_cpp.build(tmp_path_factory.mktemp("split_plan"), "split_plan_host", HOST_PROGRAM,
                         std="c++17", flags=("-O1", "-Wall", "-Werror"))

    def run(shapes):
        text = "".join(" ".join(map(str, (tuple(s) + (-1, -1))[:7])) + "\n" for s in shapes)
        out = subprocess.run([exe], input=text, capture_output=True, text=True,
                             timeout=120, check=True).stdout.split("\n")
        constants = tuple(map(int, out[0].split()))
        plans = [tuple(map(int, line.split())) for line in out[1:1 + len(shapes)]]
        assert len(plans) == len(shapes)
        return constants, plans

    return run


def _check_contract(shape, result, constants):
    num_seqs, num_kv_heads, capacity, sms, tile = shape[:5]
    default_blocks_per_sm, default_min_tiles, max_partitions = constants
    blocks_per_sm = shape[5] if len(shape) > 5 else default_blocks_per_sm
    min_tiles = shape[6] if len(shape) > 6 else default_min_tiles
    n, size, split = result
    rows = num_seqs * num_kv_heads
    target = max(sms, 1) * blocks_per_sm
    usable = min(capacity, INT32_MAX)
    # split exactly when the rows leave the GPU short of the target and the table holds more
    # than one minimal partition
    assert split == (0 < rows < target and usable > min_tiles * tile), (shape, result)
    if not split:
        assert (n, size) == (1, 0), (shape, result)
        return
    assert 2 <= n <= min(max_partitions, GRID_Z), (shape, result)
    assert size > 0 and size % tile == 0 and size >= min_tiles * tile, (shape, result)
    assert n * size >= usable, f"a full row does not fit: {shape} -> {result}"
    assert (n - 1) * size < usable, f"a full row leaves partition {n - 1} empty: {shape}"
    assert size <= INT32_MAX and n * size <= 2 * INT32_MAX, (shape, result)
    # at least the target unless the partitions are as short as allowed; at most twice it
    wanted = min(-(-target // rows), max_partitions // 2)
    assert n >= wanted or size == min_tiles * tile, (shape, result)
    assert n <= 2 * wanted, (shape, result)


def test_constants_are_the_documented_ones(plan):
    constants, _ = plan([])
    assert constants == (8, 2, GRID_Z)
    doc = open(os.path.join(ROOT, "docs", "CUDA.md")).read()
    assert re.search(r"kSplitBlocksPerSm\s*=\s*8", doc) and re.search(r"kMinPartitionTiles\s*=\s*2", doc)


def test_every_plan_keeps_the_contract(plan):
    rng = random.Random(14)
    grid = list(itertools.product([1, 2, 3, 8, 64, 128, 1000, 100_000], [1, 2, 8, 64],
                                  [0, 1, 16, 255, 256, 257, 512, 1000, 4096, 100_000, 131_072,
                                   INT32_MAX, 2**40], [1, 80, 108, 132, 170], [TILE, 64, 256]))
    grid += [(rng.randint(1, 5000), rng.randint(1, 128), rng.randint(0, 2_000_000),
              rng.randint(1, 400), rng.choice([32, 64, 128, 256])) for _ in range(3000)]
    constants, plans = plan(grid)
    for shape, result in zip(grid, plans):
        _check_contract(shape, result, constants)
    assert any(r[2] for r in plans) and not all(r[2] for r in plans)


def test_no_split_when_the_rows_fill_the_gpu(plan):
    shapes = [(132, 8, 4096, 132, TILE), (1056, 1, 100_000, 132, TILE),
              (64, 16, 4096, 108, TILE), (2, 4, 10**6, 1, TILE)]
    _, plans = plan(shapes)
    assert [r[2] for r in plans] == [0, 0, 0, 0], plans


def test_short_tables_are_not_split(plan):
    # capacity <= 2 tiles: one partition would be the whole row anyway
    _, plans = plan([(1, 1, 256, 132, TILE), (1, 1, 1, 132, TILE), (1, 1, 0, 132, TILE),
                     (0, 8, 4096, 132, TILE)])
    assert [r[2] for r in plans] == [0, 0, 0, 0], plans


# The bench presets on an H200 (132 SMs), head 128, block 16: (num_seqs, num_kv_heads, tokens).
PRESETS = {"big-batch": (64, 8, 4096), "small-batch": (8, 8, 1024), "gqa8": (32, 8, 4096),
           "tp8-kv1": (128, 1, 4096), "long": (1, 8, 100_000)}


def test_bench_presets_get_enough_blocks(plan):
    names = list(PRESETS)
    shapes = [(*PRESETS[n], 132, TILE) for n in names]
    (blocks_per_sm, min_tiles, _), plans = plan(shapes)
    for name, (seqs, kv, cap), (n, size, split) in zip(names, PRESETS.values(), plans):
        rows = seqs * kv
        blocks = rows * n
        # as many blocks as the target asks, unless the table is too short to cut further
        assert blocks >= 132 * blocks_per_sm or size == min_tiles * TILE, (name, n, size)
        assert split == (rows < 132 * blocks_per_sm), name
    got = {name: (r[0], r[1]) for name, r in zip(names, plans)}
    # docs/CUDA.md's table of these shapes (update both together)
    assert got == {"big-batch": (4, 1280), "small-batch": (4, 256), "gqa8": (6, 768),
                   "tp8-kv1": (11, 384), "long": (157, 640)}, got


def test_decode_of_one_long_row_is_spread_over_the_gpu(plan):
    # a single 100k row with 1 or 8 KV heads: from 1 / 8 blocks to the target (8 per SM), or to
    # partitions of the minimum size when the row is too short for that
    (blocks_per_sm, min_tiles, _), plans = plan([(1, 1, 100_000, 132, TILE),
                                                 (1, 8, 100_000, 132, TILE)])
    assert plans == [(391, min_tiles * TILE, 1), (157, 640, 1)], plans
    assert 8 * 157 >= 132 * blocks_per_sm and 391 * min_tiles * TILE >= 100_000


def test_header_is_framework_free():
    text = open(HEADER).read()
    includes = re.findall(r"#include\s*[<\"]([^>\"]+)", text)
    assert set(includes) <= {"algorithm", "cstdint"}, includes


def test_every_aim_keeps_the_contract(plan):
    # PAGED_ATTN_CUDA_SPLIT's aims (csrc/cuda/kernel_choice.h: off = 0 blocks per SM, 1-256;
    # partitions of 1-64 tiles)
    rng = random.Random(15)
    grid = [(rng.randint(1, 5000), rng.randint(1, 128), rng.randint(0, 2_000_000),
             rng.randint(1, 400), rng.choice([64, 128]), rng.choice([0, 1, 2, 4, 16, 64, 256]),
             rng.choice([1, 2, 3, 8, 64])) for _ in range(3000)]
    grid += [(1, 1, cap, 132, TILE, 256, tiles) for cap in (127, 128, 129, 8192, INT32_MAX)
             for tiles in (1, 64)]
    constants, plans = plan(grid)
    for shape, result in zip(grid, plans):
        _check_contract(shape, result, constants)
    assert all(not r[2] for s, r in zip(grid, plans) if s[5] == 0)  # off: never split
    assert any(r[1] == s[4] for s, r in zip(grid, plans) if s[6] == 1)  # one-tile partitions


# device_check.sh's split sweep (PAGED_ATTN_CUDA_SPLIT values, "B" or "B:T") on an H200 (132 SMs)
# and the plans docs/CUDA.md's table lists for them (update the three together): (partitions,
# tokens each) per preset; the default (8:2) is test_bench_presets_get_enough_blocks'.
SWEEP_PLANS = {
    "off": {"big-batch": (1, 0), "small-batch": (1, 0), "gqa8": (1, 0), "tp8-kv1": (1, 0),
            "long": (1, 0)},
    "4": {"big-batch": (2, 2048), "small-batch": (4, 256), "gqa8": (4, 1280),
          "tp8-kv1": (6, 768), "long": (72, 1408)},
    "16": {"big-batch": (6, 768), "small-batch": (4, 256), "gqa8": (11, 384),
           "tp8-kv1": (16, 256), "long": (391, 256)},
    "8:1": {"big-batch": (4, 1280), "small-batch": (8, 128), "gqa8": (6, 768),
            "tp8-kv1": (11, 384), "long": (157, 640)},
    "32:1": {"big-batch": (11, 384), "small-batch": (8, 128), "gqa8": (32, 128),
             "tp8-kv1": (32, 128), "long": (782, 128)},
}


def _aim(value):
    if value == "off":
        return 0, -1
    blocks, _, tiles = value.partition(":")
    return int(blocks), int(tiles or -1)


def test_bench_presets_under_the_split_sweep(plan):
    names = list(PRESETS)
    shapes = [(*PRESETS[n], 132, TILE, *_aim(v)) for v in SWEEP_PLANS for n in names]
    _, plans = plan(shapes)
    got = {v: {n: plans[i * len(names) + j][:2] for j, n in enumerate(names)}
           for i, v in enumerate(SWEEP_PLANS)}
    assert got == SWEEP_PLANS, got
    sweep = re.search(r"SPLIT_SWEEP=\(([^)]*)\)", open(os.path.join(ROOT, "scripts", "gpu",
                                                                    "device_check.sh")).read())
    assert sweep and sweep.group(1).split() == list(SWEEP_PLANS), "device_check.sh's sweep"
