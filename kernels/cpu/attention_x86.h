// What the x86 edge.Attention kernels (attention_avx2.cc, attention_avx512.cc) share: a task's heads and the score
// pass over each one's dot product of Q queries and 4 keys. Include only from those translation units: each compiles
// its own copy with its own ISA flags, so everything here has internal linkage.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention.h"

namespace edge {
namespace {

// The heads of one task (a row and up to kMaxTaskHeads heads of one kv group): each one's rotated query (in a
// per-thread buffer), score row (in `scratch`) and output slice; the keys, values and bias they share are in `row`.
struct TaskHeads {
  const float* q[kMaxTaskHeads];
  float* scores[kMaxTaskHeads];
  float* out[kMaxTaskHeads];
  RowTask row{};
};

// Row s's task heads with its rotated queries in `qbuf` (count * D floats) and its scores in `scores` (count * (P + S)).
TaskHeads task_heads(const AttentionArgs& a, int64_t s, int64_t h0, int64_t count, float* qbuf, float* scores) {
  TaskHeads t;
  for (int64_t i = 0; i < count; ++i) {
    t.row = row_task(a, s, h0 + i, qbuf + i * a.D);
    t.q[i] = qbuf + i * a.D;
    t.scores[i] = scores + i * (a.P + a.S);
    t.out[i] = t.row.out;
  }
  return t;
}

TaskHeads task_heads(const AttentionArgs& a, int64_t s, int64_t h0, int64_t count, float* scratch) {
  thread_local std::vector<float> qbuf;
  qbuf.resize(static_cast<size_t>(kMaxTaskHeads * a.D));
  return task_heads(a, s, h0, count, qbuf.data(), scratch);
}

// A layer's keys and values outgrow the caches at long pasts (SmolLM2: 46 MB a step at 1,000 tokens), so the kernels
// ask for the rows kAheadKeys ahead into L2 as they walk them. Measured on a Zen 4 (session 31, `python
// benchmarks/step_ab.py OLD.so NEW.so --paired --past N`): the whole-model 1-token step 2.7% faster at a 200-token
// past, 6.7% at 1,000 and 7.9% at 1,800, the 2-token step alike, 4- to 16-token steps unchanged.
constexpr int64_t kAheadKeys = 32;

inline void prefetch_rows(const float* first, int64_t D, int64_t rows) {
  const char* bytes = reinterpret_cast<const char*>(first);
  const int64_t size = rows * D * static_cast<int64_t>(sizeof(float));
  for (int64_t b = 0; b < size; b += 64) _mm_prefetch(bytes + b, _MM_HINT_T1);
}

// Scaled scores plus bias of Q queries for the task's keys k0 .. k1-1 (all n when k1 < 0), into scores[i]; top[i]
// becomes the larger of itself and their maximum. A last group of fewer than 4 keys repeats key k1-1 in its empty
// slots and drops their results. Dot4(q, keys, D, out) puts the 4 keys' dot products with query i in out[i]; a
// key's score is the same in any slot, so splitting the keys into ranges changes no score.
template <int Q, class Dot4>
void score_keys(const float* const q[], const RowTask& r, int64_t D, float scale, float* const scores[], float top[],
                Dot4 dot4, int64_t k0 = 0, int64_t k1 = -1) {
  if (k1 < 0) k1 = r.n;
  const __m128 vscale = _mm_set1_ps(scale);
  __m128 vtop[Q];
  for (int i = 0; i < Q; ++i) vtop[i] = _mm_set1_ps(top[i]);
  for (int64_t t = k0; t < k1; t += 4) {
    if (t + kAheadKeys + 4 <= k1) prefetch_rows(r.keys + (t + kAheadKeys) * D, D, 4);
    const float* keys[4];
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

}  // namespace
}  // namespace edge
