// The AVX2/FMA edge.Attention kernel: one task attends up to 3 heads of one kv group for up to 8 rows
// (attention_x86.h's attend_rows). Dot products run 4 keys at a time for all the task's heads, the weighted sum of
// values over blocks of keys that stay in L1 while each head takes its turn, exponentials 8 keys at a time. Sums
// over keys stay sequential in key order (a vector of partial sums would put a key in another lane once a tree's
// rejected nodes are compacted out of the cache). Built with -mavx2 -mfma; called only when the CPU has both
// (select_attend_fn).
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "attention.h"
#include "attention_x86.h"
#include "exp_avx2.h"

namespace edge {
namespace {

// 8 cache elements widened to float32 (a half cache's by F16C: exact).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Q queries (heads of one kv group) against 4 keys at once (D a multiple of 8): per query and key one FMA chain over
// D in order, then the same pairwise tree over its 8 lanes whatever the slot and whatever Q, so a score never
// depends on the block or the task it falls in. The independent chains keep both FMA units busy, and each key
// is read from L2 once for all Q queries.
template <int Q, class T>
__attribute__((always_inline)) inline void dot4(const float* const q[], const T* const keys[4], int64_t D,
                                                __m128 out[]) {  // inlined as before the half cache (see dot8)
  __m256 acc[Q][4];
  for (int i = 0; i < Q; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8)
    for (int i = 0; i < Q; ++i) {
      const __m256 qv = _mm256_loadu_ps(q[i] + d);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_fmadd_ps(qv, load8(keys[j] + d), acc[i][j]);
    }
  // hadd pairs neighbours: lane j holds key j's (l0+l1)+(l2+l3) in the low half and (l4+l5)+(l6+l7) in the high.
  for (int i = 0; i < Q; ++i) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[i][0], acc[i][1]), _mm256_hadd_ps(acc[i][2], acc[i][3]));
    out[i] = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  }
}

// scores[t] = e^(scores[t] - top) for n keys; each key's exponential is the same whatever its lane.
void exponentials(float* scores, int64_t n, float top) {
  const __m256 shift = _mm256_set1_ps(top);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    _mm256_storeu_ps(scores + t, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + t), shift)));
  if (t < n) {  // the tail through a padded copy
    alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::copy(scores + t, scores + n, tail);
    _mm256_store_ps(tail, exp_avx2(_mm256_sub_ps(_mm256_load_ps(tail), shift)));
    std::copy(tail, tail + (n - t), scores + t);
  }
}

// out[0..D) += sum over keys k0..k1 of w[k] * values[k], keys in order, in blocks of 64 dims (8 accumulators;
// 8 dims at a time past the last whole block). Returns sum + the w[k] in key order, added alongside the first
// block, where the FMAs hide the adds' latency.
template <class T>
float weighted_values(const float* w, const T* values, int64_t D, int64_t k0, int64_t k1, float* out, float sum,
                      Ahead ahead) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_loadu_ps(out + d0 + 8 * j);
    for (int64_t k = k0; k < k1; ++k) {
      if (d0 == 0 && ahead.distance > 0 && k + ahead.distance < ahead.limit)
        prefetch_rows(values + (k + ahead.distance) * D, D, 1);
      if (d0 == 0) sum += w[k];
      const __m256 wk = _mm256_set1_ps(w[k]);
      const T* row = values + k * D + d0;
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(wk, load8(row + 8 * j), acc[j]);
    }
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + d0 + 8 * j, acc[j]);
  }
  for (int64_t k = k0; d0 == 0 && k < k1; ++k) sum += w[k];
  for (; d0 < D; d0 += 8) {
    __m256 acc = _mm256_loadu_ps(out + d0);
    for (int64_t k = k0; k < k1; ++k)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(w[k]), load8(values + k * D + d0), acc);
    _mm256_storeu_ps(out + d0, acc);
  }
  return sum;
}

// attend_rows' kernel (attention_x86.h) with 8-lane vectors; the heads of a task take turns on a block of values
// while it is in L1, the first asking for what follows.
struct Avx2 {
  template <int Q, class T>
  static void score(const float* const q[], const RowTask<T>& r, int64_t D, float scale, float* const scores[],
                    float top[], Ahead ahead, int64_t k0, int64_t k1) {
    score_keys<Q>(q, r, D, scale, scores, top, [](auto... x) { dot4<Q>(x...); }, ahead, k0, k1);
  }
  static void exponentials(float* scores, int64_t n, float top) { edge::exponentials(scores, n, top); }
  template <int Q, class T>
  static void weigh(const float* const w[], const T* values, int64_t D, int64_t k0, int64_t k1,
                    float* const out[], float sum[], Ahead ahead) {
    for (int i = 0; i < Q; ++i) sum[i] = weighted_values(w[i], values, D, k0, k1, out[i], sum[i], i ? Ahead{} : ahead);
  }
  static void scale(float* out, int64_t D, float inv) {
    const __m256 v = _mm256_set1_ps(inv);
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), v));
  }
};

}  // namespace

void narrow_avx2(const float* in, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  narrow_portable(in + i, n - i, out + i);
}

void attend_avx2(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch) {
  attend_heads<Avx2>(a, s0, s1, h0, count, scratch);
}

}  // namespace edge
#endif
