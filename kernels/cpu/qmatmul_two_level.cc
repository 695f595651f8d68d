// SpQR's second level, expanded a block of tiles at a time (register.cc calls it before the kernels): the first-level
// scales and zero points of a weight are themselves 8-bit codes on a per-row-group grid of float16 (base, step)
// pairs, so they cost a byte each instead of four. Expanding into a small float32 block keeps every kernel unchanged
// and bitwise the same as with the dequantized statistics. Built without ISA flags and with -ffp-contract=off:
// base + step * code rounds the product and then the sum, as numpy does in edge.kernels.pack (and as the AVX2 form
// in qmatmul_avx2.cc does, with separate multiply and add).
#include "qmatmul.h"

namespace edge {

namespace {

// The 8 lanes of one tile and group: lanes 0-3 from stat row r0, 4-7 from r1; stats are (R, G, 2) floats.
void expand_group(const uint8_t* codes, const float* stats, int64_t G, int64_t g, int32_t r0, int32_t r1, float* out) {
  for (int half = 0; half < 2; ++half) {
    const float* st = stats + ((half == 0 ? r0 : r1) * G + g) * 2;
    for (int j = 4 * half; j < 4 * half + 4; ++j) out[j] = st[0] + st[1] * static_cast<float>(codes[j]);
  }
}

}  // namespace

void expand_two_level(const QMatMulArgs& a, int64_t t0, int64_t t1, float* scales, float* zeros) {
  for (int64_t t = t0; t < t1; ++t) {
    const int32_t r0 = a.stat_rows[2 * t], r1 = a.stat_rows[2 * t + 1];
    for (int64_t g = 0; g < a.G; ++g) {
      const int64_t at = (t * a.G + g) * 8, out = ((t - t0) * a.G + g) * 8;
      expand_group(a.scale_codes + at, a.scale_stats_f32, a.G, g, r0, r1, scales + out);
      if (a.zero_codes != nullptr) expand_group(a.zero_codes + at, a.zero_stats_f32, a.G, g, r0, r1, zeros + out);
    }
  }
}

void widen_halves(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
}

}  // namespace edge
