// The integer (VNNI) kernel of edge.QMatMul for 4-bit codes, written once over vector traits V and instantiated for
// AVX-512 VNNI (16 lanes = 2 tiles, qmatmul_avx512vnni.cc) and AVX-VNNI (8 lanes = 1 tile, qmatmul_avxvnni.cc).
//
// Why: in fp32 every weight costs a convert and an FMA per row. Here each row's x is put, per group, in block
// floating point: a power of two (xpow) times integers |x_int| <= 2^22, stored as three signed 8-bit digits
// (x_int = d0 + 2^8 d1 + 2^16 d2, see prepare_digits). One vpdpbusd multiplies 4 codes by 4 digits per lane and the
// integer sums are exact; every 32 k the three digit sums are combined exactly in int32 and converted to float once.
// Row m's result depends only on row m of x (its own scales, a fixed flush order), so batch-invariance holds as in
// the fp32 kernels, and both instantiations perform the same per-lane operations (bitwise equal results). The only
// approximation is x rounded to 23 significant bits relative to the largest |x| of its group.
//
// Bounds: per flush |S0|,|S1| <= 32*15*128 and |S2| <= 32*15*65, so |S0 + 2^8 S1 + 2^16 S2| < 2^31.
// accuracy_level 4 (digits = 1) keeps one signed byte per x (|x_int| <= 127 at a power-of-two scale, like
// MatMulNBits' int8 activations but batch-invariant): a third of the work, error ~1e-2 relative instead of 1e-7.
// Include only from the VNNI translation units.
#pragma once

#include "qmatmul.h"
#include "qmatmul_stats.h"

namespace edge {
namespace vnni {

constexpr int kFlushUnits = 4;  // 4 units of 8 k = 32 k per exact integer block
// How far ahead the codes are asked for. Measured on the default model (Zen 5, 2 threads, sizes taking turns):
// with 4 KB its 1-token step took 3.4 ms against 4.2 without and 3.8 with 1 KB (8-16 KB: within the noise of
// 4), its 8-token step 6.3 ms against 6.9. Session 15: one request per 64-byte line (it was one per 32-byte unit)
// and 8 KB ahead made the 1-token step 2-11% and the 8-token step 6-11% faster (benchmarks/RESULTS.md, kernels).
// Session 31 (Zen 4): asked into L2 (kHint) instead of L1, the default model's 1-token step took 18% less (4.21
// against 5.06 ms, paired) and one thread streamed the head's weights at 21 GB/s instead of 13: two streams of
// 8 KB in flight crowd a 32 KB L1, and L2 is where a load finds them soon enough.
constexpr int kPrefetch = 8192;
constexpr auto kHint = _MM_HINT_T1;

// Float16 statistics (what edge's exports write) stream beside the codes, scales and mins a quarter of their bytes,
// and the hardware prefetchers did not keep them coming. Asked for 64 groups ahead (entries of 8 halves, one group
// of a tile; the codes are asked 8 KB ahead), the default model's whole 1-token step ran 7-9% faster and its 8-token
// step 3-4% (Zen 5, `benchmarks/step_ab.py --paired` both ways round, session 45). One request per 64-byte line:
// call it every 4 groups. (With float32 statistics in the same function GCC's dead-code pass dropped every request.)
constexpr int64_t kStatsAhead = 64 * 8;
inline void prefetch_stats(const QMatMulArgs& a, int64_t at, int64_t stride) {
  const uint16_t* halves[2] = {a.scales_f16, a.mins_f16};
  for (const uint16_t* h : halves) {
    if (h == nullptr) continue;
    _mm_prefetch(reinterpret_cast<const char*>(h + at), kHint);
    if (stride != 0) _mm_prefetch(reinterpret_cast<const char*>(h + at + stride), kHint);
  }
}

// Rows [m0, m0 + R) of tiles t and t + 1, or of tile t alone (pair = false: both halves read tile t). D digits per
// x value: 3 (23-bit x, the default) or 1 (int8 x, accuracy_level 4: a third of the vpdpbusd). kOneFlush: groups
// of 32 k, one flush each, so a group's sum is its flush's (0 + x is x) and needs no float register of its own.
// kWhole: the R rows are a whole block of digit_row's layout, so its strides are constants.
template <class V, int R, int D, bool kOneFlush, bool kWhole>
void tile_rows(const QMatMulArgs& a, int64_t t, int64_t m0, bool pair) {
  using F = typename V::F;
  using I = typename V::I;
  const int64_t units_per_group = kOneFlush ? kFlushUnits : a.group / 8;  // a constant: the flush loop unrolls
  const uint8_t* unit = a.codes + t * a.tile_bytes;
  const int64_t group_stride = pair ? a.G * 8 : 0;
  const int64_t tile_stride = pair ? a.tile_bytes : 0;
  const I nibbles = V::set1i(0x0F0F0F0F);
  // int8 x: even and odd k go to two sums per row, else a row's chain waits on vpdpbusd latency; 8 or 9 rows' chains
  // hide it, and 9 rows' two sums each would not fit the registers (576x1536: 39 us spilled, 29 us with one sum;
  // the same integers). At 8 rows one sum was ~1% slower on the Zen 5 (session 14); with the broadcast folded into
  // the vpdpbusd it saves the adds: 8-, 12- and 16-token steps 2-3% faster on the Intel Xeon (session 20,
  // `step_ab.py --paired` both ways round).
  constexpr bool kOneSum = D == 1 && R >= 8;
  const DigitRow row = digit_row(a, m0);  // one pointer serves the R rows
  const int32_t* xd = a.xd + row.words;
  const int64_t unit_stride = kWhole ? R * 2 * D : row.unit_stride;
  const int64_t stat_stride = kWhole ? R : row.group_stride;
  F acc[R];
  // Unrolled here, or GCC turns the loop into a memset and keeps acc[0] in memory, stored after every group.
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  for (int64_t g = 0; g < a.G; ++g) {
    F accg[R];
    for (int r = 0; r < R; ++r) accg[r] = V::zero();
    for (int64_t u0 = 0; u0 < units_per_group; u0 += kFlushUnits) {
      const int64_t flush = units_per_group - u0 < kFlushUnits ? units_per_group - u0 : kFlushUnits;
      I s0[R], s1[R], s2[R];
      for (int r = 0; r < R; ++r) s0[r] = s1[r] = s2[r] = V::set1i(0);
      for (int64_t u = 0; u < flush; ++u, unit += 32) {
        // The codes stream from memory (the weights outgrow the caches); asking for them ahead keeps the stream
        // going while the rows' multiplies run, as in the AVX2 kernel.
        if ((u & 1) == 0) {  // one request per 64-byte line, not one per 32-byte unit
          _mm_prefetch(reinterpret_cast<const char*>(unit) + kPrefetch, kHint);
          if (V::kTiles == 2) _mm_prefetch(reinterpret_cast<const char*>(unit) + tile_stride + kPrefetch, kHint);
        }
        const I w = V::load_codes(unit, tile_stride);
        const I even = V::and_(w, nibbles);
        const I odd = V::and_(V::template srli<4>(w), nibbles);
        const int64_t uu = g * units_per_group + u0 + u;
        for (int r = 0; r < R; ++r) {
          const int32_t* d = xd + uu * unit_stride + r * 2 * D;
          if (D == 1) {
            s0[r] = V::dpbusd_bcast(s0[r], even, d);
            if (kOneSum) s0[r] = V::dpbusd_bcast(s0[r], odd, d + 1);
            else s1[r] = V::dpbusd_bcast(s1[r], odd, d + 1);
            continue;
          }
          s0[r] = V::dpbusd_bcast(s0[r], even, d);
          s1[r] = V::dpbusd_bcast(s1[r], even, d + 1);
          s2[r] = V::dpbusd_bcast(s2[r], even, d + 2);
          s0[r] = V::dpbusd_bcast(s0[r], odd, d + 3);
          s1[r] = V::dpbusd_bcast(s1[r], odd, d + 4);
          s2[r] = V::dpbusd_bcast(s2[r], odd, d + 5);
        }
      }
      for (int r = 0; r < R; ++r) {
        const I total = D == 1 ? (kOneSum ? s0[r] : V::add_i(s0[r], s1[r]))
                               : V::add_i(s0[r], V::add_i(V::template slli<8>(s1[r]), V::template slli<16>(s2[r])));
        accg[r] = kOneFlush ? V::cvt(total) : V::add(accg[r], V::cvt(total));
      }
    }
    const int64_t at = ((t - a.stats_tile0) * a.G + g) * 8;
    if ((g & 3) == 0) prefetch_stats(a, at + kStatsAhead, group_stride);
    const F s = group_scale<V>(a, at, group_stride);
    const F sz = group_sz<V>(a, at, group_stride, s);
    for (int r = 0; r < R; ++r) {
      const int64_t mg = row.stat + g * stat_stride + r;
      acc[r] = V::fmadd(accg[r], V::mul(s, V::set1(a.xpow[mg])), acc[r]);
      acc[r] = V::fnmadd(sz, V::set1(a.xsum[mg]), acc[r]);
    }
  }
  // Every index into acc is a constant below (pair decides before the loops start): a row index that depended on
  // pair made GCC keep acc in memory as well, storing the R accumulators after every group of the loop above.
  alignas(64) float out[16 * V::kTiles];
  constexpr int kPairs = V::kTiles == 2 ? R / 2 * 2 : 0;  // rows finished two at a time when pair
  if (pair) {
#pragma GCC unroll 16
    for (int r = 0; r < kPairs; r += 2) {
      V::store(out, acc[r]);
      V::store(out + 16, acc[r + 1]);
      finish_tile_pairs_avx512(a, m0 + r, t, out);
    }
#pragma GCC unroll 16
    for (int r = kPairs; r < R; ++r) {
      V::store(out, acc[r]);
      if (V::kTiles == 2) finish_tile_pair_avx2(a, m0 + r, t, out);
      else finish_tile_row_avx2(a, m0 + r, t, out);
    }
    return;
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    V::store(out, acc[r]);
    finish_tile_row_avx2(a, m0 + r, t, out);
  }
}

// Rows in blocks: 8 at int8 x in groups of 32 with AVX-512 (two vpdpbusd per row and unit, so the codes' decoding
// is shared by 8 rows, and 8 rows' accumulators fit its 32 registers; a last block of 9 rows, see digit_row, runs
// as one), else 4 (three digits: six per row; AVX-VNNI: 16 registers). Measured on the default model (Zen 5,
// 2 threads, sizes taking turns): an 8-token step 6.9 ms instead of 8.0.
template <class V, int D, bool kOneFlush>
void tile_all_rows(const QMatMulArgs& a, int64_t t, bool pair) {
  constexpr int kBlock = D == 1 && kOneFlush && V::kTiles == 2 ? 8 : 4;
  constexpr bool kWhole = kBlock == kDigitRows;  // then every call below runs a whole block
  int64_t m0 = 0;
  if constexpr (kBlock == 8) {
    const int64_t last = last_digit_block(a.M);
    for (; m0 < last; m0 += kBlock) tile_rows<V, kBlock, D, kOneFlush, kWhole>(a, t, m0, pair);
    if (a.M - m0 == 9) return tile_rows<V, 9, D, kOneFlush, true>(a, t, m0, pair);
  }
  for (; m0 + kBlock <= a.M; m0 += kBlock) tile_rows<V, kBlock, D, kOneFlush, kWhole>(a, t, m0, pair);
  switch (a.M - m0) {
    case 1:  // one row alone (plain decoding) is a whole block
      (a.M == 1 ? tile_rows<V, 1, D, kOneFlush, true> : tile_rows<V, 1, D, kOneFlush, kWhole>)(a, t, m0, pair);
      break;
    case 2: tile_rows<V, 2, D, kOneFlush, kWhole>(a, t, m0, pair); break;
    case 3: tile_rows<V, 3, D, kOneFlush, kWhole>(a, t, m0, pair); break;
    default: break;
  }
  if constexpr (kBlock == 8) {
    switch (a.M - m0) {
      case 4: tile_rows<V, 4, D, kOneFlush, kWhole>(a, t, m0, pair); break;
      case 5: tile_rows<V, 5, D, kOneFlush, kWhole>(a, t, m0, pair); break;
      case 6: tile_rows<V, 6, D, kOneFlush, kWhole>(a, t, m0, pair); break;
      case 7: tile_rows<V, 7, D, kOneFlush, kWhole>(a, t, m0, pair); break;
      default: break;
    }
  }
}

template <class V, int D, bool kOneFlush>
void run_tiles_digits(const QMatMulArgs& a, int64_t t0, int64_t t1) {
  int64_t t = t0;
  for (; t + V::kTiles <= t1; t += V::kTiles) tile_all_rows<V, D, kOneFlush>(a, t, true);
  if (t < t1) tile_all_rows<V, D, kOneFlush>(a, t, false);
}

// Tiles [t0, t1); with two tiles per vector an odd last tile reads itself twice and keeps the lower half.
template <class V>
void run_tiles(const QMatMulArgs& a, int64_t t0, int64_t t1) {
  const bool one_flush = a.group == 8 * kFlushUnits;
  if (a.digits == 1) (one_flush ? run_tiles_digits<V, 1, true> : run_tiles_digits<V, 1, false>)(a, t0, t1);
  else (one_flush ? run_tiles_digits<V, 3, true> : run_tiles_digits<V, 3, false>)(a, t0, t1);
}

}  // namespace vnni
}  // namespace edge
