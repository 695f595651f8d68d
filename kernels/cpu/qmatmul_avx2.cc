// AVX2/FMA kernels: the fp32 vector kernel (qmatmul_simd.h) with 8 lanes = one tile, and the int8-activation kernel
// for 4-bit codes (accuracy_level 4). Built with -mavx2 -mfma only; called only when the CPU reports both
// (select_tiles_fn).
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "exp_avx2.h"
#include "qmatmul_simd.h"
#include "qmatmul_vnni.h"

namespace edge {
namespace {

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  static constexpr int kTiles = 1;
  static I load_unit(const uint8_t* p, int64_t) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I load_u16_unit(const uint8_t* p, int64_t) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F load(const float* p, int64_t) { return _mm256_loadu_ps(p); }
  static F load_u8(const uint8_t* p, int64_t) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F load_f16(const uint16_t* p, int64_t) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(float* out, F v) { _mm256_store_ps(out, v); }
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static I set1i(int v) { return _mm256_set1_epi32(v); }
  static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  template <int n>
  static I srli(I v) { return _mm256_srli_epi32(v, n); }
  template <int n>
  static I slli(I v) { return _mm256_slli_epi32(v, n); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
};

// gate_activation's formulas, 8 lanes at once.
__m256 gate_activation_avx2(int gated, __m256 x) {
  __m256 u = x;  // silu: x / (1 + e^-x); gelu_tanh: x / (1 + e^(-1.5957691216 (x + 0.044715 x^3)))
  if (gated != 1)
    u = _mm256_mul_ps(_mm256_set1_ps(1.5957691216f),
                      _mm256_add_ps(x, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x), x), x)));
  const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), u));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// accuracy_level 4 without VNNI. Why: the fp32 kernel converts every code to float and spends an FMA per row on it,
// so an 8-row verify step costs several times a 1-row one; here vpmaddubsw multiplies 32 codes by 32 int8 x at once.
// x comes as one signed byte per k (prepare_digits with digits = 1, |x_int| <= 127) and the sums are exact integers:
// per 16-bit lane 16 products of at most 15 * 127 over a 32-k flush (30,480 < 2^15, no saturation), widened by
// vpmaddwd. The integer sum of a flush is the same number the VNNI kernels (qmatmul_vnni.h, digits = 1) form, and
// the float steps after it are theirs, so the results equal theirs bit for bit, and row m depends only on row m.
// kGroup32: groups of 32 k are one flush each, so a group's sum needs no float accumulator of its own (0 + x is x:
// the same results with R fewer live registers, which spilled at 8 rows). Measured on one Zen 3 core (SmolLM2's
// shapes): 3-9% faster at 2-8 rows; one row gains ~15% from a fixed, fully unrolled flush, which more rows lose.
// B: the rows of the block of digit_row's layout that rows [m0, m0 + R) are in (R, or 9 for a last block of 9
// rows, run as 5 + 4: 9 rows' sums would not fit the 16 registers).
template <int R, bool kGroup32, int B = R>
void int8_tile_rows(const QMatMulArgs& a, int64_t t, int64_t m0) {
  const int64_t units_per_group = kGroup32 && R == 1 ? vnni::kFlushUnits : a.group / 8;
  const uint8_t* unit = a.codes + t * a.tile_bytes;
  const __m256i nibbles = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  // x of the R rows: one pointer and the block's constant strides.
  const DigitRow row = digit_row(a, m0);
  const int32_t* xd = a.xd + row.words;
  const int64_t unit_stride = B * 2, stat_stride = B;
  __m256 acc[R];
#pragma GCC unroll 16  // see tile_rows in qmatmul_vnni.h: a memset here keeps acc in memory
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < a.G; ++g) {
    __m256 accg[R];
    for (int r = 0; r < R; ++r) accg[r] = _mm256_setzero_ps();
    for (int64_t u0 = 0; u0 < units_per_group; u0 += vnni::kFlushUnits) {
      const int64_t flush = std::min<int64_t>(units_per_group - u0, vnni::kFlushUnits);
      __m256i s16[R];
      for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
      for (int64_t u = 0; u < flush; ++u, unit += 32) {
        // A 1-token step streams the weights from memory: asking for them 2 KB ahead made it 5-7% faster in
        // the whole model (the hardware prefetcher restarts with every op and every tile).
        _mm_prefetch(reinterpret_cast<const char*>(unit) + 2048, _MM_HINT_T0);
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit));
        const __m256i even = _mm256_and_si256(w, nibbles);  // byte b of a column's word: k = 2b
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(w, 4), nibbles);  // k = 2b + 1
        const int64_t uu = g * units_per_group + u0 + u;
        for (int r = 0; r < R; ++r) {
          const int32_t* d = xd + uu * unit_stride + r * 2;
          const __m256i pe = _mm256_maddubs_epi16(even, _mm256_set1_epi32(d[0]));
          const __m256i po = _mm256_maddubs_epi16(odd, _mm256_set1_epi32(d[1]));
          s16[r] = _mm256_add_epi16(s16[r], _mm256_add_epi16(pe, po));
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[r], ones));
        accg[r] = kGroup32 ? sum : _mm256_add_ps(accg[r], sum);
      }
    }
    const int64_t at = ((t - a.stats_tile0) * a.G + g) * 8;
    const __m256 s = group_scale<Avx2>(a, at, 0);
    const __m256 sz = group_sz<Avx2>(a, at, 0, s);
    for (int r = 0; r < R; ++r) {
      const int64_t mg = row.stat + g * stat_stride + r;
      acc[r] = _mm256_fmadd_ps(accg[r], _mm256_mul_ps(s, _mm256_set1_ps(a.xpow[mg])), acc[r]);
      acc[r] = _mm256_fnmadd_ps(sz, _mm256_set1_ps(a.xsum[mg]), acc[r]);
    }
  }
  alignas(32) float out[8];
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(out, acc[r]);
    finish_tile_row_avx2(a, m0 + r, t, out);
  }
}

// One group of one row at accuracy_level 4 (one digit: x rounded to int8), as group_digits in qmatmul_portable.cc
// computes it (same amax, scale and rounding to nearest even, so the same bytes), 8 k at a time: the scalar loop
// cost an 8-token SmolLM2 verify step ~1 ms.
void group_int8_avx2(const float* x, int64_t group, int32_t* out, int64_t unit_stride, float* pow_out, float* sum_out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 vmax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int64_t i = 0; i < group; i += 8) {
    const __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ));  // inf or nan
    vmax = _mm256_max_ps(vmax, v);
  }
  if (_mm256_movemask_ps(bad) != 0) {  // the row's outputs become NaN, as in fp32
    for (int64_t u = 0; u < group / 8; ++u) std::fill(out + u * unit_stride, out + u * unit_stride + 2, 0);
    *pow_out = *sum_out = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  const DigitScale scale = digit_scale(*std::max_element(lanes, lanes + 8), 1);
  const __m256 mul = _mm256_set1_ps(scale.mul);
  // Per 128-bit lane (k0..k3, k4..k7): the low bytes of its k in the order even, even, odd, odd.
  const __m256i order = _mm256_setr_epi8(0, 8, 4, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                         0, 8, 4, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  __m256i vsum = _mm256_setzero_si256();
  for (int64_t i = 0; i < group; i += 8, out += unit_stride) {  // one 8-k unit: [even k bytes, odd k bytes]
    __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), mul));  // round to nearest even
    v = _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
    vsum = _mm256_add_epi32(vsum, v);
    const __m256i bytes = _mm256_shuffle_epi8(v, order);
    const uint32_t lo = static_cast<uint32_t>(_mm256_cvtsi256_si32(bytes));
    const uint32_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(bytes, 1)));
    out[0] = static_cast<int32_t>((lo & 0xffffu) | (hi << 16));
    out[1] = static_cast<int32_t>((lo >> 16) | (hi & 0xffff0000u));
  }
  alignas(32) int32_t sums[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sums), vsum);
  int32_t sum = 0;
  for (int32_t v : sums) sum += v;
  *pow_out = scale.step;
  *sum_out = static_cast<float>(sum) * scale.step;
}

}  // namespace

void finish_tile_row_avx2(const QMatMulArgs& a, int64_t m, int64_t tile, const float* dense8) {
  if (a.outlier_rowptr != nullptr || tile * 8 + 8 > a.N) return finish_tile_row(a, m, tile, dense8);
  __m256 v = _mm256_loadu_ps(dense8);
  if (a.bias != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(a.bias + tile * 8));
  if (a.gated == 0) return _mm256_storeu_ps(a.y + m * a.N + tile * 8, v);
  const __m256 act = gate_activation_avx2(a.gated, v);  // lanes 0-3: the gates; 4-7: their up values
  _mm_storeu_ps(a.y + m * (a.N / 2) + tile * 4, _mm_mul_ps(_mm256_castps256_ps128(act), _mm256_extractf128_ps(v, 1)));
}

void finish_tile_pair_avx2(const QMatMulArgs& a, int64_t m, int64_t tile, const float* dense16) {
  if (a.gated == 0 || a.outlier_rowptr != nullptr || tile * 8 + 16 > a.N) {
    finish_tile_row_avx2(a, m, tile, dense16);
    return finish_tile_row_avx2(a, m, tile + 1, dense16 + 8);
  }
  __m256 v0 = _mm256_loadu_ps(dense16), v1 = _mm256_loadu_ps(dense16 + 8);
  if (a.bias != nullptr) {
    v0 = _mm256_add_ps(v0, _mm256_loadu_ps(a.bias + tile * 8));
    v1 = _mm256_add_ps(v1, _mm256_loadu_ps(a.bias + tile * 8 + 8));
  }
  const __m256 gates = _mm256_permute2f128_ps(v0, v1, 0x20), ups = _mm256_permute2f128_ps(v0, v1, 0x31);
  _mm256_storeu_ps(a.y + m * (a.N / 2) + tile * 4, _mm256_mul_ps(gate_activation_avx2(a.gated, gates), ups));
}

void qmatmul_tiles_avx2(const QMatMulArgs& a, int64_t t0, int64_t t1) { simd::run_tiles<Avx2>(a, t0, t1); }

namespace {

// One statistic of a tile and group, 8 lanes: base + step * code (separate multiply and add, as the portable form).
inline void expand_group_avx2(const uint8_t* codes, const float* stats, int64_t G, int64_t g, int32_t r0, int32_t r1,
                              float* out) {
  const float* s0 = stats + (r0 * G + g) * 2;
  const float* s1 = stats + (r1 * G + g) * 2;
  const __m256 base = _mm256_set_m128(_mm_set1_ps(s1[0]), _mm_set1_ps(s0[0]));
  const __m256 step = _mm256_set_m128(_mm_set1_ps(s1[1]), _mm_set1_ps(s0[1]));
  const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))));
  _mm256_storeu_ps(out, _mm256_add_ps(base, _mm256_mul_ps(step, c)));
}

}  // namespace

void expand_two_level_avx2(const QMatMulArgs& a, int64_t t0, int64_t t1, float* scales, float* zeros) {
  expand_two_level_with(a, t0, t1, scales, zeros, expand_group_avx2);
}

void widen_halves_avx2(const uint16_t* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = half_to_float(in[i]);
}

void prepare_int8_avx2(const QMatMulArgs& a, int64_t m0, int64_t m1, int32_t* xd, float* xpow, float* xsum) {
  prepare_rows(a, m0, m1, xd, xpow, xsum,
               [&](const float* x, int32_t* out, int64_t stride, float* pow_out, float* sum_out) {
    group_int8_avx2(x, a.group, out, stride, pow_out, sum_out);
  });
}

namespace {

template <bool kGroup32>
void int8_tiles(const QMatMulArgs& a, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    int64_t m0 = 0;
    for (; m0 + 8 <= a.M && a.M - m0 != 9; m0 += 8) int8_tile_rows<8, kGroup32>(a, t, m0);
    switch (a.M - m0) {
      case 9:
        int8_tile_rows<5, kGroup32, 9>(a, t, m0);
        int8_tile_rows<4, kGroup32, 9>(a, t, m0 + 5);
        break;
      case 1: int8_tile_rows<1, kGroup32>(a, t, m0); break;
      case 2: int8_tile_rows<2, kGroup32>(a, t, m0); break;
      case 3: int8_tile_rows<3, kGroup32>(a, t, m0); break;
      case 4: int8_tile_rows<4, kGroup32>(a, t, m0); break;
      case 5: int8_tile_rows<5, kGroup32>(a, t, m0); break;
      case 6: int8_tile_rows<6, kGroup32>(a, t, m0); break;
      case 7: int8_tile_rows<7, kGroup32>(a, t, m0); break;
      default: break;
    }
  }
}

}  // namespace

void qmatmul_tiles_avx2_int8(const QMatMulArgs& a, int64_t t0, int64_t t1) {
  (a.group == 32 ? int8_tiles<true> : int8_tiles<false>)(a, t0, t1);
}

}  // namespace edge
#endif
