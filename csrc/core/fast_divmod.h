// fast_divmod.h — quotient and remainder of a non-negative int32 by a divisor fixed for a whole
// kernel (the cache's block_size), as a multiply-high, an add and a shift instead of the ~20
// instructions of a runtime integer division: the pipelined CUDA kernel splits every token index
// of every tile into (block-table entry, slot in the block).
//
// Method (Granlund and Montgomery's round-up multiplier, for 32-bit numerators): for a divisor
// d >= 1 let s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1 (so 2^32 + m is
// ceil(2^(32 + s) / d) and m < 2^32); then for 0 <= n < 2^31
//   n / d = (umulhi(n, m) + n) >> s,
// the sum fitting 32 bits because umulhi(n, m) < n. tests/test_fast_divmod.py checks it against
// the division for every divisor up to 2^16 and the largest ones, at the numerators' edges and
// at random.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace paged_attn {

class FastDivmod {
 public:
  // divisor >= 1 (the callers' block_size is validated >= 1)
  PA_HOST_DEVICE explicit FastDivmod(int divisor) : divisor_(static_cast<uint32_t>(divisor)) {
    while ((uint32_t{1} << shift_) < divisor_) ++shift_;
    multiplier_ = static_cast<uint32_t>(
        ((uint64_t{1} << 32) * ((uint64_t{1} << shift_) - divisor_)) / divisor_ + 1);
  }
  // 0 <= n < 2^31
  PA_HOST_DEVICE int quotient(int n) const {
    const uint32_t u = static_cast<uint32_t>(n);
    return static_cast<int>((mul_high(u, multiplier_) + u) >> shift_);
  }
  PA_HOST_DEVICE void divmod(int n, int& quotient_out, int& remainder_out) const {
    quotient_out = quotient(n);
    remainder_out = n - quotient_out * static_cast<int>(divisor_);
  }

 private:
  PA_HOST_DEVICE static uint32_t mul_high(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
  }
  uint32_t divisor_;
  uint32_t shift_ = 0;
  uint32_t multiplier_ = 0;
};

}  // namespace paged_attn
