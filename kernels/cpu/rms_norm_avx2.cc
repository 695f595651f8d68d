// rms_norm_rows with AVX2 (rms_norm.h), for CPUs where uses_avx2(). The portable loop compiles to scalar code around
// its 16-lane accumulator and cost ~1 cycle per value, which a prologue at 8 rows paid on the calling thread while
// the other threads waited. The same operations lane for lane: two 8-lane registers are rms_norm.cc's 16 lanes,
// folded 8, 4, 2, 1 apart in the same order, and no FMA (products rounded as written), so the bits are the same.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cmath>

#include "rms_norm.h"

namespace edge {
namespace {

// Lanes 0-7 and 8-15 of rms_norm.cc's accumulator after 16 more values of h (products rounded, then added).
inline void accumulate(__m256 a, __m256 b, __m256& lo, __m256& hi) {
  lo = _mm256_add_ps(lo, _mm256_mul_ps(a, a));
  hi = _mm256_add_ps(hi, _mm256_mul_ps(b, b));
}

// h = x + skip into sum (or h = x), and the sum of h^2 in rms_norm.cc's order, in one pass over the row: the sum's
// writes and the squares' reads were two passes, and a row of 8 was already out of L1 when the second began. Tail
// lanes past k add +0, which leaves a non-negative lane as it was.
float residual_squares(const float* x, const float* skip, float* sum, int64_t k) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    if (skip != nullptr) {
      a = _mm256_add_ps(a, _mm256_loadu_ps(skip + i));
      b = _mm256_add_ps(b, _mm256_loadu_ps(skip + i + 8));
      _mm256_storeu_ps(sum + i, a);
      _mm256_storeu_ps(sum + i + 8, b);
    }
    accumulate(a, b, lo, hi);
  }
  if (i < k) {
    alignas(32) float tail[16] = {};
    for (int64_t j = 0; i + j < k; ++j) {
      tail[j] = skip != nullptr ? x[i + j] + skip[i + j] : x[i + j];
      if (skip != nullptr) sum[i + j] = tail[j];
    }
    accumulate(_mm256_load_ps(tail), _mm256_load_ps(tail + 8), lo, hi);
  }
  const __m256 s8 = _mm256_add_ps(lo, hi);                                                 // lane j + lane j+8
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));  // + 4 apart
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                 // + 2 apart
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));                             // + 1 apart
  return _mm_cvtss_f32(s1);
}

}  // namespace

void rms_norm_rows_avx2(const float* x, const float* skip, const float* weight, float epsilon, int64_t rows,
                        int64_t k, float* sum, float* out) {
  const int64_t body = k / 8 * 8;
  for (int64_t m = 0; m < rows; ++m) {
    float* s = skip != nullptr ? sum + m * k : nullptr;  // sum may be null without skip
    const float ss = residual_squares(x + m * k, skip != nullptr ? skip + m * k : nullptr, s, k);
    const float* h = s != nullptr ? s : x + m * k;
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(k) + epsilon);
    const __m256 vr = _mm256_set1_ps(r);
    float* o = out + m * k;
    int64_t i = 0;
    for (; i < body; i += 8)
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(h + i), vr), _mm256_loadu_ps(weight + i)));
    for (; i < k; ++i) o[i] = (h[i] * r) * weight[i];
  }
}

}  // namespace edge
#endif
