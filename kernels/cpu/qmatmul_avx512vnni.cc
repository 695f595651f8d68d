// AVX-512 VNNI instantiation of the integer 4-bit kernel (qmatmul_vnni.h), and the AVX-512 digit preparation.
// Built with -mavx512f -mavx512vnni only; called only when the CPU has both.
//
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "exp_avx512.h"
#include "qmatmul_vnni.h"

namespace edge {
namespace {

// Bytes 0..15 of a 16-k block = digits of k0..k15; gather even then odd k of each 8-k unit.
inline __m128i unit_order() { return _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15); }

// The largest |x| of a group into *amax; whether some x is inf or nan.
bool group_max(const float* x, int64_t group, float* amax) {
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t i = 0; i < group; i += 16) {
    const __m512 v = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    bad |= _mm512_cmp_ps_mask(v, inf, _CMP_NLT_UQ);
    vmax = _mm512_max_ps(vmax, v);
  }
  *amax = _mm512_reduce_max_ps(vmax);
  return bad != 0;
}

// int8 x: x * mul rounded (to nearest even) and clamped to +-127, one byte per k, 16 k = two units stored straight
// from the shuffled bytes; returns the sum of the rounded x.
int32_t int8_group(const float* x, int64_t group, __m512 mul, int32_t* out, int64_t unit_stride) {
  const __m128i order = unit_order();
  __m512i vsum = _mm512_setzero_si512();
  for (int64_t i = 0; i < group; i += 16) {
    __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), mul));
    v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
    vsum = _mm512_add_epi32(vsum, v);
    const __m128i bytes = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(v), order);
    int32_t* unit = out + i / 8 * unit_stride;
    _mm_storel_epi64(reinterpret_cast<__m128i*>(unit), bytes);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(unit + unit_stride), _mm_unpackhi_epi64(bytes, bytes));
  }
  return _mm512_reduce_add_epi32(vsum);
}

// One group of one row: scale, round, split into digits, and store them in the kernel's order (see prepare_digits),
// unit u at out + u * unit_stride.
void group_digits(const float* x, int64_t group, int digits, int32_t* out, int64_t unit_stride, float* pow_out,
                  float* sum_out) {
  float amax = 0.0f;
  if (group_max(x, group, &amax)) {  // inf/nan in x: the row's outputs become NaN, as in fp32
    for (int64_t u = 0; u < group / 8; ++u) std::fill(out + u * unit_stride, out + u * unit_stride + 2 * digits, 0);
    *pow_out = *sum_out = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const DigitScale scale = digit_scale(amax, digits);
  const __m512 mul = _mm512_set1_ps(scale.mul);
  if (digits == 1) {
    *pow_out = scale.step;
    *sum_out = static_cast<float>(int8_group(x, group, mul, out, unit_stride)) * scale.step;
    return;
  }
  const __m128i order = unit_order();
  __m512i vsum = _mm512_setzero_si512();
  for (int64_t i = 0; i < group; i += 16) {
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), mul));  // exact: |x_int| <= 2^22
    vsum = _mm512_add_epi32(vsum, v);
    const __m512i d0 = _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24);
    const __m512i v1 = _mm512_srai_epi32(_mm512_sub_epi32(v, d0), 8);
    const __m512i d1 = _mm512_srai_epi32(_mm512_slli_epi32(v1, 24), 24);
    const __m512i d2 = _mm512_srai_epi32(_mm512_sub_epi32(v1, d1), 8);
    alignas(16) int32_t w[3][4];
    _mm_store_si128(reinterpret_cast<__m128i*>(w[0]), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(d0), order));
    _mm_store_si128(reinterpret_cast<__m128i*>(w[1]), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(d1), order));
    _mm_store_si128(reinterpret_cast<__m128i*>(w[2]), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(d2), order));
    int32_t* unit = out + i / 8 * unit_stride;  // two units: [even d0.., odd d0..] each
    for (int u = 0; u < 2; ++u)
      for (int p = 0; p < 2; ++p)
        for (int j = 0; j < digits; ++j) unit[u * unit_stride + p * digits + j] = w[j][u * 2 + p];
  }
  *pow_out = scale.step;
  *sum_out = static_cast<float>(_mm512_reduce_add_epi32(vsum)) * scale.step;
}

// One row's int8 x in groups of 32 (accuracy_level 4, the default models'), 16 groups at a time, each step for all
// of them before the next: group_digits' steps (the same bits), but a group's maximum, its two divisions (one
// vector division for 16 groups here), rounding and sum no longer wait on each other in one chain; group_digits took
// ~42 cycles a group, most of them latency, on the main thread while the other waited for the tiles.
void row_int8_digits32(const float* x, int64_t groups, int32_t* out, int64_t unit_stride, float* pow_out,
                       float* sum_out, int64_t stat_stride) {
  for (int64_t g0 = 0; g0 < groups; g0 += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, groups - g0));
    const float* xg = x + g0 * 32;
    alignas(64) float amax[16];
    alignas(64) int32_t isum[16];
    uint32_t bad = 0;
    for (int j = 0; j < 16; ++j) amax[j] = 1.0f;  // lanes past n: any finite positive value
    for (int j = 0; j < n; ++j)
      if (group_max(xg + 32 * j, 32, amax + j)) bad |= 1u << j;
    const __m512 top = _mm512_load_ps(amax);  // digit_scale for 16 groups: 127 / amax and amax / 127, or 1 and 0
    const __mmask16 zero = _mm512_cmp_ps_mask(top, _mm512_setzero_ps(), _CMP_EQ_OQ);
    alignas(64) float mul[16], step[16];
    _mm512_store_ps(mul, _mm512_mask_blend_ps(zero, _mm512_div_ps(_mm512_set1_ps(127.0f), top), _mm512_set1_ps(1.0f)));
    const __m512 steps = _mm512_maskz_div_ps(static_cast<__mmask16>(~zero), top, _mm512_set1_ps(127.0f));
    _mm512_store_ps(step, steps);
    for (int j = 0; j < n; ++j) {
      int32_t* unit = out + (g0 + j) * 4 * unit_stride;
      if (bad >> j & 1) {  // inf or nan: group_digits' NaN outputs
        group_digits(xg + 32 * j, 32, 1, unit, unit_stride, pow_out + (g0 + j) * stat_stride,
                     sum_out + (g0 + j) * stat_stride);
        isum[j] = 0;
        continue;
      }
      isum[j] = int8_group(xg + 32 * j, 32, _mm512_set1_ps(mul[j]), unit, unit_stride);
    }
    alignas(64) float sums[16];
    _mm512_store_ps(sums, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(isum)), steps));
    for (int j = 0; j < n; ++j) {
      if (bad >> j & 1) continue;
      pow_out[(g0 + j) * stat_stride] = step[j];
      sum_out[(g0 + j) * stat_stride] = sums[j];
    }
  }
}

}  // namespace

void prepare_digits_avx512(const QMatMulArgs& a, int64_t m0, int64_t m1, int32_t* xd, float* xpow, float* xsum) {
  if (a.digits == 1 && a.group == 32) {
    for (int64_t m = m0; m < m1; ++m) {
      const DigitRow row = digit_row(a, m);
      row_int8_digits32(a.x + m * a.ldx, a.G, xd + row.words, row.unit_stride, xpow + row.stat, xsum + row.stat,
                        row.group_stride);
    }
    return;
  }
  prepare_rows(a, m0, m1, xd, xpow, xsum,
               [&](const float* x, int32_t* out, int64_t stride, float* pow_out, float* sum_out) {
    group_digits(x, a.group, a.digits, out, stride, pow_out, sum_out);
  });
}

namespace {


struct Avx512Vnni {
  using F = __m512;
  using I = __m512i;
  static constexpr int kTiles = 2;
  static I load_codes(const uint8_t* p, int64_t stride) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + stride));
    return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
  }
  static F load(const float* p, int64_t stride) {
    const __m512d lo = _mm512_zextpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(p)));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(p + stride)), 1));
  }
  static F load_u8(const uint8_t* p, int64_t stride) {
    const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + stride));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi)));
  }
  static F load_f16(const uint16_t* p, int64_t stride) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
  }
  static void store(float* out, F v) { _mm512_store_ps(out, v); }
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static I set1i(int v) { return _mm512_set1_epi32(v); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  template <int n>
  static I srli(I v) { return _mm512_srli_epi32(v, n); }
  template <int n>
  static I slli(I v) { return _mm512_slli_epi32(v, n); }
  static I add_i(I a, I b) { return _mm512_add_epi32(a, b); }
  static I dpbusd(I acc, I u8, I s8) { return _mm512_dpbusd_epi32(acc, u8, s8); }
  // The row's 4 digits broadcast from memory inside the vpdpbusd ({1to16}): GCC 12 loads them with a separate
  // vpbroadcastd into a register instead, one more instruction per multiply. Folded, the default model's 8- and
  // 9-token steps took 3-10% less (S=8 0.94-0.97, S=9 0.90-0.95 of the unfolded library's time in three
  // `benchmarks/step_ab.py --paired` runs, one the other way round; Intel Xeon), the 1-token step the same.
  static I dpbusd_bcast(I acc, I u8, const int32_t* s8) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u8), "m"(*s8));
    return acc;
  }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
};

}  // namespace

void finish_tile_pairs_avx512(const QMatMulArgs& a, int64_t m, int64_t tile, const float* dense32) {
  if (a.outlier_rowptr != nullptr || tile * 8 + 16 > a.N) {
    finish_tile_pair_avx2(a, m, tile, dense32);
    return finish_tile_pair_avx2(a, m + 1, tile, dense32 + 16);
  }
  __m512 v0 = _mm512_loadu_ps(dense32), v1 = _mm512_loadu_ps(dense32 + 16);
  if (a.bias != nullptr) {
    const __m512 bias = _mm512_loadu_ps(a.bias + tile * 8);
    v0 = _mm512_add_ps(v0, bias);
    v1 = _mm512_add_ps(v1, bias);
  }
  if (a.gated == 0) {
    _mm512_storeu_ps(a.y + m * a.N + tile * 8, v0);
    return _mm512_storeu_ps(a.y + (m + 1) * a.N + tile * 8, v1);
  }
  // Per row and tile: 4 gates, then their 4 up values. Gather both rows' 8 gates and 8 up values.
  const __m512i gate_lanes = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i up_lanes = _mm512_add_epi32(gate_lanes, _mm512_set1_epi32(4));
  const __m512 x = _mm512_permutex2var_ps(v0, gate_lanes, v1), up = _mm512_permutex2var_ps(v0, up_lanes, v1);
  __m512 u = x;  // gate_activation_avx2's operations, 16 lanes
  if (a.gated != 1)
    u = _mm512_mul_ps(_mm512_set1_ps(1.5957691216f),
                      _mm512_add_ps(x, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), x), x)));
  const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), u));
  const __m512 act = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  const __m512 y = _mm512_mul_ps(act, up);
  float* row = a.y + m * (a.N / 2) + tile * 4;
  _mm256_storeu_ps(row, _mm512_castps512_ps256(y));
  _mm256_storeu_ps(row + a.N / 2, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
}

void qmatmul_tiles_avx512vnni(const QMatMulArgs& a, int64_t t0, int64_t t1) { vnni::run_tiles<Avx512Vnni>(a, t0, t1); }

}  // namespace edge
#endif
