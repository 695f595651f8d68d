#include "row_top.h"

#include <cmath>

namespace edge {

RowTop row_top(const float* row, int64_t c0, int64_t c1) {
  RowTop t{-INFINITY, -1};
  for (int64_t i = 0; i < c1 - c0; ++i)
    if (row[i] > t.max) t = {row[i], c0 + i};
  return t;
}

}  // namespace edge
