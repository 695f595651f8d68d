// edge.QMatMul: y = x W^T (+ bias) with W stored as 2/3/4/8-bit codes in groups, optional CSR outliers.
//
// The packed layout (written by edge.kernels.pack, documented there) is "tile-major": output columns come in tiles of
// 8, and for each tile the codes of 8..16 consecutive k for all 8 columns sit in one 32- or 48-byte unit, one 32-bit
// word per column. One vector load then yields the codes of 8 columns, and a shift and a mask per k decode them, so
// the kernel vectorises across the 8 columns: every output element is a plain sequential sum over k inside one
// vector lane. That gives the batch-invariance the runtime needs for exact speculation: row m of y depends only on
// row m of x, whatever M is and whatever the other rows hold, because rows never share a reduction or a quantisation.
//
// Per group g of a tile: acc += s * sum_k(q_k x_k) - (s z) * sum_k(x_k); the second sum is computed once per row and
// group (row_group_sums), so the inner loop is decode + one FMA per row; the decode is shared by all rows of a call.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace edge {

struct QMatMulArgs {
  const float* x = nullptr;  // M rows of ldx floats; columns K..Kp-1 are zero when Kp > K
  int64_t ldx = 0;
  int64_t M = 0, K = 0, N = 0;
  int bits = 4;
  int64_t group = 32;
  int64_t Kp = 0;      // K rounded up to a multiple of group
  int64_t G = 0;       // groups per column = Kp / group
  int64_t tiles = 0;   // ceil(N / 8)
  int64_t tile_bytes = 0;
  const uint8_t* codes = nullptr;
  // Statistics, each (tiles, G, 8): scales float32 or float16 (scales_f16), and at most one of zero points
  // (W = (code - zero) * scale; uint8 or float32) or mins (W = code * scale + min, GGUF Q4_1's form; float32 or
  // float16); neither: zero 2^(bits-1). See qmatmul_stats.h.
  const float* scales = nullptr;
  const uint16_t* scales_f16 = nullptr;
  const uint8_t* zeros_u8 = nullptr;
  const float* zeros_f32 = nullptr;
  const float* mins_f32 = nullptr;
  const uint16_t* mins_f16 = nullptr;
  int64_t stats_tile0 = 0;  // the statistics arrays start at this tile (a block expanded from two-level ones)
  // SpQR's two levels: scales (and zero points) given as uint8 codes (tiles, G, 8) of a second-level grid, value =
  // base + step * code in float32 (multiply, then add), with float16 (base, step) pairs (R, G, 2) per stat row and
  // group, and stat_rows (tiles * 2) naming the row of each half tile (4 columns). See expand_two_level.
  const uint8_t* scale_codes = nullptr;
  const uint16_t* scale_stats = nullptr;
  const uint8_t* zero_codes = nullptr;
  const uint16_t* zero_stats = nullptr;
  const int32_t* stat_rows = nullptr;
  int64_t stat_row_count = 0;
  const float* scale_stats_f32 = nullptr;  // the (base, step) tables widened once per call (widen_halves)
  const float* zero_stats_f32 = nullptr;
  const float* bias = nullptr;         // (N,)
  const uint16_t* outlier_values = nullptr;  // float16 (nnz,)
  const int32_t* outlier_cols = nullptr;     // (nnz,)
  const int32_t* outlier_rowptr = nullptr;   // (N + 1,)
  int64_t outlier_nnz = 0;
  const float* xq = nullptr;    // x as the vector kernels read it (see qmatmul_simd.h); x itself for 3-bit
  const int32_t* xd = nullptr;  // integer kernels: per row and 8-k unit, 2 * digits words of signed 8-bit digits
  int digits = 3;               // integer kernels: 3 (x to 23 bits) or 1 (x to int8: accuracy_level 4)
  const float* xpow = nullptr;   // integer kernels: (M, G) power-of-two scale of each row's group
  const float* xsum = nullptr;  // (M, G): per row and group sum of x, see row_group_sums
  float* y = nullptr;           // (M, N), or (M, N / 2) when gated
  // gated (the op's attribute activation): 0 none; 1 silu(gate) * up (Llama's MLP), 2 gelu_tanh(gate) * up
  // (Gemma's). W's rows then come as tiles of 4 gate rows and the 4 matching up rows, and Y has N / 2 columns: the
  // MLP's gated activation fused, with no Split, activation and Mul nodes.
  int gated = 0;
};

// Layout constants shared with the Python packer.
inline int unit_k(int bits) { return bits == 4 ? 8 : (bits == 8 ? 4 : 16); }
inline int unit_bytes(int bits) { return bits == 3 ? 48 : 32; }

// Fill args.tile_bytes, Kp, G and tiles from K, N, bits and group.
void finish_layout(QMatMulArgs& a);

// Sums of x over each group, per row, in a fixed order (shared by every code path).
void row_group_sums(const QMatMulArgs& a, float* out);

// Add outliers and bias to the 8 dense results of one tile and row, and store the columns that exist (gated: the
// activation of the tile's 4 gate columns times their up columns).
void finish_tile_row(const QMatMulArgs& a, int64_t m, int64_t tile, const float* dense8);
// The same with AVX2 (bias and the gate activation 8 lanes at once; calls finish_tile_row for outliers and a partial
// last tile), for the x86 vector kernels: the scalar form took a third of an 8-row fused gate/up matmul.
void finish_tile_row_avx2(const QMatMulArgs& a, int64_t m, int64_t tile, const float* dense8);
// Tiles `tile` and `tile + 1` of one row (16 dense results): a gated pair's 8 gates go through the activation in one
// vector instead of two half-used ones (the same operations per lane, so the same bits). The activation took ~7% of
// an 8-token SmolLM2 step on an Intel Xeon (perf), half of it on lanes whose result was dropped.
void finish_tile_pair_avx2(const QMatMulArgs& a, int64_t m, int64_t tile, const float* dense16);
// Rows m and m + 1 of tiles `tile` and `tile + 1` (32 dense results, row m's 16 first), AVX-512: both rows' 16 gates
// in one vector, the same operations per lane again. Only in the AVX-512 VNNI translation unit.
void finish_tile_pairs_avx512(const QMatMulArgs& a, int64_t m, int64_t tile, const float* dense32);

// Tiles [t0, t1) of two-level statistics in float32, as float32 statistics of those tiles: scales and (when
// zero_codes) float zero points, each (t1 - t0, G, 8), from the widened tables (scale_stats_f32, zero_stats_f32).
// Arithmetic as edge.kernels.pack.TwoLevel.values (product rounded, then the sum); the AVX2 form gives the same bits.
void expand_two_level(const QMatMulArgs& a, int64_t t0, int64_t t1, float* scales, float* zeros);
void expand_two_level_avx2(const QMatMulArgs& a, int64_t t0, int64_t t1, float* scales, float* zeros);
// float16 -> float32 for n values (exact); the AVX2 form uses F16C.
void widen_halves(const uint16_t* in, int64_t n, float* out);
void widen_halves_avx2(const uint16_t* in, int64_t n, float* out);

// Compute tiles [t0, t1) for all rows. The AVX2 variant exists only when compiled on x86-64.
void qmatmul_tiles_portable(const QMatMulArgs& a, int64_t t0, int64_t t1);
void qmatmul_tiles_avx2(const QMatMulArgs& a, int64_t t0, int64_t t1);
void qmatmul_tiles_avx2_int8(const QMatMulArgs& a, int64_t t0, int64_t t1);  // 4-bit, digits = 1 only
void qmatmul_tiles_avx512(const QMatMulArgs& a, int64_t t0, int64_t t1);
void qmatmul_tiles_avx512vnni(const QMatMulArgs& a, int64_t t0, int64_t t1);  // 4-bit only
void qmatmul_tiles_avxvnni(const QMatMulArgs& a, int64_t t0, int64_t t1);     // 4-bit only

// Where the integer kernels find row m's x (xd) and its per-group scale and sum (xpow, xsum). Rows come in blocks of
// kDigitRows (the last block: the rows left, and a lone last row joins the block before it: a draft of 8 tokens is
// verified as 9 rows, and a ninth row run alone made that step 13% dearer than 8 rows); a block stores, unit by unit
// of 8 k, the 2 * digits words of each of its rows in turn, and group by group each row's xpow and xsum, so the rows
// one kernel call runs together read one stream of x instead of one per row: 8 row streams (8 pointers, and accesses
// spread over 8 lines) cost the 8-row AVX-512 VNNI loop 10-12% (measured on a Zen 5, one core, SmolLM2's shapes).
// One row alone is laid out as before.
constexpr int64_t kDigitRows = 8;
struct DigitRow {
  int64_t words, unit_stride;  // row m's first unit in xd, and the words from one of its units to the next
  int64_t stat, group_stride;  // row m's group 0 in xpow and xsum, and the entries from one group to the next
};
inline int64_t last_digit_block(int64_t M) {  // the first row of the last block
  const int64_t last = (M - 1) - (M - 1) % kDigitRows;
  return M - last == 1 && last > 0 ? last - kDigitRows : last;
}
inline DigitRow digit_row(const QMatMulArgs& a, int64_t m) {
  const int64_t last = last_digit_block(a.M);
  const int64_t first = m >= last ? last : m - m % kDigitRows, rows = m >= last ? a.M - last : kDigitRows;
  const int64_t words = 2 * a.digits;
  return {(first * (a.Kp / 8) + m - first) * words, rows * words, first * a.G + m - first, rows};
}
// The loops every digit preparation shares: group(x, out, unit_stride, pow_out, sum_out) for each group of rows
// [m0, m1) (a call's rows may be prepared in parts, on several threads).
template <class Group>
void prepare_rows(const QMatMulArgs& a, int64_t m0, int64_t m1, int32_t* xd, float* xpow, float* xsum, Group group) {
  for (int64_t m = m0; m < m1; ++m) {
    const DigitRow row = digit_row(a, m);
    for (int64_t g = 0; g < a.G; ++g) {
      const int64_t stat = row.stat + g * row.group_stride;
      group(a.x + m * a.ldx + g * a.group, xd + row.words + g * (a.group / 8) * row.unit_stride, row.unit_stride,
            xpow + stat, xsum + stat);
    }
  }
}

// For the VNNI kernel: x in block floating point per row and group (|x_int| <= 2^22 times a power of two, xpow),
// written as three signed 8-bit digits in the order the kernel reads them; xsum receives the sums of the rounded x.
// Rows [m0, m1) of them. xd holds M * Kp/8 * 2 * a.digits int32, xpow and xsum M * G floats, laid out as digit_row
// says. With a.digits == 1, |x_int| <= 127 in one byte.
void prepare_digits(const QMatMulArgs& a, int64_t m0, int64_t m1, int32_t* xd, float* xpow, float* xsum);

// How one row's group of x becomes integers: x_int = round(x * mul), x ~ x_int * step. Three digits: a power of two
// with |x_int| <= 2^22 (exact scaling, 23 bits). One digit: step = amax / 127 as MatMulNBits does, because a power
// of two would waste up to a bit of the byte. Shared so the scalar and vector preparations round identically.
struct DigitScale {
  float mul, step;
};
inline DigitScale digit_scale(float amax, int digits) {
  if (digits == 1) return amax > 0.0f ? DigitScale{127.0f / amax, amax / 127.0f} : DigitScale{1.0f, 0.0f};
  int e = 0;
  if (amax > 0.0f) std::frexp(amax, &e);                 // amax < 2^e
  const int shift = 22 - e < 126 ? 22 - e : 126;         // tiny groups keep fewer bits
  return {std::ldexp(1.0f, shift), std::ldexp(1.0f, -shift)};
}
// The same output, faster; prepare_int8_avx2 for digits == 1 only.
void prepare_digits_avx512(const QMatMulArgs& a, int64_t m0, int64_t m1, int32_t* xd, float* xpow, float* xsum);
void prepare_int8_avx2(const QMatMulArgs& a, int64_t m0, int64_t m1, int32_t* xd, float* xpow, float* xsum);

// The activations the vector kernels read: code i of a packed word is decoded in place as q * 2^(bits*i), so x[k] is
// scaled by 2^-(bits*i) (exact), except for the last code of a word, which is shifted down. out is (M, ldx).
void prescale_x(const QMatMulArgs& a, float* out);

// The variant chosen once at load time, the best the CPU runs: AVX-512 VNNI (4-bit; fp32 AVX-512 otherwise),
// AVX-512F, AVX-VNNI (4-bit; fp32 AVX2 otherwise), AVX2+FMA, portable; 4-bit at digits = 1 (int8 x) takes the AVX2
// int8 kernel on CPUs with AVX2 but no VNNI. EDGE_KERNELS_ISA=portable|avx2|avxvnni|
// avx512|avx512vnni picks one the CPU supports instead (tests use it to compare the paths).
using TilesFn = void (*)(const QMatMulArgs&, int64_t, int64_t);
TilesFn select_tiles_fn(int bits, int digits);

// Whether fn reads x as digits (prepare_digits) rather than as floats.
bool reads_digits(TilesFn fn);

// Whether this process runs the AVX2 (or wider) kernels: the CPU has them and EDGE_KERNELS_ISA does not say portable.
bool uses_avx2();
// Whether it runs the AVX-512 kernels (avx512 or avx512vnni chosen).
bool uses_avx512();

float half_to_float(uint16_t h);

// The gate activations: x * sigmoid(x), and GELU's tanh form, 0.5 x (1 + tanh(u)) = x * sigmoid(2u) with
// u = sqrt(2/pi) (x + 0.044715 x^3): one exp like SiLU (libm's tanh cost Gemma 3's fused prefill 16%), and no
// cancellation in 1 + tanh for very negative x.
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float gelu_tanh(float x) { return x / (1.0f + std::exp(-1.5957691216f * (x + 0.044715f * x * x * x))); }
inline float gate_activation(int gated, float x) { return gated == 1 ? silu(x) : gelu_tanh(x); }
uint16_t float_to_half(float f);  // round to nearest even, as every IEEE conversion

}  // namespace edge
