// amx_tile_probe.cpp: what one core's AMX tiles cost, the figures docs/CPU_KERNEL.md ("Where the
// time goes with AMX") quotes. Standalone, no torch; Linux on a CPU with AMX-BF16:
//
//   g++ -O2 -mamx-tile -mamx-bf16 -mavx512f scripts/bench/amx_tile_probe.cpp -o /tmp/amx_probe
//   /tmp/amx_probe
//
// Prints nanoseconds (wall time; the VM hides the core clock) of:
// tdpbf16ps by rows of A; tileloadd of 16 rows of 64 bytes from L1, from L2 (a 1 MiB working
// set, rows 256 bytes apart as a token-major K of head size 128) aligned and straddling two
// lines; and the QK pattern of the amx variant (4 C tiles, 4 x 32 dims) right after a spell of
// other work, without and with one product issued every 200 ns of that work.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  void set(int t, int r, int bytes) { rows[t] = static_cast<uint8_t>(r), colsb[t] = static_cast<uint16_t>(bytes); }
  void load() const { asm volatile("ldtilecfg %0" : : "m"(*this)); }
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

alignas(4096) uint16_t data[1 << 20];  // 2 MiB of bf16
alignas(64) float c_out[1024];

// C tmm0-3 [rows][64 B], A tmm4 / tmm6 [rows][64 B], B tmm5 [16][64 B]
void configure(int rows) {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.set(t, rows, 64);
  cfg.set(4, rows, 64);
  cfg.set(6, rows, 64);
  cfg.set(5, 16, 64);
  cfg.load();
}

}  // namespace

int main() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    std::puts("Linux did not grant the AMX tile state (no AMX on this CPU?)");
    return 1;
  }
  for (size_t i = 0; i < sizeof(data) / 2; ++i) data[i] = static_cast<uint16_t>(0x3f80 + (i % 61));
  const auto ns = [](double seconds, double count) { return seconds * 1e9 / count; };
  const long n = 2000000;

  for (int rows : {16, 8, 4}) {
    configure(rows);
    _tile_loadd(4, data, 64);
    _tile_loadd(5, data, 64);
    double t0 = now();
    for (long i = 0; i < n; ++i) {
      _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(1, 4, 5); _tile_dpbf16ps(2, 4, 5); _tile_dpbf16ps(3, 4, 5);
    }
    std::printf("tdpbf16ps, %2d rows of A, 4 independent C tiles: %5.2f ns each\n", rows,
                ns(now() - t0, 4.0 * n));
  }

  configure(16);
  double t0 = now();
  for (long i = 0; i < n; ++i) { _tile_loadd(4, data, 64); _tile_loadd(6, data + 512, 64); }
  std::printf("tileloadd, 16 rows from L1: %5.2f ns\n", ns(now() - t0, 2.0 * n));
  constexpr long kStride = 256, kSet = 1 << 20, kTiles = kSet / (16 * kStride);
  const char* base = reinterpret_cast<const char*>(data);
  for (int offset : {0, 16}) {  // 16: every row straddles two cache lines
    t0 = now();
    for (long i = 0; i < n / 4; ++i) {
      const char* tile = base + (i % kTiles) * 16 * kStride + offset;
      for (int d = 0; d < kStride; d += 128) {
        _tile_loadd(4, tile + d, kStride); _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, tile + d + 64, kStride); _tile_dpbf16ps(1, 6, 5);
      }
    }
    std::printf("tileloadd + tdpbf16ps, 16 rows %ld B apart from L2%s: %5.2f ns a tile\n", kStride,
                offset ? ", rows straddling lines" : "", ns(now() - t0, n / 4.0 * kStride / 64));
  }

  // The QK pattern of 64 tokens (4 C tiles, 4 x 32 dims, 4 C tiles stored) after `idle_ns` of
  // other work; keep_ns > 0: one product on a spare tile every keep_ns of that work.
  const auto group = [&] {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int d = 0; d < 4; ++d) {
      _tile_loadd(5, data + 8192 + 512 * d, 64);
      _tile_loadd(4, data, 64); _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(4, data + 512, 64); _tile_dpbf16ps(1, 4, 5);
      _tile_loadd(4, data + 1024, 64); _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(4, data + 1536, 64); _tile_dpbf16ps(3, 4, 5);
    }
    for (int t = 0; t < 4; ++t) {
      switch (t) {
        case 0: _tile_stored(0, c_out, 64); break;
        case 1: _tile_stored(1, c_out, 64); break;
        case 2: _tile_stored(2, c_out, 64); break;
        default: _tile_stored(3, c_out, 64); break;
      }
    }
  };
  const struct { int idle_ns, keep_ns; } spells[] = {{0, 0}, {2000, 0}, {10000, 0}, {50000, 0}, {50000, 200}};
  for (const auto& spell : spells) {
    const int reps = 2000;
    double tiles = 0;
    for (int r = 0; r < reps; ++r) {
      const double start = now();
      double last = start;
      while ((now() - start) * 1e9 < spell.idle_ns) {
        if (spell.keep_ns > 0 && (now() - last) * 1e9 > spell.keep_ns) {
          _tile_dpbf16ps(6, 4, 5);  // tmm6 as a spare C tile: same shape as tmm4
          last = now();
        }
      }
      const double t1 = now();
      for (int g = 0; g < 4; ++g) group();
      tiles += now() - t1;
    }
    std::printf("QK of 256 tokens after %5d ns of other work%s: %6.2f ns per 16 tokens\n",
                spell.idle_ns, spell.keep_ns ? " (a product every 200 ns)" : "",
                ns(tiles, reps * 16.0));
  }
  _tile_release();
  return 0;
}
