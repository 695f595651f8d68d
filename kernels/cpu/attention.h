// edge.Attention: GroupQueryAttention's contract (batch 1, rotary inside, KV cache written in place, optional tree
// bias) with every output row computed by the same sequence of float operations whatever the number of rows.
//
// Why: a verify step scores S draft tokens in one call, and greedy speculation is exact only if each row equals what
// a 1-token step computes. ORT's GroupQueryAttention takes another GEMM path for several rows (differences ~1e-7),
// and with int8 activations (edge.QMatMul accuracy_level 4) the next layer's rounding of x amplifies that into
// different tokens on near-ties. Here each (row, head) is one task: its scores, softmax and weighted sum run over the
// keys in order (a long row's in two halves, merged: first_half), and a key masked by the tree bias contributes an
// exact zero, so a row of a tree sees the same sums as the same token decoded alone after the accepted path was
// compacted into place.
#pragma once

#include <algorithm>
#include <cstdint>

#include "rms_norm.h"

namespace edge {

struct AttentionArgs {
  int64_t S = 0, P = 0, L = 0;  // new rows, tokens already cached, cache capacity (present's third dimension)
  int64_t H = 0, KV = 0, D = 0;
  float scale = 0.0f;
  int64_t window = 0;  // > 0: a query at position p sees keys p-window+1 .. p (local_window_size); 0: all
  const float* q = nullptr;  // row s, head h at q + s * q_stride + h * D
  const float* k = nullptr;  // new keys: row s, kv head g at k + s * kv_stride + g * D
  const float* v = nullptr;
  int64_t q_stride = 0, kv_stride = 0;
  const float* cos = nullptr;  // (rope_rows, D / 2)
  const float* sin = nullptr;
  int64_t rope_rows = 0;
  const int64_t* positions = nullptr;  // (S,)
  const float* bias = nullptr;  // (S, P + S) or null
  // Gemma 3's q_norm / k_norm: each head's query and key RMS-normalised with these (D,) weights before the rotary
  // embedding; null: none. Inside the op, not as nodes around it: the norms' Split, Reshapes and two norm nodes
  // were 7 of a Gemma 3 layer's 14 nodes, each paying onnxruntime's dispatch.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float norm_eps = 0.0f;
  float* kcache = nullptr;  // (KV, L, D), already holding the new rows when rows are attended
  float* vcache = nullptr;
  // The same in IEEE half (a package exported with kv_dtype float16; kcache and vcache are then null): a long
  // context's keys and values are read every step, 92 MB at 2,000 tokens of SmolLM2 in float32, more than its int4
  // weights, so half the bytes is most of a long-context step's attention. Rows are widened to float32 as they are
  // read, and the arithmetic after is the float32 cache's, so rows stay independent of the call's size.
  uint16_t* kcache16 = nullptr;
  uint16_t* vcache16 = nullptr;
  float* out = nullptr;  // (S, H * D)
  // Which half of a long row's keys a task attends (first_half), and where each (half, row, head) leaves its
  // softmax's maximum and sum for the merge; null: no row of the call is split.
  int64_t key_half = 0;
  float* half_stats = nullptr;  // (2, S, H, 2)
};

// A row whose position gives it at least this many keys is attended as two halves of its keys, each normalised on
// its own and merged after (flash-decoding's split): a 1-token step has one task per kv head, 3 for SmolLM2, and
// two threads took them 2 + 1; halves make 6 of equal cost (whole-model 1-token step 4.5% faster at a 400-token
// past, 9% at 1,000, 12% at 1,800; at a 200-token past the halves' own costs ate the gain, hence 384). Whether and
// where a row is split depends on its position alone, never on how many rows share the call, so rows stay what
// they are attended alone.
constexpr int64_t kSplitKeys = 384;

// Keys row s sees: causal up to P+s, and a sliding window counted back from the query's position, not its cache
// row, so that a tree node sees the same keys as its path decoded alone. Returns the first one's cache row.
inline int64_t visible_keys(const AttentionArgs& a, int64_t s, int64_t& n) {
  const int64_t first = a.window > 0 ? std::max<int64_t>(0, a.positions[s] - a.window + 1) : 0;
  n = a.P + s + 1 - first;
  return first;
}

// Keys in the first half of row s, which sees the n cache rows from `first` (all n when it is not split). Counted
// from the row's position, not n: a tree node's cache rows include its masked non-ancestors, which its path decoded
// alone after compaction does not have, and both must split at the same key. Half of the position's keys lies in
// the past (a tree is at most 64 rows deep), so the first half is the same past keys for both, and the second half
// adds the same keys in the same order, masked ones adding exact zeros.
inline int64_t first_half(const AttentionArgs& a, int64_t s, int64_t first, int64_t n) {
  const int64_t span = a.positions[s] + 1 - first;
  return span >= kSplitKeys ? std::clamp<int64_t>(span / 2, 0, n) : n;
}

// The merge's input for one (row, head) of this task's half: its scores' maximum and the sum of their exponentials.
inline void record_half(const AttentionArgs& a, int64_t s, int64_t h, float top, float sum) {
  if (a.half_stats == nullptr) return;
  float* slot = a.half_stats + ((a.key_half * a.S + s) * a.H + h) * 2;
  slot[0] = top;
  slot[1] = sum;
}

// Rotary embedding of one head vector (non-interleaved halves), as GroupQueryAttention's do_rotary=1. out may be x.
inline void rotate_half(const float* x, const float* cos, const float* sin, int64_t half, float* out) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    out[i] = a * cos[i] - b * sin[i];
    out[i + half] = b * cos[i] + a * sin[i];
  }
}

// A head vector as the rotary embedding sees it: RMS-normalised first when the layer has q/k norms (`weight`), with
// the arithmetic of edge.QMatMul's norms (rms_norm.h), the same bits for a row whatever shares the call.
inline void rotate_head(const float* x, const float* weight, float eps, int64_t D, const float* cos, const float* sin,
                        float* out) {
  if (weight != nullptr) {
    rms_norm_rows(x, nullptr, weight, eps, 1, D, nullptr, out);
    x = out;
  }
  rotate_half(x, cos, sin, D / 2, out);
}

// The cache's element type T (float, or uint16_t for IEEE half) in the (KV, L, D) buffer.
template <class T>
T* cache_of(const AttentionArgs& a, bool values);
template <>
inline float* cache_of<float>(const AttentionArgs& a, bool values) { return values ? a.vcache : a.kcache; }
template <>
inline uint16_t* cache_of<uint16_t>(const AttentionArgs& a, bool values) { return values ? a.vcache16 : a.kcache16; }

// What one (row, head) task reads and writes: the query rotated into `q` (head_dim floats), the keys it sees (its kv
// head's visible_keys, or the half of them `a.key_half` names), their values and bias (or null), and its output slice.
// Pointers are offset to `first`: index 0 is key `first`. A row not split has no second half (n = 0).
template <class T = float>
struct RowTask {
  const T* keys;
  const T* values;
  const float* bias;
  int64_t n;
  float* out;
  int64_t first;  // the cache row of key 0
};

template <class T = float>
inline RowTask<T> row_task(const AttentionArgs& a, int64_t s, int64_t h, float* q) {
  const int64_t D = a.D, half = D / 2, pos = a.positions[s], g = h / (a.H / a.KV);
  rotate_head(a.q + s * a.q_stride + h * D, a.q_norm, a.norm_eps, D, a.cos + pos * half, a.sin + pos * half, q);
  int64_t n = 0, first = visible_keys(a, s, n);
  const int64_t head = first_half(a, s, first, n);
  if (a.key_half == 0) {
    n = head;
  } else {
    first += head;
    n -= head;
  }
  const float* bias = a.bias != nullptr ? a.bias + s * (a.P + a.S) + first : nullptr;
  return {cache_of<T>(a, false) + (g * a.L + first) * D, cache_of<T>(a, true) + (g * a.L + first) * D, bias, n,
          a.out + s * a.H * D + h * D, first};
}

// Query heads that share a kv head see the same keys, values and bias, so one task attends `count` of them for one
// row: their dot products read each key once and their weighted sums each block of values once (a layer's keys
// and values outgrow L1, and one head at a time was bound by reading them back from L2). Each head's arithmetic is
// the same whichever heads share its task. At most kMaxTaskHeads heads per task: more would spill registers.
constexpr int64_t kMaxTaskHeads = 3;

// Heads per task: the kv group split evenly into the fewest blocks of at most kMaxTaskHeads.
inline int64_t heads_per_task(const AttentionArgs& a) {
  const int64_t group = a.H / a.KV, blocks = (group + kMaxTaskHeads - 1) / kMaxTaskHeads;
  return (group + blocks - 1) / blocks;
}

// Tasks per row and kv head (the last may hold fewer heads).
inline int64_t task_blocks(const AttentionArgs& a) {
  const int64_t group = a.H / a.KV, heads = heads_per_task(a);
  return (group + heads - 1) / heads;
}

// At most this many rows per task. A task's rows share every block of its kv head's keys and values while the
// block is in L1: one row at a time, each row streamed the layer's cache from L2 or memory again (an 8-row verify
// step at a 1000-token past spent over 40% of its time in attention; 4-8% less for 6-16 rows with the sharing).
constexpr int64_t kMaxTaskRows = 8;

// Rows s0 .. s1-1 (at most kMaxTaskRows), heads h0 .. h0+count-1 (one kv group); `scratch` holds
// (s1 - s0) * count * (P + S) floats (their scores). Each row's arithmetic is that of the row attended alone.
using AttendFn = void (*)(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch);
void attend_portable(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch);
void attend_avx2(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch);
void attend_avx512(const AttentionArgs& a, int64_t s0, int64_t s1, int64_t h0, int64_t count, float* scratch);

// The kernel this process uses (the same ISA choice as edge.QMatMul's; AVX-512 needs D % 16 == 0, AVX2 D % 8 == 0).
AttendFn select_attend_fn(int64_t head_dim);

// n floats rounded to IEEE half, to nearest even (float_to_half's bits; F16C where the AVX2 kernels run): a half
// cache's new rows, 11,520 values a 1-token step of SmolLM2, which float_to_half one at a time made ~3% of it.
using NarrowFn = void (*)(const float* in, int64_t n, uint16_t* out);
void narrow_portable(const float* in, int64_t n, uint16_t* out);
void narrow_avx2(const float* in, int64_t n, uint16_t* out);
NarrowFn select_narrow_fn();

}  // namespace edge
