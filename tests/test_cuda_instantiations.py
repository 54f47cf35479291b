"""csrc/cuda/generate_instantiations.py against its owner, csrc/cuda/dispatch.cuh: the files it
writes for a CUDA build hold every (pair, kDimsPerLane) group of kernels exactly once and every
pair's launchers, grouped as the C++ dispatcher groups the head sizes (run here on the host: no
nvcc, no GPU). A group missing would be an undefined symbol when the library loads; a group
written twice, kernels compiled twice."""

import collections
import importlib.util
import os
import re
import subprocess

from support import host_cpp
import pytest

GENERATOR = os.path.join(host_cpp.ROOT, "csrc", "cuda", "generate_instantiations.py")

# The C++ owner's answers: every listed head size with its kDimsPerLane, the number of groups,
# and the kernels of one group per query dtype.
HOST_PROGRAM = r"""
#include <cstdio>
#include "cuda/dispatch.cuh"
int main() {
  using namespace paged_attn;
  for (int head_size : cuda::kHeadSizes)
    std::printf("head %d %d\n", head_size, cuda::dims_per_lane(head_size));
  std::printf("groups %d\n", cuda::distinct_dims_per_lane());
#define PA_PAIR(S, C) std::printf("pair %s %s %d\n", #S, #C, \
                                  cuda::attention_kernels_per_dims(ScalarKind::S));
  PAGED_ATTN_CUDA_PAIRS(PA_PAIR)
}
"""


@pytest.fixture(scope="module")
def owner(tmp_path_factory):
    exe = host_cpp.build(tmp_path_factory.mktemp("dispatch"), "dispatch_host", HOST_PROGRAM,
                         std="c++17")
    lines = [line.split() for line in subprocess.run(
        [exe], capture_output=True, text=True, check=True).stdout.splitlines()]
    heads = {int(h): int(d) for kind, h, d in (l for l in lines if l[0] == "head")}
    groups = next(int(l[1]) for l in lines if l[0] == "groups")
    pairs = [(s, c, int(n)) for kind, s, c, n in (l for l in lines if l[0] == "pair")]
    return heads, groups, pairs


@pytest.fixture(scope="module")
def generated():
    spec = importlib.util.spec_from_file_location("_generate_instantiations", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sources()


GROUP = re.compile(r"template struct AttentionDims<ScalarKind::(\w+), CacheKind::(\w+), (\d+)>;")
LAUNCHER = re.compile(r"template (?:void|bool) (launch_paged_attention\w*)<ScalarKind::(\w+), "
                      r"CacheKind::(\w+)>")
ASSERTED = re.compile(r"dims_per_lane\((\d+)\) == (\d+)")


def test_every_group_of_every_pair_once(owner, generated):
    heads, groups, pairs = owner
    dims_of_list = sorted(set(heads.values()))
    assert len(dims_of_list) == groups
    seen = collections.Counter()
    for name, text in generated.items():
        for scalar, cache, dims in GROUP.findall(text):
            seen[scalar, cache, int(dims)] += 1
            assert name.endswith(f"_d{dims}.cu"), name
            # the file's static_assert names exactly the head sizes of its group, per the C++
            asserted = {int(h): int(d) for h, d in ASSERTED.findall(text)}
            assert asserted == {h: d for h, d in heads.items() if d == int(dims)}, name
    assert seen == collections.Counter(
        {(scalar, cache, dims): 1 for scalar, cache, _ in pairs for dims in dims_of_list})


def test_every_pair_has_its_launchers_in_one_file(owner, generated):
    _, _, pairs = owner
    launchers = collections.defaultdict(list)
    for name, text in generated.items():
        for family, scalar, cache in LAUNCHER.findall(text):
            launchers[scalar, cache].append((family, name))
    for scalar, cache, _ in pairs:
        families = launchers[scalar, cache]
        assert sorted(f for f, _ in families) == [
            "launch_paged_attention", "launch_paged_attention_mma",
            "launch_paged_attention_pipelined"]
        assert len({n for _, n in families}) == 1  # one launcher file per pair
    # a launcher file holds no kernels: those are in the group files, compiled in parallel
    for name, text in generated.items():
        assert not (LAUNCHER.search(text) and GROUP.search(text)), name


def test_the_kernel_count_the_resource_report_expects(owner):
    """513 per arch, as docs/CUDA.md and build/cuda_resource_report.txt say: the groups' kernels,
    one v2 reduce per query dtype, two reshape_and_cache kernels per query dtype."""
    _, groups, pairs = owner
    dtypes = {scalar for scalar, _, _ in pairs}
    total = sum(groups * per_group for _, _, per_group in pairs) + 3 * len(dtypes)
    assert total == 513
