// AVX2/FMA instantiation of the vector kernel (qmatmul_simd.h): 8 lanes = one tile. Built with -mavx2 -mfma only;
// called only when the CPU reports both (select_tiles_fn).
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <utility>

#include "qmatmul_simd.h"

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

}  // namespace

void qmatmul_tiles_avx2(const QMatMulArgs& a, int64_t t0, int64_t t1) { simd::run_tiles<Avx2>(a, t0, t1); }

}  // namespace edge
#endif
