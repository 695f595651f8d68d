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

inline __m256 high_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// A vector loaded once for several FMAs, kept in a register: GCC otherwise folds the load into each FMA, and this
// CPU (Zen 5) issues about one 64-byte load per cycle, so 12 FMAs reading 4 vectors ran at the pace of 12 loads
// (measured: the weighted sum of 3 heads, 15 -> 7.5 cycles per key).
inline __m512 load_once(const float* p) {
  __m512 v = _mm512_loadu_ps(p);
  __asm__("" : "+v"(v));
  return v;
}

// Q queries against 4 keys (D a multiple of 16): per query and key one FMA chain over D in order, then the same
// tree over its lanes whatever the slot and Q: halves added (lane i + lane i+8), then attention_avx2.cc's pairs.
template <int Q>
void dot4(const float* const q[], const float* const keys[4], int64_t D, __m128 out[]) {
  __m512 acc[Q][4];
  for (int i = 0; i < Q; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    __m512 k[4];
    for (int j = 0; j < 4; ++j) k[j] = load_once(keys[j] + d);
    for (int i = 0; i < Q; ++i) {
      const __m512 qv = _mm512_loadu_ps(q[i] + d);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(qv, k[j], acc[i][j]);
    }
  }
  for (int i = 0; i < Q; ++i) {
    __m256 b[4];
    for (int j = 0; j < 4; ++j) b[j] = _mm256_add_ps(_mm512_castps512_ps256(acc[i][j]), high_half(acc[i][j]));
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(b[0], b[1]), _mm256_hadd_ps(b[2], b[3]));
    out[i] = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
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
template <int Q, int W>
void weighted_block(const float* const w[], const float* values, int64_t D, int64_t d0, int64_t k0, int64_t k1,
                    float* const out[], float sum[]) {
  __m512 acc[Q][W];
  float total[Q];
  for (int i = 0; i < Q; ++i) {
    total[i] = sum[i];
    for (int j = 0; j < W; ++j) acc[i][j] = _mm512_loadu_ps(out[i] + d0 + 16 * j);
  }
  for (int64_t k = k0; k < k1; ++k) {
    if (d0 == 0 && k + kAheadKeys < k1) prefetch_rows(values + (k + kAheadKeys) * D, D, 1);
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
template <int Q>
void weighted_values(const float* const w[], const float* values, int64_t D, int64_t k0, int64_t k1,
                     float* const out[], float sum[]) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) weighted_block<Q, 4>(w, values, D, d0, k0, k1, out, sum);
  for (; d0 < D; d0 += 16) weighted_block<Q, 1>(w, values, D, d0, k0, k1, out, sum);
}

// Rows s0 .. s1-1, Q heads each, over keys in blocks of `block` cache rows: every row takes its turn on a block
// while the block's keys (then values) are in L1, where one row at a time streamed its kv head's whole cache from
// L2 or memory again for each row. Per row the arithmetic is the row's alone: scores of the same dot products,
// exponentials against the same maximum, each weighted sum one FMA chain over the keys in order (a chain split at a
// block boundary goes on from the stored accumulator), so how rows are grouped into tasks changes no bit.
template <int Q>
void attend_rows(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, float* scratch) {
  const int64_t D = a.D, rows = s1 - s0, width = a.P + a.S;
  const int64_t block = std::max<int64_t>(8, 4096 / D);  // 16 KB of keys or values
  thread_local std::vector<float> qbuf;
  qbuf.resize(static_cast<size_t>(kMaxTaskRows * Q * D));
  TaskHeads t[kMaxTaskRows];
  float top[kMaxTaskRows][Q], sum[kMaxTaskRows][Q];
  int64_t lo = a.L, hi = 0;  // the cache rows some row of the task sees
  for (int64_t r = 0; r < rows; ++r) {
    t[r] = task_heads(a, s0 + r, h0, Q, qbuf.data() + r * Q * D, scratch + r * Q * width);
    for (int i = 0; i < Q; ++i) top[r][i] = -INFINITY, sum[r][i] = 0.0f;
    lo = std::min(lo, t[r].row.first);
    hi = std::max(hi, t[r].row.first + t[r].row.n);
  }
  // Row r's keys (indices from its first) within cache rows [b, b + block).
  const auto range = [&](int64_t r, int64_t b, int64_t& k0, int64_t& k1) {
    const RowTask& row = t[r].row;
    k0 = std::max(b, row.first) - row.first;
    k1 = std::min(b + block, row.first + row.n) - row.first;
    return k0 < k1;
  };
  const auto dot = [](auto... x) { dot4<Q>(x...); };
  int64_t k0 = 0, k1 = 0;
  if (rows == 1) {  // nothing to share: one pass over the keys (a call per block cost a 1-token step's attention 5%)
    score_keys<Q>(t[0].q, t[0].row, D, a.scale, t[0].scores, top[0], dot);
  } else {
    for (int64_t b = lo / block * block; b < hi; b += block)
      for (int64_t r = 0; r < rows; ++r)
        if (range(r, b, k0, k1)) score_keys<Q>(t[r].q, t[r].row, D, a.scale, t[r].scores, top[r], dot, k0, k1);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < Q; ++i) {
      exponentials(t[r].scores[i], t[r].row.n, top[r][i]);
      std::fill(t[r].out[i], t[r].out[i] + D, 0.0f);
    }
  for (int64_t b = lo / block * block; b < hi; b += block)
    for (int64_t r = 0; r < rows; ++r)
      if (range(r, b, k0, k1)) weighted_values<Q>(t[r].scores, t[r].row.values, D, k0, k1, t[r].out, sum[r]);
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < Q; ++i) {
      const __m512 inv = _mm512_set1_ps(1.0f / sum[r][i]);
      float* out = t[r].out[i];
      for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(out + d), inv));
      record_half(a, s0 + r, h0 + i, top[r][i], sum[r][i]);
    }
}

}  // namespace

void attend_avx512(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch) {
  switch (count) {
    case 1: attend_rows<1>(a, s0, s1, h0, scratch); break;
    case 2: attend_rows<2>(a, s0, s1, h0, scratch); break;
    default: attend_rows<3>(a, s0, s1, h0, scratch); break;
  }
}

}  // namespace edge
#endif
