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

namespace edge {
namespace simd {

template <class V, int BITS>
struct Decoder;

template <class V>
struct Decoder<V, 4> {
  static constexpr int kUnitK = 8;
  static constexpr int kUnitBytes = 32;
  typename V::I w;
  Decoder(const uint8_t* unit, int64_t tile_stride) : w(V::load_unit(unit, tile_stride)) {}
  template <int i>
  typename V::F get() const {
    if constexpr (i == 7) return V::cvt(V::template srli<28>(w));
    else return V::cvt(V::and_(w, V::set1i(static_cast<int>(15u << (4 * i)))));
  }
};

template <class V>
struct Decoder<V, 2> {
  static constexpr int kUnitK = 16;
  static constexpr int kUnitBytes = 32;
  typename V::I w;
  Decoder(const uint8_t* unit, int64_t tile_stride) : w(V::load_unit(unit, tile_stride)) {}
  template <int i>
  typename V::F get() const {
    if constexpr (i == 15) return V::cvt(V::template srli<30>(w));
    else return V::cvt(V::and_(w, V::set1i(static_cast<int>(3u << (2 * i)))));
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

template <class V>
inline typename V::F group_zeros(const QMatMulArgs& a, int64_t at, int64_t stride) {
  if (a.zeros_u8 != nullptr) return V::load_u8(a.zeros_u8 + at, stride);
  if (a.zeros_f32 != nullptr) return V::load(a.zeros_f32 + at, stride);
  return V::set1(static_cast<float>(1 << (a.bits - 1)));
}

// Rows [m0, m0 + R) of tiles [t, t + V::kTiles).
template <class V, int BITS, int R>
void tile_rows(const QMatMulArgs& a, int64_t t, int64_t m0) {
  using D = Decoder<V, BITS>;
  using F = typename V::F;
  const int64_t units_per_group = a.group / D::kUnitK;
  const uint8_t* unit = a.codes + t * a.tile_bytes;
  const int64_t group_stride = a.G * 8;  // floats between the same group of neighbouring tiles
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = a.xq + (m0 + r) * a.ldx;
  F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  for (int64_t g = 0; g < a.G; ++g) {
    F accg[R];
    for (int r = 0; r < R; ++r) accg[r] = V::zero();
    int64_t k = g * a.group;
    for (int64_t u = 0; u < units_per_group; ++u, unit += D::kUnitBytes, k += D::kUnitK) {
      const D dec(unit, a.tile_bytes);
      unit_steps<D, V, R>(dec, xr, k, accg, std::make_integer_sequence<int, D::kUnitK>{});
    }
    const int64_t at = (t * a.G + g) * 8;
    const F s = V::load(a.scales + at, group_stride);
    const F sz = V::mul(s, group_zeros<V>(a, at, group_stride));
    for (int r = 0; r < R; ++r) {
      acc[r] = V::fmadd(accg[r], s, acc[r]);
      acc[r] = V::fnmadd(sz, V::set1(a.xsum[(m0 + r) * a.G + g]), acc[r]);
    }
  }
  alignas(64) float out[8 * V::kTiles];
  for (int r = 0; r < R; ++r) {
    V::store(out, acc[r]);
    for (int j = 0; j < V::kTiles; ++j) finish_tile_row(a, m0 + r, t + j, out + 8 * j);
  }
}

template <class V, int BITS>
void tile_all_rows(const QMatMulArgs& a, int64_t t) {
  int64_t m0 = 0;
  for (; m0 + 8 <= a.M; m0 += 8) tile_rows<V, BITS, 8>(a, t, m0);
  switch (a.M - m0) {
    case 1: tile_rows<V, BITS, 1>(a, t, m0); break;
    case 2: tile_rows<V, BITS, 2>(a, t, m0); break;
    case 3: tile_rows<V, BITS, 3>(a, t, m0); break;
    case 4: tile_rows<V, BITS, 4>(a, t, m0); break;
    case 5: tile_rows<V, BITS, 5>(a, t, m0); break;
    case 6: tile_rows<V, BITS, 6>(a, t, m0); break;
    case 7: tile_rows<V, BITS, 7>(a, t, m0); break;
    default: break;
  }
}

// Tiles [t0, t1) in steps of V::kTiles; returns the first tile not done (a remainder smaller than kTiles).
template <class V>
int64_t run_tiles(const QMatMulArgs& a, int64_t t0, int64_t t1) {
  int64_t t = t0;
  for (; t + V::kTiles <= t1; t += V::kTiles) {
    if (a.bits == 4) tile_all_rows<V, 4>(a, t);
    else if (a.bits == 2) tile_all_rows<V, 2>(a, t);
    else tile_all_rows<V, 3>(a, t);
  }
  return t;
}

}  // namespace simd
}  // namespace edge
