#include <immintrin.h>

#include <cmath>

#include "row_top.h"

namespace edge {

// The maximum first, 8 columns at a time, then the first column holding it.
RowTop row_top_avx2(const float* row, int64_t c0, int64_t c1) {
  const int64_t n = c1 - c0;
  int64_t i = 0;
  __m256 top8 = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) top8 = _mm256_max_ps(_mm256_loadu_ps(row + i), top8);  // a NaN lane keeps top8's
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top8);
  float max = -INFINITY;
  for (float v : lanes) max = v > max ? v : max;
  for (; i < n; ++i) max = row[i] > max ? row[i] : max;
  if (!(max > -INFINITY)) return {max, -1};
  const __m256 target = _mm256_set1_ps(max);
  for (i = 0; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), target, _CMP_EQ_OQ));
    if (hit) return {max, c0 + i + __builtin_ctz(static_cast<unsigned>(hit))};
  }
  for (; i < n; ++i)
    if (row[i] == max) return {max, c0 + i};
  return {max, -1};  // not reached: max is one of the row's values
}

}  // namespace edge
