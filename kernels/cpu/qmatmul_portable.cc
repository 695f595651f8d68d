// The parts of edge.QMatMul shared by every code path, and the portable (any CPU) kernel.
//
// Compiled without -mavx2 and with -ffp-contract=off, so these sums are never fused differently from one build of
// the same source to the next: each output is the same sequence of roundings whatever M is.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "qmatmul.h"

namespace edge {

void finish_layout(QMatMulArgs& a) {
  a.Kp = (a.K + a.group - 1) / a.group * a.group;
  a.G = a.Kp / a.group;
  a.tiles = (a.N + 7) / 8;
  a.tile_bytes = a.Kp / unit_k(a.bits) * unit_bytes(a.bits);
}

void row_group_sums(const QMatMulArgs& a, float* out) {
  for (int64_t m = 0; m < a.M; ++m) {
    const float* xr = a.x + m * a.ldx;
    for (int64_t g = 0; g < a.G; ++g) {
      float s = 0.0f;
      for (int64_t k = g * a.group; k < (g + 1) * a.group; ++k) s += xr[k];
      out[m * a.G + g] = s;
    }
  }
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t exp = (bits >> 23) & 0xffu, man = bits & 0x7fffffu;
  if (exp == 0xff) return sign | 0x7c00u | (man != 0 ? 0x200u : 0u);  // inf / nan (quiet)
  const int e = static_cast<int>(exp) - 127 + 15;                      // the half's biased exponent
  if (e >= 31) return sign | 0x7c00u;                                  // overflow: inf
  // Keep the top 10 mantissa bits (with the implicit one for subnormal halves) and round the rest to even.
  uint32_t full = man | 0x800000u, shift = 13;
  if (e <= 0) {
    if (e < -10) return sign;  // below half the smallest subnormal: zero
    shift = static_cast<uint32_t>(14 - e);
  } else {
    full = man;
  }
  uint32_t out = full >> shift;
  const uint32_t rest = full & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (out & 1u))) ++out;  // may carry into the exponent: still correct
  return static_cast<uint16_t>(sign | ((e > 0 ? static_cast<uint32_t>(e) << 10 : 0u) + out));
}

void finish_tile_row(const QMatMulArgs& a, int64_t m, int64_t tile, const float* dense8) {
  const float* xr = a.x + m * a.ldx;
  float v[8];
  for (int j = 0; j < 8; ++j) {
    const int64_t n = tile * 8 + j;
    if (n >= a.N) break;
    v[j] = dense8[j];
    if (a.outlier_rowptr != nullptr) {
      for (int32_t e = a.outlier_rowptr[n]; e < a.outlier_rowptr[n + 1]; ++e)
        v[j] += half_to_float(a.outlier_values[e]) * xr[a.outlier_cols[e]];
    }
    if (a.bias != nullptr) v[j] += a.bias[n];
    if (a.gated == 0) a.y[m * a.N + n] = v[j];
  }
  if (a.gated != 0)  // N is a multiple of 8 (checked at kernel creation)
    for (int i = 0; i < 4; ++i) a.y[m * (a.N / 2) + tile * 4 + i] = gate_activation(a.gated, v[i]) * v[4 + i];
}

namespace {

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Decode the 8 codes (one per column of the tile) of k = i inside a unit.
inline void decode8(int bits, const uint8_t* unit, int i, float* q) {
  for (int j = 0; j < 8; ++j) {
    const uint32_t w = load_u32(unit + 4 * j);
    uint32_t c;
    if (bits == 4) {
      c = (w >> (4 * i)) & 15u;
    } else if (bits == 8) {
      c = (w >> (8 * i)) & 255u;
    } else if (bits == 2) {
      c = (w >> (2 * i)) & 3u;
    } else {
      const uint32_t hi = (load_u16(unit + 32 + 2 * j) >> i) & 1u;
      c = ((w >> (2 * i)) & 3u) | (hi << 2);
    }
    q[j] = static_cast<float>(c);
  }
}

inline void group_offsets(const QMatMulArgs& a, int64_t t, int64_t g, float* s, float* sz) {
  const int64_t at = ((t - a.stats_tile0) * a.G + g) * 8;
  for (int j = 0; j < 8; ++j) {  // as qmatmul_stats.h
    s[j] = a.scales_f16 != nullptr ? half_to_float(a.scales_f16[at + j]) : a.scales[at + j];
    if (a.mins_f16 != nullptr || a.mins_f32 != nullptr) {
      sz[j] = -1.0f * (a.mins_f16 != nullptr ? half_to_float(a.mins_f16[at + j]) : a.mins_f32[at + j]);
      continue;
    }
    float z = static_cast<float>(1 << (a.bits - 1));
    if (a.zeros_u8 != nullptr) z = static_cast<float>(a.zeros_u8[at + j]);
    if (a.zeros_f32 != nullptr) z = a.zeros_f32[at + j];
    sz[j] = s[j] * z;
  }
}

// Rows [m0, m0 + rows) of one tile; rows <= 8.
void tile_rows_portable(const QMatMulArgs& a, int64_t t, int64_t m0, int rows) {
  const int uk = unit_k(a.bits), ub = unit_bytes(a.bits);
  const int64_t units_per_group = a.group / uk;
  const uint8_t* tile = a.codes + t * a.tile_bytes;
  float acc[8][8] = {};
  for (int64_t g = 0; g < a.G; ++g) {
    float s[8], sz[8], accg[8][8] = {};
    group_offsets(a, t, g, s, sz);
    for (int64_t u = 0; u < units_per_group; ++u) {
      const uint8_t* unit = tile + (g * units_per_group + u) * ub;
      const int64_t k0 = g * a.group + u * uk;
      for (int i = 0; i < uk; ++i) {
        float q[8];
        decode8(a.bits, unit, i, q);
        for (int r = 0; r < rows; ++r) {
          const float xv = a.x[(m0 + r) * a.ldx + k0 + i];
          for (int j = 0; j < 8; ++j) accg[r][j] += xv * q[j];
        }
      }
    }
    for (int r = 0; r < rows; ++r) {
      const float xs = a.xsum[(m0 + r) * a.G + g];
      for (int j = 0; j < 8; ++j) acc[r][j] = (acc[r][j] + accg[r][j] * s[j]) - sz[j] * xs;
    }
  }
  for (int r = 0; r < rows; ++r) finish_tile_row(a, m0 + r, t, acc[r]);
}

}  // namespace

void qmatmul_tiles_portable(const QMatMulArgs& a, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t m0 = 0; m0 < a.M; m0 += 8)
      tile_rows_portable(a, t, m0, static_cast<int>(a.M - m0 < 8 ? a.M - m0 : 8));
}

#if !defined(__x86_64__) && !defined(_M_X64)
void qmatmul_tiles_avx2(const QMatMulArgs& a, int64_t t0, int64_t t1) { qmatmul_tiles_portable(a, t0, t1); }
void qmatmul_tiles_avx2_int8(const QMatMulArgs& a, int64_t t0, int64_t t1) { qmatmul_tiles_portable(a, t0, t1); }
void qmatmul_tiles_avx512(const QMatMulArgs& a, int64_t t0, int64_t t1) { qmatmul_tiles_portable(a, t0, t1); }
void qmatmul_tiles_avx512vnni(const QMatMulArgs& a, int64_t t0, int64_t t1) { qmatmul_tiles_portable(a, t0, t1); }
void qmatmul_tiles_avxvnni(const QMatMulArgs& a, int64_t t0, int64_t t1) { qmatmul_tiles_portable(a, t0, t1); }
void prepare_digits_avx512(const QMatMulArgs& a, int64_t m0, int64_t m1, int32_t* xd, float* xpow, float* xsum) {
  prepare_digits(a, m0, m1, xd, xpow, xsum);
}
void finish_tile_row_avx2(const QMatMulArgs& a, int64_t m, int64_t tile, const float* dense8) {
  finish_tile_row(a, m, tile, dense8);
}
void prepare_int8_avx2(const QMatMulArgs& a, int64_t m0, int64_t m1, int32_t* xd, float* xpow, float* xsum) {
  prepare_digits(a, m0, m1, xd, xpow, xsum);
}
#endif

namespace {

// One group of one row, exactly as the AVX-512 version (same rounding, same digits, same order).
// Unit u of the group goes to out + u * unit_stride (digit_row's layout).
void group_digits(const float* x, int64_t group, int digits, int32_t* out, int64_t unit_stride, float* pow_out,
                  float* sum_out) {
  float amax = 0.0f;
  bool bad = false;
  for (int64_t i = 0; i < group; ++i) {
    const float v = std::fabs(x[i]);
    bad |= !(v < std::numeric_limits<float>::infinity());
    amax = v > amax ? v : amax;
  }
  if (bad) {
    for (int64_t u = 0; u < group / 8; ++u) std::fill(out + u * unit_stride, out + u * unit_stride + 2 * digits, 0);
    *pow_out = *sum_out = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const DigitScale scale = digit_scale(amax, digits);
  const float mul = scale.mul;
  int32_t sum = 0;
  for (int64_t u = 0; u < group / 8; ++u) {
    int8_t d[3][8];
    for (int i = 0; i < 8; ++i) {
      const float scaled = x[8 * u + i] * mul;                             // exact for three digits
      const float rounded = (scaled + 12582912.0f) - 12582912.0f;        // nearest-even, |scaled| <= 2^22
      int32_t v = static_cast<int32_t>(rounded);
      if (digits == 1) v = v > 127 ? 127 : (v < -127 ? -127 : v);  // guards the byte against rounding
      sum += v;
      const int32_t d0 = static_cast<int8_t>(v & 0xff);
      const int32_t v1 = (v - d0) >> 8;
      const int32_t d1 = static_cast<int8_t>(v1 & 0xff);
      d[0][i] = static_cast<int8_t>(d0);
      d[1][i] = static_cast<int8_t>(d1);
      d[2][i] = static_cast<int8_t>((v1 - d1) >> 8);
    }
    // [even d0.., odd d0..], digits of k = p, p+2, p+4, p+6 in bytes 0..3
    int32_t* w = out + u * unit_stride;
    for (int p = 0; p < 2; ++p)
      for (int j = 0; j < digits; ++j) {
        uint32_t word = 0;
        for (int b = 0; b < 4; ++b) word |= static_cast<uint32_t>(static_cast<uint8_t>(d[j][p + 2 * b])) << (8 * b);
        w[digits * p + j] = static_cast<int32_t>(word);
      }
  }
  *pow_out = scale.step;
  *sum_out = static_cast<float>(sum) * scale.step;
}

}  // namespace

void prepare_digits(const QMatMulArgs& a, int64_t m0, int64_t m1, int32_t* xd, float* xpow, float* xsum) {
  prepare_rows(a, m0, m1, xd, xpow, xsum,
               [&](const float* x, int32_t* out, int64_t stride, float* pow_out, float* sum_out) {
    group_digits(x, a.group, a.digits, out, stride, pow_out, sum_out);
  });
}

void prescale_x(const QMatMulArgs& a, float* out) {
  const int uk = unit_k(a.bits);
  float scale[16];
  for (int i = 0; i < uk; ++i)
    scale[i] = (a.bits == 3 || i == uk - 1) ? 1.0f : std::ldexp(1.0f, -a.bits * i);
  for (int64_t m = 0; m < a.M; ++m) {
    const float* xr = a.x + m * a.ldx;
    float* o = out + m * a.ldx;
    for (int64_t k0 = 0; k0 < a.Kp; k0 += uk)
      for (int i = 0; i < uk; ++i) o[k0 + i] = xr[k0 + i] * scale[i];
  }
}

namespace {

enum class Isa { kPortable, kAvx2, kAvxVnni, kAvx512, kAvx512Vnni };

// Whether this CPU can run `isa`.
bool supports(Isa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");  // float16 statistics
  switch (isa) {
    case Isa::kPortable: return true;
    case Isa::kAvx2: return avx2;
    case Isa::kAvxVnni: return avx2 && __builtin_cpu_supports("avxvnni");
    case Isa::kAvx512: return avx2 && __builtin_cpu_supports("avx512f");
    case Isa::kAvx512Vnni: return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
  }
#endif
  return isa == Isa::kPortable;
}

Isa chosen_isa() {
  static const Isa isa = [] {
    const char* cap = std::getenv("EDGE_KERNELS_ISA");
    const struct { const char* name; Isa isa; } names[] = {
        {"portable", Isa::kPortable}, {"avx2", Isa::kAvx2}, {"avxvnni", Isa::kAvxVnni},
        {"avx512", Isa::kAvx512}, {"avx512vnni", Isa::kAvx512Vnni}};
    if (cap != nullptr)
      for (const auto& n : names)
        if (std::strcmp(cap, n.name) == 0 && supports(n.isa)) return n.isa;
    for (Isa best : {Isa::kAvx512Vnni, Isa::kAvx512, Isa::kAvxVnni, Isa::kAvx2})
      if (supports(best)) return best;
    return Isa::kPortable;
  }();
  return isa;
}

}  // namespace

TilesFn select_tiles_fn(int bits, int digits) {
  switch (chosen_isa()) {
    case Isa::kAvx512Vnni: return bits == 4 ? qmatmul_tiles_avx512vnni : qmatmul_tiles_avx512;
    case Isa::kAvx512: return bits == 4 && digits == 1 ? qmatmul_tiles_avx2_int8 : qmatmul_tiles_avx512;
    case Isa::kAvxVnni: return bits == 4 ? qmatmul_tiles_avxvnni : qmatmul_tiles_avx2;
    case Isa::kAvx2: return bits == 4 && digits == 1 ? qmatmul_tiles_avx2_int8 : qmatmul_tiles_avx2;
    default: return qmatmul_tiles_portable;
  }
}

bool uses_avx2() { return chosen_isa() != Isa::kPortable; }

bool uses_avx512() { return chosen_isa() == Isa::kAvx512 || chosen_isa() == Isa::kAvx512Vnni; }

bool reads_digits(TilesFn fn) {
  return fn == qmatmul_tiles_avx512vnni || fn == qmatmul_tiles_avxvnni || fn == qmatmul_tiles_avx2_int8;
}

}  // namespace edge
