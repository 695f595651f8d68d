// The top of each logits row, taken by edge.QMatMul's optional output 2 while the row is still in cache: its first
// maximum's column (numpy's argmax) and value.
//
// Greedy decoding and verification need each row's argmax; read back from the logits after the step, it costs
// ~30 us a row (the rows come from the other core's cache or from memory), ~120 us a verify call of a ~6 ms step
// (session 42, benchmarks/RESULTS.md). Each chunk of the head's columns is scanned right after it is computed, and
// the chunks' tops are merged in column order, so the index is exactly the first maximum of the row. The softmax
// normaliser was left out: 31k of SmolLM2's 49k logits lie within 16 of the maximum, and their exps made an
// 8-token step 6.8% slower.
#pragma once

#include <cstdint>

namespace edge {

struct RowTop {
  float max;
  int64_t index;  // -1: no maximum (an empty range, or only NaN and -inf)
};

// Columns [c0, c1) of one row; `row` points at column c0. NaN is never a maximum (numpy's argmax would pick it).
RowTop row_top(const float* row, int64_t c0, int64_t c1);
RowTop row_top_avx2(const float* row, int64_t c0, int64_t c1);

// Fold `later` (the columns after a's) into a: a tie keeps a's, the first maximum.
inline void merge_top(RowTop& a, const RowTop& later) {
  if (later.index >= 0 && (a.index < 0 || later.max > a.max)) a = later;
}

}  // namespace edge
