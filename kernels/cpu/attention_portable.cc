// The portable edge.Attention kernel, and the choice between it and the AVX2 one.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention.h"
#include "qmatmul.h"

namespace edge {

namespace {

inline float widen(float x) { return x; }
inline float widen(uint16_t h) { return half_to_float(h); }

template <class T>
void attend_head(const AttentionArgs& a, int64_t s, int64_t h, float* scores) {
  const int64_t D = a.D;
  thread_local std::vector<float> q, acc;
  q.resize(static_cast<size_t>(D));
  acc.assign(static_cast<size_t>(D), 0.0f);
  const RowTask<T> r = row_task<T>(a, s, h, q.data());
  float top = -INFINITY;
  for (int64_t t = 0; t < r.n; ++t) {
    float dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) dot += q[d] * widen(r.keys[t * D + d]);
    scores[t] = dot * a.scale + (r.bias != nullptr ? r.bias[t] : 0.0f);
    top = std::max(top, scores[t]);
  }
  float sum = 0.0f;
  for (int64_t t = 0; t < r.n; ++t) {
    const float e = std::exp(scores[t] - top);
    sum += e;
    for (int64_t d = 0; d < D; ++d) acc[d] += e * widen(r.values[t * D + d]);
  }
  for (int64_t d = 0; d < D; ++d) r.out[d] = acc[d] / sum;
  record_half(a, s, h, top, sum);
}

}  // namespace

void attend_portable(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch) {
  const auto head = a.kcache16 != nullptr ? attend_head<uint16_t> : attend_head<float>;
  for (int64_t s = s0; s < s1; ++s)
    for (int64_t h = h0; h < h0 + count; ++h) head(a, s, h, scratch);
}

void narrow_portable(const float* in, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_half(in[i]);
}

NarrowFn select_narrow_fn() { return uses_avx2() ? narrow_avx2 : narrow_portable; }

AttendFn select_attend_fn(int64_t head_dim) {
  if (uses_avx512() && head_dim % 16 == 0) return attend_avx512;
  return uses_avx2() && head_dim % 8 == 0 ? attend_avx2 : attend_portable;
}

}  // namespace edge
