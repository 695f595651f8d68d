// SpQR's second level, expanded a block of tiles at a time (register.cc calls it before the kernels): the first-level
// scales and zero points of a weight are themselves 8-bit codes on a per-row-group grid of float16 (base, step)
// pairs, so they cost a byte each instead of four. Expanding into a small float32 block keeps every kernel unchanged
// and bitwise the same as with the dequantized statistics. Built without ISA flags and with -ffp-contract=off:
// base + step * code rounds the product and then the sum, as numpy does in edge.kernels.pack (and as the AVX2 form
// in qmatmul_avx2.cc does, with separate multiply and add).
#include "qmatmul.h"
#include "qmatmul_stats.h"

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
  expand_two_level_with(a, t0, t1, scales, zeros, expand_group);
}

void widen_halves(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
}

}  // namespace edge
