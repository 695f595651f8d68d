// e^x for 8 floats (AVX2/FMA), shared by the attention softmax and the matmul's gate activation. Include only from
// translation units built with -mavx2 -mfma.
#pragma once

#include <immintrin.h>

#include <limits>

namespace edge {

// ~2 ulp (Cephes' expf polynomial on an exact ln 2 reduction); exactly 0 at or below -87 (a key masked by the tree
// bias contributes nothing) and +inf above 88.3, near where expf itself underflows and overflows.
inline __m256 exp_avx2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.3f);
  const __m256 live = _mm256_cmp_ps(x, lo, _CMP_GT_OQ), over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 split in two for an exact reduction
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);  // e^r on |r| <= ln2/2
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(exponent)), live);
  return _mm256_blendv_ps(e, _mm256_set1_ps(std::numeric_limits<float>::infinity()), over);
}

}  // namespace edge
