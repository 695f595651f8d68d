// The vector kernel of edge.QMatMul, written once over a small "vector traits" type V and instantiated by the AVX2
// (8 lanes = 1 tile) and AVX-512 (16 lanes = 2 tiles) translation units. Include only from those units.
//
// Every lane performs the same operation sequence in both instantiations (per k: one FMA per row; per group: one FMA
// with the scale and one with the zero offset), so AVX2 and AVX-512 give bitwise identical outputs, and a row's
// output never depends on which other rows or tiles share the call.
//
// Decoding trick for 4- and 2-bit codes: instead of shifting code i of a word down, we mask it in place; the integer
// q * 2^(bits*i) converts to float exactly, and the activation was prescaled by 2^-(bits*i) (QMatMulArgs::xq, exact
// in binary floating point). The product is the same real number as q * x, so the FMA rounds identically; decode
// costs a mask and a convert per k. The last code of a word is shifted down instead (it would not fit a signed int).
#pragma once

#include "qmatmul.h"
#include "qmatmul_stats.h"

namespace edge {
namespace simd {

template <class V, int BITS>
struct Decoder {  // 2-, 4- and 8-bit codes: a 32-bit word per column holds 32 / BITS consecutive k
  static constexpr int kUnitK = 32 / BITS;
  static constexpr int kUnitBytes = 32;
  typename V::I w;
  Decoder(const uint8_t* unit, int64_t tile_stride) : w(V::load_unit(unit, tile_stride)) {}
  template <int i>
  typename V::F get() const {
    if constexpr (i == kUnitK - 1) return V::cvt(V::template srli<32 - BITS>(w));
    else return V::cvt(V::and_(w, V::set1i(static_cast<int>(((1u << BITS) - 1) << (BITS * i)))));
  }
};

// 3-bit codes combine two planes, so they are shifted down (activations are not prescaled for 3-bit).
template <class V>
struct Decoder<V, 3> {
  static constexpr int kUnitK = 16;
  static constexpr int kUnitBytes = 48;
  typename V::I lo, hi;
  Decoder(const uint8_t* unit, int64_t tile_stride)
      : lo(V::load_unit(unit, tile_stride)), hi(V::template slli<2>(V::load_u16_unit(unit + 32, tile_stride))) {}
  template <int i>
  typename V::F get() const {
    const auto l = V::and_(V::template srli<2 * i>(lo), V::set1i(3));
    const auto h = V::and_(V::template srli<i>(hi), V::set1i(4));
    return V::cvt(V::or_(l, h));
  }
};

template <class D, class V, int R, int i>
inline void step(const D& dec, const float* const* xr, int64_t k, typename V::F* accg) {
  const typename V::F q = dec.template get<i>();
  for (int r = 0; r < R; ++r) accg[r] = V::fmadd(V::bcast(xr[r] + k + i), q, accg[r]);
}

template <class D, class V, int R, int... I>
inline void unit_steps(const D& dec, const float* const* xr, int64_t k, typename V::F* accg,
                       std::integer_sequence<int, I...>) {
  (step<D, V, R, I>(dec, xr, k, accg), ...);
}

// Rows [m0, m0 + R) of T neighbouring tile vectors, tiles [t, t + T * V::kTiles). With few rows a single tile would
// leave one FMA chain per row, each FMA waiting on the one before (4-5 cycles): T vectors give the core T
// independent chains at the same per-lane arithmetic, so every output keeps its bits whatever T is.
template <class V, int BITS, int R, int T>
void tile_rows(const QMatMulArgs& a, int64_t t, int64_t m0) {
  using D = Decoder<V, BITS>;
  using F = typename V::F;
  const int64_t units_per_group = a.group / D::kUnitK;
  const int64_t vector_bytes = V::kTiles * a.tile_bytes;  // between the same unit of neighbouring vectors
  const uint8_t* unit = a.codes + t * a.tile_bytes;
  const int64_t group_stride = a.G * 8;  // floats between the same group of neighbouring tiles
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = a.xq + (m0 + r) * a.ldx;
  F acc[T][R];
  for (int j = 0; j < T; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = V::zero();
  for (int64_t g = 0; g < a.G; ++g) {
    F accg[T][R];
    for (int j = 0; j < T; ++j)
      for (int r = 0; r < R; ++r) accg[j][r] = V::zero();
    int64_t k = g * a.group;
    for (int64_t u = 0; u < units_per_group; ++u, unit += D::kUnitBytes, k += D::kUnitK)
      for (int j = 0; j < T; ++j) {
        const D dec(unit + j * vector_bytes, a.tile_bytes);
        unit_steps<D, V, R>(dec, xr, k, accg[j], std::make_integer_sequence<int, D::kUnitK>{});
      }
    for (int j = 0; j < T; ++j) {
      const int64_t at = ((t + j * V::kTiles - a.stats_tile0) * a.G + g) * 8;
      const F s = group_scale<V>(a, at, group_stride);
      const F sz = group_sz<V>(a, at, group_stride, s);
      for (int r = 0; r < R; ++r) {
        acc[j][r] = V::fmadd(accg[j][r], s, acc[j][r]);
        acc[j][r] = V::fnmadd(sz, V::set1(a.xsum[(m0 + r) * a.G + g]), acc[j][r]);
      }
    }
  }
  alignas(64) float out[8 * V::kTiles];
  for (int j = 0; j < T; ++j)
    for (int r = 0; r < R; ++r) {
      V::store(out, acc[j][r]);
      if (V::kTiles == 2) finish_tile_pair_avx2(a, m0 + r, t + j * V::kTiles, out);
      else finish_tile_row_avx2(a, m0 + r, t + j * V::kTiles, out);
    }
}

// Rows [m0, m0 + R) of a block of T tile vectors, as many vectors at a time as R rows need for enough FMA chains.
template <class V, int BITS, int R, int T>
void block_rows(const QMatMulArgs& a, int64_t t, int64_t m0) {
  constexpr int want = R == 1 ? 4 : (R <= 3 ? 2 : 1);
  constexpr int step = want < T ? want : T;
  for (int j = 0; j < T; j += step) tile_rows<V, BITS, R, step>(a, t + j * V::kTiles, m0);
}

template <class V, int BITS, int T>
void block_all_rows(const QMatMulArgs& a, int64_t t) {
  int64_t m0 = 0;
  for (; m0 + 8 <= a.M; m0 += 8) block_rows<V, BITS, 8, T>(a, t, m0);
  switch (a.M - m0) {
    case 1: block_rows<V, BITS, 1, T>(a, t, m0); break;
    case 2: block_rows<V, BITS, 2, T>(a, t, m0); break;
    case 3: block_rows<V, BITS, 3, T>(a, t, m0); break;
    case 4: block_rows<V, BITS, 4, T>(a, t, m0); break;
    case 5: block_rows<V, BITS, 5, T>(a, t, m0); break;
    case 6: block_rows<V, BITS, 6, T>(a, t, m0); break;
    case 7: block_rows<V, BITS, 7, T>(a, t, m0); break;
    default: break;
  }
}

template <class V, int BITS>
int64_t run_tiles_bits(const QMatMulArgs& a, int64_t t0, int64_t t1) {
  constexpr int kBlock = 4;
  int64_t t = t0;
  for (; t + kBlock * V::kTiles <= t1; t += kBlock * V::kTiles) block_all_rows<V, BITS, kBlock>(a, t);
  for (; t + V::kTiles <= t1; t += V::kTiles) block_all_rows<V, BITS, 1>(a, t);
  return t;
}

// Tiles [t0, t1) in steps of V::kTiles; returns the first tile not done (a remainder smaller than kTiles).
template <class V>
int64_t run_tiles(const QMatMulArgs& a, int64_t t0, int64_t t1) {
  if (a.bits == 4) return run_tiles_bits<V, 4>(a, t0, t1);
  if (a.bits == 2) return run_tiles_bits<V, 2>(a, t0, t1);
  if (a.bits == 8) return run_tiles_bits<V, 8>(a, t0, t1);
  return run_tiles_bits<V, 3>(a, t0, t1);
}

}  // namespace simd
}  // namespace edge
