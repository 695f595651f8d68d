// The AVX2/FMA edge.Attention kernel: dot products and the weighted sum of values vectorised over the head
// dimension, exponentials 8 keys at a time. Sums over keys stay sequential in key order (a vector of partial sums
// would put a key in another lane once a tree's rejected nodes are compacted out of the cache). Built with -mavx2
// -mfma; called only when the CPU has both (select_attend_fn).
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention.h"

namespace edge {
namespace {

float hsum(__m256 v) {
  const __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

// q . key over D (a multiple of 8): two accumulators, combined the same way for every key.
float dot(const float* q, const float* key, int64_t D) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(key + d), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(key + d + 8), a1);
  }
  if (d < D) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(key + d), a0);
  return hsum(_mm256_add_ps(a0, a1));
}

// e^x for x <= 0 (scores minus their maximum), ~2 ulp; exactly 0 below -87 (a key masked by the tree bias).
__m256 exp_nonpositive(__m256 x) {
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 split in two for an exact reduction
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);  // e^r on |r| <= ln2/2 (Cephes' expf coefficients)
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(exponent)), live);
}

}  // namespace

void attend_avx2(const AttentionArgs& a, int64_t s, int64_t h, float* scores) {
  const int64_t D = a.D;
  thread_local std::vector<float> q;
  q.resize(static_cast<size_t>(D));
  const RowTask r = row_task(a, s, h, q.data());
  const int64_t n = r.n;
  float top = -INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    scores[t] = dot(q.data(), r.keys + t * D, D) * a.scale + (r.bias != nullptr ? r.bias[t] : 0.0f);
    top = std::max(top, scores[t]);
  }
  const __m256 shift = _mm256_set1_ps(top);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    _mm256_storeu_ps(scores + t, exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + t), shift)));
  if (t < n) {  // the tail through a padded copy: each key's exponential is the same whatever its lane
    alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::copy(scores + t, scores + n, tail);
    _mm256_store_ps(tail, exp_nonpositive(_mm256_sub_ps(_mm256_load_ps(tail), shift)));
    std::copy(tail, tail + (n - t), scores + t);
  }
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {  // 64 dims in 8 independent accumulators, keys in order
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < n; ++k) {
      const __m256 w = _mm256_set1_ps(scores[k]);
      const float* row = r.values + k * D + d0;
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * j), acc[j]);
    }
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(r.out + d0 + 8 * j, acc[j]);
  }
  for (; d0 < D; d0 += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t k = 0; k < n; ++k)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(scores[k]), _mm256_loadu_ps(r.values + k * D + d0), acc);
    _mm256_storeu_ps(r.out + d0, acc);
  }
  float sum = 0.0f;
  for (int64_t k = 0; k < n; ++k) sum += scores[k];
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (d0 = 0; d0 < D; d0 += 8) _mm256_storeu_ps(r.out + d0, _mm256_mul_ps(_mm256_loadu_ps(r.out + d0), inv));
}

}  // namespace edge
#endif
