// AVX-512F instantiation of the vector kernel (qmatmul_simd.h): 16 lanes = two neighbouring tiles, so each k costs
// the same instructions as AVX2 for twice the columns. Built with -mavx512f only; called only when the CPU has it.
// An odd last tile goes to the AVX2 kernel, whose per-lane arithmetic is identical.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <utility>

#include "qmatmul_simd.h"

namespace edge {
namespace {

struct Avx512 {
  using F = __m512;
  using I = __m512i;
  static constexpr int kTiles = 2;
  
  
  static I load_unit(const uint8_t* p, int64_t stride) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + stride));
    return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
  }
  static I load_u16_unit(const uint8_t* p, int64_t stride) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride));
    return _mm512_cvtepu16_epi32(_mm256_inserti128_si256(_mm256_zextsi128_si256(lo), hi, 1));
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
  static F bcast(const float* p) { return _mm512_set1_ps(*p); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  template <int n>
  static I srli(I v) { return _mm512_srli_epi32(v, n); }
  template <int n>
  static I slli(I v) { return _mm512_slli_epi32(v, n); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
};

}  // namespace

void qmatmul_tiles_avx512(const QMatMulArgs& a, int64_t t0, int64_t t1) {
  const int64_t rest = simd::run_tiles<Avx512>(a, t0, t1);
  if (rest < t1) qmatmul_tiles_avx2(a, rest, t1);
}

}  // namespace edge
#endif
