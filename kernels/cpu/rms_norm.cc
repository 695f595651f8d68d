// RMSNorm before edge.QMatMul's matmul (rms_norm.h). Portable code: 16 independent lanes, which the compiler
// vectorises without reassociating anything (-ffp-contract=off keeps the products rounded as written).
#include "rms_norm.h"

#include <cmath>

namespace edge {

namespace {

constexpr int kLanes = 16;

float sum_of_squares(const float* h, int64_t k) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += h[i + j] * h[i + j];
  for (int j = 0; i + j < k; ++j) lane[j] += h[i + j] * h[i + j];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  return lane[0];
}

}  // namespace

void rms_norm_rows(const float* x, const float* skip, const float* weight, float epsilon, int64_t rows, int64_t k,
                   float* sum, float* out) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* h = x + m * k;
    if (skip != nullptr) {
      float* s = sum + m * k;
      for (int64_t i = 0; i < k; ++i) s[i] = h[i] + skip[m * k + i];
      h = s;
    }
    const float r = 1.0f / std::sqrt(sum_of_squares(h, k) / static_cast<float>(k) + epsilon);
    float* o = out + m * k;
    for (int64_t i = 0; i < k; ++i) o[i] = (h[i] * r) * weight[i];
  }
}

#if !defined(__x86_64__) && !defined(_M_X64)
void rms_norm_rows_avx2(const float* x, const float* skip, const float* weight, float epsilon, int64_t rows,
                        int64_t k, float* sum, float* out) {
  rms_norm_rows(x, skip, weight, epsilon, rows, k, sum, out);
}
#endif

}  // namespace edge
