// CUDA kernel of edge.QMatMul for the CUDAExecutionProvider (sm_75 and newer), on the same packed layout as the CPU.
//
// A block of 8 warps owns 4 tiles (32 output columns): lane l of every warp owns column l. Warp w sums the k-units
// u = w, w + 8, w + 16, ... of its column in order, then warp partials are added in the fixed order 0..7. The split
// is fixed (it never depends on M or the launch), so each output is the same sequence of roundings for any batch:
// the batch-invariance the CPU kernel gives, and run-to-run determinism (no atomics).
// nvcc runs with --fmad=false so that only the explicit fmaf calls fuse (the reduction stays as written).
#include <cuda_runtime.h>

#include <string>

#include "qmatmul.h"
#include "qmatmul_cuda.h"

namespace edge {
namespace {

constexpr int kWarps = 8;
constexpr int kTilesPerBlock = 4;
constexpr int kRows = 8;  // rows per pass; more rows re-read the (cached) weights

struct DeviceArgs {
  const float* x;
  int64_t M, K, N, G, tiles, tile_bytes, group;
  int bits;
  const uint8_t* codes;
  const float* scales;
  const uint8_t* zeros_u8;
  const float* zeros_f32;
  const float* bias;
  const uint16_t* outlier_values;
  const int32_t* outlier_cols;
  const int32_t* outlier_rowptr;
  float* y;
};

__device__ __forceinline__ float half_to_float_dev(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ uint32_t code_at(int bits, const uint8_t* unit, int j, int i) {
  const uint32_t w = reinterpret_cast<const uint32_t*>(unit)[j];
  if (bits == 4) return (w >> (4 * i)) & 15u;
  uint32_t c = (w >> (2 * i)) & 3u;
  if (bits == 3) c |= ((reinterpret_cast<const uint16_t*>(unit + 32)[j] >> i) & 1u) << 2;
  return c;
}

__global__ void qmatmul_kernel(DeviceArgs a) {
  __shared__ float partial[kWarps][kRows][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const int64_t tile = col >> 3;
  const int j = static_cast<int>(col & 7);
  const bool live = tile < a.tiles;
  const int uk = a.bits == 4 ? 8 : 16, ub = a.bits == 3 ? 48 : 32;
  const int64_t units = a.G * a.group / uk;
  const float zero_default = static_cast<float>(1 << (a.bits - 1));
  for (int64_t m0 = 0; m0 < a.M; m0 += kRows) {
    const int rows = static_cast<int>(a.M - m0 < kRows ? a.M - m0 : kRows);
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    if (live) {
      for (int64_t u = warp; u < units; u += kWarps) {
        const uint8_t* unit = a.codes + tile * a.tile_bytes + u * ub;
        const int64_t k0 = u * uk;
        const int64_t at = (tile * a.G + k0 / a.group) * 8 + j;
        const float s = a.scales[at];
        const float z = a.zeros_u8 ? static_cast<float>(a.zeros_u8[at]) : (a.zeros_f32 ? a.zeros_f32[at] : zero_default);
        for (int i = 0; i < uk; ++i) {
          const int64_t k = k0 + i;
          if (k >= a.K) break;
          const float w = (static_cast<float>(code_at(a.bits, unit, j, i)) - z) * s;
#pragma unroll
          for (int r = 0; r < kRows; ++r)
            if (r < rows) acc[r] = fmaf(__ldg(a.x + (m0 + r) * a.K + k), w, acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) partial[warp][r][lane] = acc[r];
    __syncthreads();
    if (warp == 0 && live && col < a.N) {
      for (int r = 0; r < rows; ++r) {
        float v = 0.0f;
        for (int w = 0; w < kWarps; ++w) v += partial[w][r][lane];
        if (a.outlier_rowptr != nullptr) {
          for (int32_t e = a.outlier_rowptr[col]; e < a.outlier_rowptr[col + 1]; ++e)
            v += half_to_float_dev(a.outlier_values[e]) * a.x[(m0 + r) * a.K + a.outlier_cols[e]];
        }
        if (a.bias != nullptr) v += a.bias[col];
        a.y[(m0 + r) * a.N + col] = v;
      }
    }
    __syncthreads();
  }
}

}  // namespace

std::string launch_qmatmul_cuda(const QMatMulArgs& h, void* stream) {
  DeviceArgs a{h.x, h.M, h.K, h.N, h.G, h.tiles, h.tile_bytes, h.group, h.bits, h.codes, h.scales, h.zeros_u8,
               h.zeros_f32, h.bias, h.outlier_values, h.outlier_cols,
               h.outlier_rowptr, h.y};
  const int64_t blocks = (h.tiles + kTilesPerBlock - 1) / kTilesPerBlock;
  qmatmul_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(a);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? std::string() : std::string("CUDA launch failed: ") + cudaGetErrorString(err);
}

}  // namespace edge
