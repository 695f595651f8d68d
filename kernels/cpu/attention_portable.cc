// The portable edge.Attention kernel, and the choice between it and the AVX2 one.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention.h"
#include "qmatmul.h"

namespace edge {

void attend_portable(const AttentionArgs& a, int64_t s, int64_t h, float* scores) {
  const int64_t D = a.D, half = D / 2, n = a.P + s + 1;  // causal: keys 0 .. P+s
  const int64_t pos = a.positions[s];
  thread_local std::vector<float> q, acc;
  q.resize(static_cast<size_t>(D));
  acc.assign(static_cast<size_t>(D), 0.0f);
  rotate_half(a.q + s * a.q_stride + h * D, a.cos + pos * half, a.sin + pos * half, half, q.data());
  const int64_t g = h / (a.H / a.KV);
  const float* keys = a.kcache + g * a.L * D;
  const float* values = a.vcache + g * a.L * D;
  const float* bias = a.bias != nullptr ? a.bias + s * (a.P + a.S) : nullptr;
  float top = -INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    float dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) dot += q[d] * keys[t * D + d];
    scores[t] = dot * a.scale + (bias != nullptr ? bias[t] : 0.0f);
    top = std::max(top, scores[t]);
  }
  float sum = 0.0f;
  for (int64_t t = 0; t < n; ++t) {
    const float e = std::exp(scores[t] - top);
    sum += e;
    for (int64_t d = 0; d < D; ++d) acc[d] += e * values[t * D + d];
  }
  float* out = a.out + s * a.H * D + h * D;
  for (int64_t d = 0; d < D; ++d) out[d] = acc[d] / sum;
}

AttendFn select_attend_fn(int64_t head_dim) {
  return uses_avx2() && head_dim % 8 == 0 ? attend_avx2 : attend_portable;
}

}  // namespace edge
