// What the x86 edge.Attention kernels (attention_avx2.cc, attention_avx512.cc) share: a task's heads, the score pass
// over dot products of Q queries and 4 keys (AVX2's), and the order in which a task's rows and blocks of keys are
// attended (attend_rows). Include only from those translation units: each compiles its own copy with its own ISA
// flags, so everything here has internal linkage.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "attention.h"
#include "qmatmul.h"  // widen_halves_avx2

namespace edge {
namespace {

// The heads of one task (a row and up to kMaxTaskHeads heads of one kv group): each one's rotated query (in a
// per-thread buffer), score row (in `scratch`) and output slice; the keys, values and bias they share are in `row`.
template <class T>
struct TaskHeads {
  const float* q[kMaxTaskHeads];
  float* scores[kMaxTaskHeads];
  float* out[kMaxTaskHeads];
  RowTask<T> row{};
};

// Row s's task heads with its rotated queries in `qbuf` (count * D floats), its scores in `scores` (count * (P + S)).
template <class T>
TaskHeads<T> task_heads(const AttentionArgs& a, int64_t s, int64_t h0, int64_t count, float* qbuf, float* scores) {
  TaskHeads<T> t;
  for (int64_t i = 0; i < count; ++i) {
    t.row = row_task<T>(a, s, h0 + i, qbuf + i * a.D);
    t.q[i] = qbuf + i * a.D;
    t.scores[i] = scores + i * (a.P + a.S);
    t.out[i] = t.row.out;
  }
  return t;
}

// A layer's keys and values outgrow the caches at long pasts (SmolLM2: 46 MB a step at 1,000 tokens), so the kernels
// ask for the rows kAheadKeys ahead into L2 as they walk them. Measured on a Zen 4 (session 31, `python
// benchmarks/step_ab.py OLD.so NEW.so --paired --past N`): the whole-model 1-token step 2.7% faster at a 200-token
// past, 6.7% at 1,000 and 7.9% at 1,800, the 2-token step alike, 4- to 16-token steps unchanged.
constexpr int64_t kAheadKeys = 32;

template <class T>
inline void prefetch_rows(const T* first, int64_t D, int64_t rows) {
  const char* bytes = reinterpret_cast<const char*>(first);
  const int64_t size = rows * D * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < size; b += 64) _mm_prefetch(bytes + b, _MM_HINT_T1);
}

// Which cache rows a pass over keys asks for ahead: key index t + distance while it is under limit (indices from the
// row's first key); distance 0: none.
struct Ahead {
  int64_t distance, limit;
};

// Scaled scores plus bias of Q queries for the task's keys k0 .. k1-1, into scores[i]; top[i]
// becomes the larger of itself and their maximum. A last group of fewer than 4 keys repeats key k1-1 in its empty
// slots and drops their results. Dot4(q, keys, D, out) puts the 4 keys' dot products with query i in out[i]; a
// key's score is the same in any slot, so splitting the keys into ranges changes no score.
template <int Q, class T, class Dot4>
void score_keys(const float* const q[], const RowTask<T>& r, int64_t D, float scale, float* const scores[], float top[],
                Dot4 dot4, Ahead ahead, int64_t k0, int64_t k1) {
  const __m128 vscale = _mm_set1_ps(scale);
  __m128 vtop[Q];
  for (int i = 0; i < Q; ++i) vtop[i] = _mm_set1_ps(top[i]);
  for (int64_t t = k0; t < k1; t += 4) {
    if (ahead.distance > 0 && t + ahead.distance + 4 <= ahead.limit)
      prefetch_rows(r.keys + (t + ahead.distance) * D, D, 4);
    const T* keys[4];
    alignas(16) float bias[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4; ++j) {
      const int64_t k = std::min<int64_t>(t + j, k1 - 1);
      keys[j] = r.keys + k * D;
      if (r.bias != nullptr) bias[j] = r.bias[k];
    }
    __m128 v[Q];
    dot4(q, keys, D, v);
    const int64_t live = std::min<int64_t>(4, k1 - t);
    for (int i = 0; i < Q; ++i) {
      v[i] = _mm_mul_ps(v[i], vscale);
      if (r.bias != nullptr) v[i] = _mm_add_ps(v[i], _mm_load_ps(bias));
      vtop[i] = _mm_max_ps(vtop[i], v[i]);  // a repeated key changes no maximum
      if (live == 4) {  // a copy of 1-4 floats through the stack stalled on store forwarding: 28% of a call
        _mm_storeu_ps(scores[i] + t, v[i]);
        continue;
      }
      alignas(16) float out[4];
      _mm_store_ps(out, v[i]);
      std::copy(out, out + live, scores[i] + t);
    }
  }
  for (int i = 0; i < Q; ++i) {
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, vtop[i]);
    top[i] = *std::max_element(lanes, lanes + 4);
  }
}

// Rows s0 .. s1-1, Q heads each, over keys in blocks of `block` cache rows: every row takes its turn on a block
// while the block's keys (then values) are in L1, where one row at a time streamed its kv head's whole cache from
// L2 or memory again for each row. Per row the arithmetic is the row's alone: scores of the same dot products,
// exponentials against the same maximum, each weighted sum one FMA chain over the keys in order (a chain split at a
// block boundary goes on from the stored accumulator), so how rows are grouped into tasks changes no bit.
// K is the instruction set's kernel: K::score<Q> (scores of a key range), K::exponentials, K::weigh<Q> (weighted
// sums of a key range) and K::scale (out *= inv), in attention_avx2.cc and attention_avx512.cc.
template <int Q, class K, class T>
void attend_rows(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, float* scratch) {
  const int64_t D = a.D, rows = s1 - s0, width = a.P + a.S;
  // 8 KB of the cache's keys or values, and at least 16 keys. Measured on a Zen 4, paired both ways round at a
  // 1,500-token past (session 44), against blocks of 16 KB of float32 (64 keys of 64 dims, 16 of 256):
  // - SmolLM2's float32 cache (32 keys now): the 1-token step 2.4-2.5% faster, 2-9 tokens 1.4-4.8%; 16 keys no
  //   faster than 32; at a 200-token past every size within 1.5%;
  // - its float16 cache with 32 keys: the 1-token step 1.4-2.1% slower (so 64 keys, 8 KB of halves, as before);
  // - Gemma 3 (256 dims) with 8 keys: 2-9 tokens 0-6% slower (so 16, as before).
  const int64_t block = std::max<int64_t>(16, 8192 / (D * static_cast<int64_t>(sizeof(T))));
  thread_local std::vector<float> qbuf;
  qbuf.resize(static_cast<size_t>(kMaxTaskRows * Q * D));
  TaskHeads<T> t[kMaxTaskRows];
  float top[kMaxTaskRows][Q], sum[kMaxTaskRows][Q];
  int64_t lo = a.L, hi = 0;  // the cache rows some row of the task sees
  for (int64_t r = 0; r < rows; ++r) {
    t[r] = task_heads<T>(a, s0 + r, h0, Q, qbuf.data() + r * Q * D, scratch + r * Q * width);
    for (int i = 0; i < Q; ++i) top[r][i] = -INFINITY, sum[r][i] = 0.0f;
    lo = std::min(lo, t[r].row.first);
    hi = std::max(hi, t[r].row.first + t[r].row.n);
  }
  // Row r's keys (indices from its first) within cache rows [b, b + block).
  const auto range = [&](int64_t r, int64_t b, int64_t& k0, int64_t& k1) {
    const RowTask<T>& row = t[r].row;
    k0 = std::max(b, row.first) - row.first;
    k1 = std::min(b + block, row.first + row.n) - row.first;
    return k0 < k1;
  };
  // Rows after the first in a block find its keys and values in L1; the first brings the next block's into L2 as it
  // walks this one (session 34: each row asked for what was 32 keys ahead in its own range, so the first 32 keys of
  // every block came from L3 unasked and the other rows asked again for lines already in L1; prefetches were 9% of
  // the scores' time in an 8-token step on one thread).
  const auto next_block = [&](const RowTask<T>& row, int64_t& first) {
    const Ahead ahead{first ? block : 0, hi - row.first};
    first = 0;
    return ahead;
  };
  // A half cache's block is widened once into `wide` for all the task's rows, each then reading it as a float32
  // cache whose key 0 is the row's first key in the block (widened by every row as it read it instead, an 8-token
  // step cost 4% more than with a float32 cache at a 200-token past). The same floats either way, so the same bits.
  // `wide` holds the block's keys while the rows score and its values while they weigh: a view's keys and values
  // are the same pointer.
  constexpr bool kHalf = std::is_same_v<T, uint16_t>;
  thread_local std::vector<float> wide;
  const auto widen_block = [&](const auto* base, int64_t b) {  // base: the kv head's cache row 0 (half)
    const int64_t from = std::max(b, lo), to = std::min(b + block, hi);
    wide.resize(static_cast<size_t>(block * D));
    if (to < hi) prefetch_rows(base + to * D, D, std::min(block, hi - to));  // the next block, while this widens
    widen_halves_avx2(base + from * D, (to - from) * D, wide.data() + (from - b) * D);
  };
  const auto view = [&](const RowTask<T>& row, int64_t b, int64_t k0, int64_t k1) {
    const int64_t from = row.first + k0;
    return RowTask<float>{wide.data() + (from - b) * D, wide.data() + (from - b) * D,
                          row.bias != nullptr ? row.bias + k0 : nullptr, k1 - k0, row.out, from};
  };
  int64_t k0 = 0, k1 = 0;
  if (rows == 1) {  // nothing to share: one pass over the keys (a call per block cost a 1-token step's attention 5%)
    K::template score<Q>(t[0].q, t[0].row, D, a.scale, t[0].scores, top[0], Ahead{kAheadKeys, t[0].row.n}, 0,
                         t[0].row.n);
  } else {
    const T* keys = t[0].row.keys - t[0].row.first * D;
    for (int64_t b = lo / block * block; b < hi; b += block) {
      if constexpr (kHalf) widen_block(keys, b);
      for (int64_t r = 0, first = 1; r < rows; ++r) {
        if (!range(r, b, k0, k1)) continue;
        if constexpr (kHalf) {
          float* scores[Q];
          for (int i = 0; i < Q; ++i) scores[i] = t[r].scores[i] + k0;
          K::template score<Q>(t[r].q, view(t[r].row, b, k0, k1), D, a.scale, scores, top[r], Ahead{}, 0, k1 - k0);
        } else {
          K::template score<Q>(t[r].q, t[r].row, D, a.scale, t[r].scores, top[r], next_block(t[r].row, first), k0,
                               k1);
        }
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < Q; ++i) {
      K::exponentials(t[r].scores[i], t[r].row.n, top[r][i]);
      std::fill(t[r].out[i], t[r].out[i] + D, 0.0f);
    }
  const T* values = t[0].row.values - t[0].row.first * D;
  for (int64_t b = lo / block * block; b < hi; b += block) {
    if constexpr (kHalf) {
      if (rows > 1) widen_block(values, b);
    }
    for (int64_t r = 0, first = 1; r < rows; ++r) {
      if (!range(r, b, k0, k1)) continue;
      if constexpr (kHalf) {
        if (rows > 1) {
          const float* w[Q];
          for (int i = 0; i < Q; ++i) w[i] = t[r].scores[i] + k0;
          K::template weigh<Q>(w, view(t[r].row, b, k0, k1).values, D, 0, k1 - k0, t[r].out, sum[r], Ahead{});
          continue;
        }
      }
      K::template weigh<Q>(t[r].scores, t[r].row.values, D, k0, k1, t[r].out, sum[r], next_block(t[r].row, first));
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < Q; ++i) {
      K::scale(t[r].out[i], D, 1.0f / sum[r][i]);
      record_half(a, s0 + r, h0 + i, top[r][i], sum[r][i]);
    }
}

// attend_rows for a task of `count` heads over a cache of T.
template <class K, class T>
void attend_heads_of(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch) {
  switch (count) {
    case 1: attend_rows<1, K, T>(a, s0, s1, h0, scratch); break;
    case 2: attend_rows<2, K, T>(a, s0, s1, h0, scratch); break;
    default: attend_rows<3, K, T>(a, s0, s1, h0, scratch); break;
  }
}

template <class K>
void attend_heads(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch) {
  if (a.kcache16 != nullptr) attend_heads_of<K, uint16_t>(a, s0, s1, h0, count, scratch);
  else attend_heads_of<K, float>(a, s0, s1, h0, count, scratch);
}

}  // namespace
}  // namespace edge
