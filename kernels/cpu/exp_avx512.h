// e^x for 16 floats (AVX-512F): exp_avx2 (exp_avx2.h) with the same operations per lane, so the same bits. Shared by
// the attention softmax and the matmul's gate activation. Include only from translation units built with -mavx512f;
// internal linkage, so no other translation unit's build of it can be linked in its place.
#pragma once

#include <immintrin.h>

#include <limits>

namespace edge {
namespace {

inline __m512 exp_avx512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f), hi = _mm512_set1_ps(88.3f);
  const __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GT_OQ), over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 e = _mm512_maskz_mov_ps(live, _mm512_mul_ps(p, _mm512_castsi512_ps(exponent)));
  return _mm512_mask_blend_ps(over, e, _mm512_set1_ps(std::numeric_limits<float>::infinity()));
}

}  // namespace
}  // namespace edge
