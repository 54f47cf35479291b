"""The launch-wide divider of csrc/core/fast_divmod.h, run on the host.

The pipelined CUDA kernel splits every token index of a tile into (block-table entry, slot in the
block) with FastDivmod(block_size) instead of a runtime division. A small C++ program compiled
with the host compiler checks quotient and remainder against the division operator for every
divisor 1..65536 (every block size a cache can have and far beyond) and the largest divisors, at
the numerators where a wrong multiplier or shift shows first (multiples of the divisor and their
neighbours, the top of the int32 range) and at random numerators.
"""

import subprocess
import textwrap

from support import host_cpp

HOST_PROGRAM = textwrap.dedent(r"""
    #include <cstdint>
    #include <cstdio>
    #include <random>

    #include "core/fast_divmod.h"

    using paged_attn::FastDivmod;

    static long long checked = 0, failed = 0;

    static void check(const FastDivmod& div, int d, int n) {
      int q = -1, r = -1;
      div.divmod(n, q, r);
      ++checked;
      if (q != n / d || r != n % d || div.quotient(n) != n / d) {
        if (++failed <= 10) std::printf("FAIL d=%d n=%d: q=%d r=%d\n", d, n, q, r);
      }
    }

    int main() {
      std::mt19937 rng(12345);
      std::uniform_int_distribution<int> any_n(0, INT32_MAX);
      auto divisors = [](auto&& visit) {
        for (int d = 1; d <= 65536; ++d) visit(d);
        for (int d = INT32_MAX; d > INT32_MAX - 1000; --d) visit(d);
        for (int s = 17; s <= 30; ++s)
          for (int delta = -2; delta <= 2; ++delta) visit((1 << s) + delta);
      };
      divisors([&](int d) {
        const FastDivmod div(d);
        for (int n = 0; n < 64; ++n) check(div, d, n);
        for (long long k : {1LL, 2LL, 3LL, 1000LL, INT32_MAX / d - 1LL, INT32_MAX / (long long)d}) {
          for (long long delta = -1; delta <= 1; ++delta) {
            const long long n = k * d + delta;
            if (n >= 0 && n <= INT32_MAX) check(div, d, static_cast<int>(n));
          }
        }
        for (int n = INT32_MAX; n > INT32_MAX - 8; --n) check(div, d, n);
        for (int i = 0; i < 64; ++i) check(div, d, any_n(rng));
      });
      std::printf("checked %lld failed %lld\n", checked, failed);
      return failed == 0 ? 0 : 1;
    }
""")


def test_fast_divmod_matches_division(tmp_path):
    exe = host_cpp.build(tmp_path, "fast_divmod", HOST_PROGRAM, flags=("-O2",))
    result = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    checked = int(result.stdout.split()[1])
    assert checked > 65536 * 100, result.stdout  # every divisor ran its numerators
