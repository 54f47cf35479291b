"""The CPU launcher's work items (csrc/cpu/work_items.h), run on the host.

work_items.cpp is framework-free: a small program compiled with the host compiler reads cache
shapes and sequence lengths and prints the KV heads per item it chose and the items. Checked
from work_items.h's contract: one KV head per item except on NHD caches (a token's KV heads
adjacent), where a group is the most heads that divide num_kv_heads, whose partition V fits
half the L2 and that leave two items per thread; the items cover every (sequence, partition
holding tokens, KV head) once, partition-major.
"""

import itertools
import subprocess
import textwrap

import pytest

from support import host_cpp

HOST_PROGRAM = textwrap.dedent(r"""
    #include <unistd.h>

    #include <cstdio>
    #include <vector>

    #include "cpu/work_items.h"

    using namespace paged_attn;
    using namespace paged_attn::cpu;

    // stdin lines: "LAYOUT H D BS ELEM_BYTES THREADS NSEQ LEN..." (LAYOUT 0 vLLM's, 1 NHD,
    // 2 HND); stdout: the C library's L2 bytes, then per line "MAX PER_ITEM ITEMS" with ITEMS
    // "seq:partition:kv_head:kv_heads,...".
    int main() {
      std::printf("%ld\n", sysconf(_SC_LEVEL2_CACHE_SIZE));
      int layout, H, D, bs, elem, threads, nseq;
      while (std::scanf("%d %d %d %d %d %d %d", &layout, &H, &D, &bs, &elem, &threads, &nseq) == 7) {
        std::vector<int32_t> lens(nseq);
        for (auto& n : lens) std::scanf("%d", &n);
        PagedAttentionParams p{};
        p.num_seqs = nseq, p.num_kv_heads = H, p.num_heads = 2 * H, p.head_size = D;
        p.block_size = bs, p.seq_lens = lens.data();
        p.scalar_kind = elem == 4 ? ScalarKind::kFloat32 : ScalarKind::kBFloat16;
        p.cache_kind = CacheKind::kAuto;
        const int64_t block = int64_t{bs} * H * D;
        if (layout == 0) {
          p.kv_form = KvForm::kVllm;
          p.k_layout = vllm_key_layout(block, int64_t{bs} * D, bs, 16 / elem);
          p.v_layout = vllm_value_layout(block, int64_t{bs} * D, bs);
        } else {
          p.kv_form = KvForm::kTokenMajor;
          const bool nhd = layout == 1;
          p.k_layout = p.v_layout = token_major_layout(block, nhd ? int64_t{H} * D : D,
                                                       nhd ? D : int64_t{bs} * D, D);
        }
        const SeqLengths seq = seq_lengths(p);
        const int per_item = kv_heads_per_item(p, seq, threads);
        std::printf("%d %d ", kv_heads_per_item(p, seq, 1), per_item);  // MAX: one thread's
        for (const PartitionTask& t : work_items(p, per_item))
          std::printf("%d:%d:%d:%d,", t.seq, t.partition, t.kv_head, t.kv_heads);
        std::printf("\n");
      }
      return 0;
    }
""")

LAYOUTS = {"vllm": 0, "nhd": 1, "hnd": 2}


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    exe = host_cpp.build(tmp_path_factory.mktemp("work_items"), "work_items_host",
                         HOST_PROGRAM + '#include "cpu/work_items.cpp"\n', std="c++17",
                         flags=("-O1", "-Wall", "-Werror"))

    def run(cases):
        text = "".join(f"{LAYOUTS[lay]} {h} {d} {bs} {elem} {threads} {len(lens)} "
                       + " ".join(map(str, lens)) + "\n"
                       for lay, h, d, bs, elem, threads, lens in cases)
        l2, *out = subprocess.run([exe], input=text, capture_output=True, text=True, timeout=60,
                                  check=True).stdout.splitlines()
        run.l2_bytes = int(l2) if int(l2) > 0 else 1 << 20  # work_items.cpp's reading and default
        assert len(out) == len(cases)
        rows = []
        for line in out:
            most, per_item, items = line.split(" ")
            rows.append((int(most), int(per_item),
                         [tuple(map(int, i.split(":"))) for i in items.split(",") if i]))
        return rows

    return run


def expected_per_item(l2_bytes, layout, heads, head, elem, threads, lens):
    if layout != "nhd" or heads == 1:
        return 1
    partitions = sum((n + 511) // 512 for n in lens)
    v_bytes = min(max(lens), 512) * head * elem
    fits = [n for n in range(1, heads + 1)
            if heads % n == 0 and (n == 1 or n * v_bytes <= l2_bytes // 2)]
    enough = [n for n in fits if n == 1 or partitions * (heads // n) >= 2 * threads]
    return max(enough)


CASES = [  # layout, kv heads, head size, block, element bytes, threads, seq_lens
    *[(lay, 8, 128, 16, elem, threads, lens)
      for lay, elem, threads, lens in itertools.product(
          ["vllm", "nhd", "hnd"], [2, 4], [1, 2, 16, 64],
          [[4096] * 8, [1, 511, 0, 1537], [100000], [3]])],
    ("nhd", 1, 128, 16, 2, 2, [4096]),
    ("nhd", 6, 64, 32, 2, 2, [700, 12]),
    ("nhd", 4, 256, 16, 2, 2, [100000]),
    ("nhd", 32, 128, 16, 4, 2, [2048] * 4),
]


def test_kv_heads_per_item_follows_the_contract(plan):
    for case, (most, per_item, _) in zip(CASES, plan(CASES)):
        lay, heads, head, _, elem, threads, lens = case
        assert per_item == expected_per_item(plan.l2_bytes, lay, heads, head, elem, threads,
                                             lens), case
        assert per_item <= most and heads % most == 0, case


def test_nhd_caches_get_several_heads_per_item_where_they_fit(plan):
    # the cases a Llama-like decode meets: several heads for bf16 on two threads
    (_, bf16, _), (_, hnd, _) = plan([("nhd", 8, 128, 16, 2, 2, [4096] * 8),
                                      ("hnd", 8, 128, 16, 2, 2, [4096] * 8)])
    assert bf16 > 1 and hnd == 1


def test_items_cover_every_partition_and_head_once_partition_major(plan):
    for case, (_, per_item, items) in zip(CASES, plan(CASES)):
        _, heads, _, _, _, _, lens = case
        want = [(s, part, kh) for s, n in enumerate(lens) for part in range((n + 511) // 512)
                for kh in range(heads)]
        got = [(s, part, kh + j) for s, part, kh, n in items for j in range(n)]
        assert got == want, case
        assert all(n == per_item for *_, n in items), case
