// AVX-VNNI instantiation of the integer 4-bit kernel (qmatmul_vnni.h): 8 lanes = one tile, for CPUs with AVX-VNNI
// but no AVX-512 (Intel Alder Lake and later client parts). Built with -mavx2 -mfma -mavxvnni only; called only when
// the CPU has them. Its results equal the AVX-512 VNNI kernel's bit for bit.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "qmatmul_vnni.h"

namespace edge {
namespace {

struct AvxVnni {
  using F = __m256;
  using I = __m256i;
  static constexpr int kTiles = 1;
  static I load_codes(const uint8_t* p, int64_t) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
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
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  template <int n>
  static I srli(I v) { return _mm256_srli_epi32(v, n); }
  template <int n>
  static I slli(I v) { return _mm256_slli_epi32(v, n); }
  static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  static I dpbusd(I acc, I u8, I s8) { return _mm256_dpbusd_avx_epi32(acc, u8, s8); }
  static I dpbusd_bcast(I acc, I u8, const int32_t* s8) { return dpbusd(acc, u8, _mm256_set1_epi32(*s8)); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
};

}  // namespace

void qmatmul_tiles_avxvnni(const QMatMulArgs& a, int64_t t0, int64_t t1) { vnni::run_tiles<AvxVnni>(a, t0, t1); }

}  // namespace edge
#endif
