// isa_scalar.cpp — the portable vector layer of the CPU kernel, variant "scalar": a 16-lane Vec
// is a plain float[16] (the compiler vectorises its loops for the build's baseline ISA where it
// can). Any CPU runs it; it is the default only where no SIMD layer of this build runs (CPUs
// other than x86-64 and aarch64), and info / check / bench say so when it is.
// The algorithm is partition_kernel.h; this file only supplies primitives (contract there).
#include "kernel_common.h"

namespace paged_attn {
namespace cpu {
namespace scalar {

struct Vec16 {
  float v[16];
};

struct Isa {
  using Vec = Vec16;
  using Mask = LaneRange;

  static constexpr int kQkHeads = 4, kRowPvHeads = 4, kTokenPvHeads = 4, kE4m3RowPvHeads = 4;
  static constexpr bool kTokenPvSixes = false;
  static constexpr int kTokenMajorX = 8;  // as the 8-register layers (the same code path)
  static constexpr int qk_vecs(int gt) { return gt <= 2 ? 2 : 1; }
  static constexpr int pv_rows(int /*gt*/, bool /*wide*/) { return 4; }
  static constexpr int pv_vecs(int /*gt*/, bool /*wide*/) { return 4; }
  static constexpr bool kRowProbsInRegisters = true, kTokenProbsInRegisters = true;
  static constexpr bool kHasBf16Dot = false;

  static Mask lanes(int lo, int hi) { return lane_range(lo, hi); }
  static Vec set1(float x) {
    Vec r;
    for (int i = 0; i < 16; ++i) r.v[i] = x;
    return r;
  }
  static Vec zero() { return set1(0.0f); }
  static Vec add(Vec a, Vec b) {
    for (int i = 0; i < 16; ++i) a.v[i] += b.v[i];
    return a;
  }
  static Vec sub(Vec a, Vec b) {
    for (int i = 0; i < 16; ++i) a.v[i] -= b.v[i];
    return a;
  }
  static Vec mul(Vec a, Vec b) {
    for (int i = 0; i < 16; ++i) a.v[i] *= b.v[i];
    return a;
  }
  static Vec max(Vec a, Vec b) {  // NaN in b wins, as the SIMD layers' max(fill, x)
    for (int i = 0; i < 16; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
    return a;
  }
  static Vec fmadd(Vec a, Vec b, Vec c) {
    for (int i = 0; i < 16; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static Vec pv_fmadd(Vec v, Vec p, Vec acc) { return fmadd(v, p, acc); }
  static Vec load(const float* p, Mask m) {
    Vec r;
    copy_lanes(r.v, p, m);
    return r;
  }
  static Vec load_or(const float* p, Mask m, float fill) {
    Vec r = set1(fill);
    for (int i = m.lo; i < m.hi; ++i) r.v[i] = p[i];
    return r;
  }
  static void store(float* p, const Vec& v, Mask m) {
    for (int i = m.lo; i < m.hi; ++i) p[i] = v.v[i];
  }
  static Vec select(Mask m, Vec v) {
    for (int i = 0; i < 16; ++i)
      if (i < m.lo || i >= m.hi) v.v[i] = 0.0f;
    return v;
  }
  static float reduce_add(const Vec& v) {
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += v.v[i];
    return s;
  }
  static float reduce_max(const Vec& v) {
    float s = v.v[0];
    for (int i = 1; i < 16; ++i) s = s > v.v[i] ? s : v.v[i];
    return s;
  }
  static void reduce4(const Vec& a, const Vec& b, const Vec& c, const Vec& d, float scale,
                      float* out) {
    out[0] = scale * reduce_add(a);
    out[1] = scale * reduce_add(b);
    out[2] = scale * reduce_add(c);
    out[3] = scale * reduce_add(d);
  }
  template <typename Cache>
  static Vec load_cache(const typename Cache::storage* p, Mask m) {
    Vec r = zero();
    for (int i = m.lo; i < m.hi; ++i) r.v[i] = Cache::decode(p[i]);
    return r;
  }
  template <typename Cache>
  static PA_DECODE_INLINE Vec load_token_pair(const typename Cache::storage* p, int64_t stride,
                                             int ntok, int dims) {
    Vec r = zero();
    for (int k = 0; k < ntok; ++k)
      for (int i = 0; i < dims; ++i) r.v[8 * k + i] = Cache::decode(p[k * stride + i]);
    return r;
  }
  static Vec exp(Vec x) {
    for (int i = 0; i < 16; ++i) x.v[i] = std::exp(x.v[i]);
    return x;
  }
  template <int X>
  static Vec q_row(const float* q) {
    Vec r;
    for (int i = 0; i < 16; ++i) r.v[i] = q[i % X];
    return r;
  }
  // x = 16 pair: a = token 0, b = token 1 -> x = 8 form [t0 | t1] (lane k: dims k and k + 8).
  static Vec fold16(const Vec& a, const Vec& b) {
    Vec r;
    for (int k = 0; k < 8; ++k) {
      r.v[k] = a.v[k] + a.v[k + 8];
      r.v[8 + k] = b.v[k] + b.v[k + 8];
    }
    return r;
  }
  // x = 8 pair: a = [t0 | t1], b = [t2 | t3] -> x = 4 form [t0 t1 t2 t3].
  static Vec fold8(const Vec& a, const Vec& b) {
    Vec r;
    for (int k = 0; k < 4; ++k) {
      r.v[k] = a.v[k] + a.v[k + 4];
      r.v[4 + k] = a.v[8 + k] + a.v[12 + k];
      r.v[8 + k] = b.v[k] + b.v[k + 4];
      r.v[12 + k] = b.v[8 + k] + b.v[12 + k];
    }
    return r;
  }
  // x = 4 forms of tokens 0-3, 4-7, 8-11, 12-15 -> the 16 token sums in token order.
  static Vec sum_x4(const Vec& a, const Vec& b, const Vec& c, const Vec& d) {
    const Vec* in[4] = {&a, &b, &c, &d};
    Vec r;
    for (int t = 0; t < 16; ++t) {
      const float* s = in[t / 4]->v + 4 * (t % 4);
      r.v[t] = (s[0] + s[1]) + (s[2] + s[3]);
    }
    return r;
  }
};

}  // namespace scalar
}  // namespace cpu
}  // namespace paged_attn

#define PA_ISA scalar
#include "partition_kernel.h"
#undef PA_ISA

PA_DEFINE_ENTRY_POINT(scalar, scalar, /*bf16_dot=*/false)

namespace paged_attn {
namespace cpu {
namespace scalar {

bool cpu_supports() { return true; }

}  // namespace scalar
}  // namespace cpu
}  // namespace paged_attn
