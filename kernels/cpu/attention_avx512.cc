// The AVX-512 edge.Attention kernel: attention_avx2.cc's tasks and orders with 16-lane vectors, so each key costs
// half the FMAs (head_dim 64: 4 per dot product and 4 per weighted value instead of 8). The weighted sums keep the
// AVX2 kernel's per-dimension arithmetic (one FMA chain over the keys in order), so they are bitwise its sums; a dot
// product folds its 16 lanes to 8 first, so scores may differ from the AVX2 kernel's by rounding, never between
// calls: rows stay independent of the call's size. Built with -mavx512f; called only when the CPU has it and
// EDGE_KERNELS_ISA allows (select_attend_fn).
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention.h"
#include "attention_x86.h"
#include "exp_avx512.h"

namespace edge {
namespace {

// A vector loaded once for several FMAs, kept in a register: GCC otherwise folds the load into each FMA, and this
// CPU (Zen 5) issues about one 64-byte load per cycle, so 12 FMAs reading 4 vectors ran at the pace of 12 loads
// (measured: the weighted sum of 3 heads, 15 -> 7.5 cycles per key).
inline __m512 load_once(const float* p) {
  __m512 v = _mm512_loadu_ps(p);
  __asm__("" : "+v"(v));
  return v;
}

// 16 elements of a half cache widened to float32 (exact), into a register likewise.
inline __m512 load_once(const uint16_t* p) {
  __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  __asm__("" : "+v"(v));
  return v;
}

// Which key of a group of 8 each of dot8's slots holds: fold8 leaves slots 0, 2, 4, 6, 1, 3, 5, 7 in lanes 0-7, so
// lane j holds key j.
constexpr int kSlotKey[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// Lanes 0-7: x's lane i + lane i+8; lanes 8-15: y's.
inline __m512 halves(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
}

// _mm256_hadd_ps over 512 bits: per 128-bit block, x0 + x1, x2 + x3, y0 + y1, y2 + y3.
inline __m512 pairs(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Each of 8 vectors summed over its 16 lanes in one fixed tree: s_i = lane i + lane i+8, p_j = s_2j + s_2j+1, then
// (p0 + p1) + (p2 + p3), the tree a 256-bit fold and two horizontal adds give one vector. Done with whole-vector
// shuffles for 8 vectors at once it takes 24 instructions instead of ~9 per vector (the scores of a 64-dim head
// ran at ~9.4 cycles per dot product against 4 for its FMAs). Slot order in lanes 0-7: 0, 2, 4, 6, 1, 3, 5, 7.
inline __m256 fold8(const __m512 v[8]) {
  const __m512 b0 = pairs(halves(v[0], v[1]), halves(v[2], v[3]));
  const __m512 b1 = pairs(halves(v[4], v[5]), halves(v[6], v[7]));
  const __m512 u = pairs(b0, b1);  // blocks: slots 0,2,4,6 (p0+p1), the same (p2+p3), slots 1,3,5,7 likewise
  const __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(u, u, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(u, u, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_castps512_ps256(w);
}

// Q queries against 8 keys (D a multiple of 16), key j's dot product with query i in lane j of out[i]: per query
// and key one FMA chain over D in order, then fold8's tree, the same for every key whatever its slot and Q.
// Always inlined into its caller: with a float and a half instantiation GCC kept it out of line, and the call cost
// the 8- to 16-token steps 3-4% (paired against the library before the half cache).
template <int Q, class T>
__attribute__((always_inline)) inline void dot8(const float* const q[], const T* const keys[8], int64_t D,
                                                __m256 out[]) {
  __m512 acc[Q][8];
  for (int i = 0; i < Q; ++i)
    for (int j = 0; j < 8; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    __m512 qv[Q];
    for (int i = 0; i < Q; ++i) qv[i] = load_once(q[i] + d);
    for (int j = 0; j < 8; ++j) {
      const __m512 k = load_once(keys[j] + d);
      for (int i = 0; i < Q; ++i) acc[i][j] = _mm512_fmadd_ps(qv[i], k, acc[i][j]);
    }
  }
  for (int i = 0; i < Q; ++i) out[i] = fold8(acc[i]);
}

// Scaled scores plus bias of Q queries for the task's keys k0 .. k1-1, into scores[i]; top[i]
// becomes the larger of itself and their maximum. A last group of fewer than 8 keys repeats key k1-1 in its empty
// slots (the same score, so no other maximum) and stores only its live lanes. A key's score is the same in any
// slot, so splitting the keys into ranges changes no score.
template <int Q, class T>
void score_keys8(const float* const q[], const RowTask<T>& r, int64_t D, float scale, float* const scores[], float top[],
                 Ahead ahead, int64_t k0, int64_t k1) {
  const __m256 vscale = _mm256_set1_ps(scale);
  __m256 vtop[Q];
  for (int i = 0; i < Q; ++i) vtop[i] = _mm256_set1_ps(top[i]);
  for (int64_t t = k0; t < k1; t += 8) {
    if (ahead.distance > 0 && t + ahead.distance + 8 <= ahead.limit)
      prefetch_rows(r.keys + (t + ahead.distance) * D, D, 8);
    const int64_t live = std::min<int64_t>(8, k1 - t);
    const T* keys[8];
    for (int i = 0; i < 8; ++i) keys[i] = r.keys + (t + std::min<int64_t>(kSlotKey[i], live - 1)) * D;
    __m256 bias = _mm256_setzero_ps();
    if (r.bias != nullptr && live == 8) bias = _mm256_loadu_ps(r.bias + t);
    if (r.bias != nullptr && live < 8) {
      alignas(32) float b[8];
      for (int j = 0; j < 8; ++j) b[j] = r.bias[t + std::min<int64_t>(j, live - 1)];
      bias = _mm256_load_ps(b);
    }
    __m256 v[Q];
    dot8<Q, T>(q, keys, D, v);
    const __mmask16 store = static_cast<__mmask16>((1u << live) - 1);
    for (int i = 0; i < Q; ++i) {
      v[i] = _mm256_mul_ps(v[i], vscale);
      if (r.bias != nullptr) v[i] = _mm256_add_ps(v[i], bias);
      vtop[i] = _mm256_max_ps(vtop[i], v[i]);
      if (live == 8) _mm256_storeu_ps(scores[i] + t, v[i]);
      else _mm512_mask_storeu_ps(scores[i] + t, store, _mm512_castps256_ps512(v[i]));
    }
  }
  for (int i = 0; i < Q; ++i) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vtop[i]);
    top[i] = *std::max_element(lanes, lanes + 8);
  }
}

void exponentials(float* scores, int64_t n, float top) {
  const __m512 shift = _mm512_set1_ps(top);
  int64_t t = 0;
  for (; t + 16 <= n; t += 16)
    _mm512_storeu_ps(scores + t, exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(scores + t), shift)));
  if (t < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - t)) - 1);
    _mm512_mask_storeu_ps(scores + t, tail, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, scores + t), shift)));
  }
}

// out_i[0..D) += sum over keys k0..k1 of w_i[k] * values[k] for the Q heads at once (their chains interleave, which
// one head's 4 accumulators for 64 dims could not: each waits on the FMA before it), keys in order, 16 dims per
// vector. Adds w_i[k] in key order to sum[i], in a local copy: `sum` may alias w or out for all the compiler knows,
// so summing into it stored and reloaded each head's sum at every key, a chain of ~10 cycles a key through memory
// (perf: the weighted sums ran at that pace instead of their FMAs'). The same additions, so the same bits.
template <int Q, int W, class T>
void weighted_block(const float* const w[], const T* values, int64_t D, int64_t d0, int64_t k0, int64_t k1,
                    float* const out[], float sum[], Ahead ahead) {
  __m512 acc[Q][W];
  float total[Q];
  for (int i = 0; i < Q; ++i) {
    total[i] = sum[i];
    for (int j = 0; j < W; ++j) acc[i][j] = _mm512_loadu_ps(out[i] + d0 + 16 * j);
  }
  for (int64_t k = k0; k < k1; ++k) {
    if (d0 == 0 && ahead.distance > 0 && k + ahead.distance < ahead.limit)
      prefetch_rows(values + (k + ahead.distance) * D, D, 1);
    __m512 v[W];
    for (int j = 0; j < W; ++j) v[j] = load_once(values + k * D + d0 + 16 * j);
    for (int i = 0; i < Q; ++i) {
      const float wk = w[i][k];
      if (d0 == 0) total[i] += wk;
      const __m512 wv = _mm512_set1_ps(wk);
      for (int j = 0; j < W; ++j) acc[i][j] = _mm512_fmadd_ps(wv, v[j], acc[i][j]);
    }
  }
  for (int i = 0; i < Q; ++i) {
    sum[i] = total[i];
    for (int j = 0; j < W; ++j) _mm512_storeu_ps(out[i] + d0 + 16 * j, acc[i][j]);
  }
}

// out_i[0..D) += sum over keys k0..k1 of w_i[k] * values[k] for the Q heads at once (their chains interleave, which
// one head's 4 accumulators for 64 dims could not: each waits on the FMA before it), keys in order, 64 dims per
// pass, then 16. Adds w_i[k] in key order to sum[i].
template <int Q, class T>
void weighted_values(const float* const w[], const T* values, int64_t D, int64_t k0, int64_t k1,
                     float* const out[], float sum[], Ahead ahead) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) weighted_block<Q, 4, T>(w, values, D, d0, k0, k1, out, sum, ahead);
  for (; d0 < D; d0 += 16) weighted_block<Q, 1, T>(w, values, D, d0, k0, k1, out, sum, ahead);
}

// attend_rows' kernel (attention_x86.h) with 16-lane vectors.
struct Avx512 {
  template <int Q, class T>
  static void score(const float* const q[], const RowTask<T>& r, int64_t D, float scale, float* const scores[],
                    float top[], Ahead ahead, int64_t k0, int64_t k1) {
    score_keys8<Q, T>(q, r, D, scale, scores, top, ahead, k0, k1);
  }
  static void exponentials(float* scores, int64_t n, float top) { edge::exponentials(scores, n, top); }
  template <int Q, class T>
  static void weigh(const float* const w[], const T* values, int64_t D, int64_t k0, int64_t k1,
                    float* const out[], float sum[], Ahead ahead) {
    weighted_values<Q, T>(w, values, D, k0, k1, out, sum, ahead);
  }
  static void scale(float* out, int64_t D, float inv) {
    const __m512 v = _mm512_set1_ps(inv);
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(out + d), v));
  }
};

}  // namespace

void attend_avx512(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch) {
  attend_heads<Avx512>(a, s0, s1, h0, count, scratch);
}

}  // namespace edge
#endif
