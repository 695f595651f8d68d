// A group's statistics as the vector kernels use them: the scale s, and s * z, the term the kernels multiply by
// the group's sum of x (y += s * sum(q x) - (s z) * sum(x)). Written once over vector traits V (V::load, load_u8,
// load_f16, mul, set1) for every form the op takes:
//   zero points (uint8 or float32): s * z, rounded once;
//   mins (float32 or float16, W = q * s + min, GGUF Q4_1's form): -min, exact, so a model stored that way is
//     computed from its own numbers (no zero point min / s to round);
//   neither: z = 2^(bits-1).
// float16 scales and mins halve the bytes the statistics cost a memory-bound 1-token step (a third of a 4-bit
// weight's bytes at groups of 32 in float32); they are widened exactly.
#pragma once

#include "qmatmul.h"

namespace edge {

template <class V>
inline typename V::F group_scale(const QMatMulArgs& a, int64_t at, int64_t stride) {
  return a.scales_f16 != nullptr ? V::load_f16(a.scales_f16 + at, stride) : V::load(a.scales + at, stride);
}

template <class V>
inline typename V::F group_sz(const QMatMulArgs& a, int64_t at, int64_t stride, typename V::F s) {
  if (a.mins_f16 != nullptr) return V::mul(V::set1(-1.0f), V::load_f16(a.mins_f16 + at, stride));
  if (a.mins_f32 != nullptr) return V::mul(V::set1(-1.0f), V::load(a.mins_f32 + at, stride));
  if (a.zeros_u8 != nullptr) return V::mul(s, V::load_u8(a.zeros_u8 + at, stride));
  if (a.zeros_f32 != nullptr) return V::mul(s, V::load(a.zeros_f32 + at, stride));
  return V::mul(s, V::set1(static_cast<float>(1 << (a.bits - 1))));
}

// Tiles [t0, t1) of two-level statistics (QMatMulArgs::scale_codes ...) expanded to float32 blocks, one call of
// group(codes, stats, G, g, r0, r1, out) per statistic, tile and group: the loops both expand_two_level forms share.
template <class Group>
void expand_two_level_with(const QMatMulArgs& a, int64_t t0, int64_t t1, float* scales, float* zeros, Group group) {
  for (int64_t t = t0; t < t1; ++t) {
    const int32_t r0 = a.stat_rows[2 * t], r1 = a.stat_rows[2 * t + 1];
    for (int64_t g = 0; g < a.G; ++g) {
      const int64_t at = (t * a.G + g) * 8, out = ((t - t0) * a.G + g) * 8;
      group(a.scale_codes + at, a.scale_stats_f32, a.G, g, r0, r1, scales + out);
      if (a.zero_codes != nullptr) group(a.zero_codes + at, a.zero_stats_f32, a.G, g, r0, r1, zeros + out);
    }
  }
}

}  // namespace edge
