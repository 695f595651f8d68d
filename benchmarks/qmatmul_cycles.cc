// Cycles of the AVX-512 VNNI edge.QMatMul kernel at int8 activations (the default package's path: 4-bit codes,
// groups of 32, float16 scale and min per group), one thread, no onnxruntime: how close the kernel runs to the
// instructions it must issue. Per (row, group of 32 k, 16 columns) the kernel issues 8 vpdpbusd and an epilogue of
// 3 float operations (scale times the row's step, an FMA, and the min's FMA), so "cycles per unit" near 11 at 8 rows
// means it is bound by those instructions, not by memory or by the code decoding the 8 rows share.
//
//     g++ -O3 -std=c++17 -ffp-contract=off -Ikernels/cpu -mavx512f -mavx512vnni -mavxvnni -mavx2 -mfma -mf16c \
//         benchmarks/qmatmul_cycles.cc kernels/cpu/qmatmul_{portable,two_level,avx2,avx512,avx512vnni,avxvnni}.cc \
//         -o /tmp/qmatmul_cycles
//     /tmp/qmatmul_cycles K N M [reps]      e.g. 576 3072 8 (SmolLM2's gate/up), 1536 576 8, 576 49152 1
//
// (-mavxvnni only lets qmatmul_avxvnni.cc compile; nothing here calls it.) The clock is measured with a chain of
// dependent integer adds, one a cycle.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "qmatmul.h"

// The core's clock while it runs: a chain of dependent adds retires one a cycle.
double measure_ghz() {
  const long n = 200000000;
  long v = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(v));
  return 4.0 * static_cast<double>(n) /
         std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s K N M [reps]\n", argv[0]);
    return 2;
  }
  edge::QMatMulArgs a;
  a.K = std::atol(argv[1]);
  a.N = std::atol(argv[2]);
  a.M = std::atol(argv[3]);
  const int reps = argc > 4 ? std::atoi(argv[4]) : 300;
  a.bits = 4;
  a.group = 32;
  edge::finish_layout(a);
  std::mt19937 rng(1);
  std::vector<uint8_t> codes(static_cast<size_t>(a.tiles * a.tile_bytes));
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  std::vector<uint16_t> scales(static_cast<size_t>(a.tiles * a.G * 8)), mins(scales.size());
  for (auto& s : scales) s = edge::float_to_half(0.01f + static_cast<float>(rng() % 100) * 1e-4f);
  for (auto& m : mins) m = edge::float_to_half(-0.05f + static_cast<float>(rng() % 100) * 1e-4f);
  std::vector<float> x(static_cast<size_t>(a.M * a.Kp)), y(static_cast<size_t>(a.M * a.N));
  std::normal_distribution<float> normal;
  for (auto& v : x) v = normal(rng);
  a.x = x.data();
  a.ldx = a.Kp;
  a.codes = codes.data();
  a.scales_f16 = scales.data();
  a.mins_f16 = mins.data();
  a.y = y.data();
  a.digits = 1;  // accuracy_level 4: int8 x
  std::vector<int32_t> xd(static_cast<size_t>(a.M * a.Kp / 4));
  std::vector<float> xpow(static_cast<size_t>(a.M * a.G)), xsum(xpow.size());
  edge::prepare_digits_avx512(a, 0, a.M, xd.data(), xpow.data(), xsum.data());
  a.xd = xd.data();
  a.xpow = xpow.data();
  a.xsum = xsum.data();
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    edge::qmatmul_tiles_avx512vnni(a, 0, a.tiles);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  const double ghz = measure_ghz();
  const double units = static_cast<double>(a.M) * static_cast<double>(a.G) * static_cast<double>(a.N) / 16.0;
  std::printf("K=%ld N=%ld M=%ld: median %.1f us, fastest %.1f us: %.2f cycles per (row, group, 16 columns) at %.2f GHz\n",
              static_cast<long>(a.K), static_cast<long>(a.N), static_cast<long>(a.M), us[us.size() / 2], us[0],
              us[0] * ghz * 1e3 / units, ghz);
  return 0;
}
