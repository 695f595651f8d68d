// CUDA kernel of edge.QMatMul for the CUDAExecutionProvider (sm_75 and newer), on the same packed layout as the CPU.
//
// One block per tile (8 output columns) and per 4 rows of x. The tile's k-units are dealt to the block's lanes in a
// fixed pattern (unit u to lane u % 32 of warp (u / 32) % W, W fixed by K alone), so a warp reads 32 consecutive
// units (1 KiB, coalesced) per step and each lane decodes whole units: 8 columns x 8..16 k. A lane sums its units in
// order, the 32 lanes of a warp are combined by a butterfly (xor 16, 8, 4, 2, 1), and the W warps in order 0..W-1.
// That tree depends on neither M nor the other rows, nor on how many rows one block computes (R = 1, 2 or 4 by
// template: the butterfly is a reduce-scatter while slots outnumber lanes, which adds the same pairs in the same
// order as the plain butterfly), so each output is the same sequence of roundings for any batch: the
// batch-invariance the CPU kernel gives, and run-to-run determinism (no atomics, no M-dependent split).
// nvcc runs with --fmad=false so that only the explicit fmaf calls fuse (the reduction stays as written).
//
// The norm mode (NORM, float32 only) folds RMSNorm(X + skip) into the same pass: y = r * sum_k ((x + skip) * g)_k w_k
// with r = 1 / rms(x + skip), and the squares for r are summed while the block reads x for the products (each
// element by one lane, in the lanes' fixed order, then the warps in order), so the norm adds neither a launch nor a
// pass over x. A separate norm kernel cost a launch per node, which on a GPU's decode step (set by launches) made the
// fused graph 3% slower than the unfused one (benchmarks/RESULTS.md, session 25). Above kOnePassRows rows (prefill)
// every block redoing the norm's work costs more than a launch, so norm_rows_kernel first writes (x + skip) * g and r
// per row, with the same operations in the same order, and the plain kernel scales its sums by r: the same bits
// either way, so the op stays batch-invariant. Factoring r out rounds differently from the CPU's ((h * r) * g) w.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "qmatmul.h"
#include "qmatmul_cuda.h"

namespace edge {
namespace {

constexpr int kMaxWarps = 4;
constexpr int kMaxRows = 4;  // 8 measured slower on an H100: 254 registers, too few warps per SM
constexpr int kOnePassRows = 16;  // the norm inside the matmul's pass up to here (decode and verify steps)

struct DeviceArgs {
  const void* x;  // float, or __half for the float16 registration (then y is __half too)
  int64_t M, K, G, tiles, tile_bytes, group, units;
  int N, bits, warps;
  int gated;  // 1 silu(gate) * up, 2 gelu_tanh(gate) * up, N / 2 columns (QMatMulArgs::gated)
  bool vec_x;  // x rows may be read as float4 (K % 4 == 0, 16-byte aligned)
  const uint8_t* codes;
  const float* scales;
  const uint16_t* scales_f16;  // float16 scales instead (QMatMulArgs)
  const uint8_t* zeros_u8;
  const float* zeros_f32;
  const float* mins_f32;  // W = code * scale + min instead of zero points
  const uint16_t* mins_f16;
  const uint8_t* scale_codes;  // SpQR's two levels (QMatMulArgs): value = base + step * code
  const uint16_t* scale_stats;
  const uint8_t* zero_codes;
  const uint16_t* zero_stats;
  const int32_t* stat_rows;
  int stat_row_count;
  const float* bias;
  const uint16_t* outlier_values;
  const int32_t* outlier_cols;
  const int32_t* outlier_rowptr;
  void* y;
  CudaNorm norm;  // read only by the NORM kernels
  const float* row_scale;  // plain kernels: each row's sums times this (r, after norm_rows_kernel), or null
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }

__device__ __forceinline__ float half_to_float_dev(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ float inverse_rms(float squares, int64_t k, float epsilon) {
  return 1.0f / sqrtf(squares / static_cast<float>(k) + epsilon);
}

// Element k of row m of the matmul's input before the norm's scale: x, or with NORM (x + skip) * weight.
template <bool NORM, typename T>
__device__ __forceinline__ float x_at(const DeviceArgs& a, const T* x, int64_t m, int64_t k) {
  const float v = to_float(__ldg(x + m * a.K + k));
  if (!NORM) return v;
  const float h = a.norm.skip != nullptr ? v + __ldg(a.norm.skip + m * a.K + k) : v;
  return h * __ldg(a.norm.weight + k);
}

// A two-level statistic of column j of `tile`, group g: base + step * code (built with --fmad=false: the product
// rounds, then the sum, as on the CPU). Rows outside the table are clamped (the CPU op range-checks them).
__device__ __forceinline__ float two_level(const DeviceArgs& a, const uint8_t* codes, const uint16_t* stats,
                                           int64_t tile, int64_t g, int64_t at, int j) {
  int r = __ldg(a.stat_rows + 2 * tile + j / 4);
  r = r < 0 ? 0 : (r >= a.stat_row_count ? a.stat_row_count - 1 : r);
  const uint16_t* st = stats + (static_cast<int64_t>(r) * a.G + g) * 2;
  return half_to_float_dev(__ldg(st)) + half_to_float_dev(__ldg(st + 1)) * static_cast<float>(__ldg(codes + at + j));
}

// How a unit's statistics are stored, a template argument: each form loads only its own arrays, and the weight
// formula is chosen at compile time. One kernel reading every form by run-time tests (session 8) cost 1.26-1.46x the
// kernel time of the plain form on an H100 (benchmarks/RESULTS.md, session 12).
enum Form { kZeros = 0, kMins = 1, kTwoLevel = 2 };

// Scales (float32 or float16) and, per form, zero points, mins or two-level values of the 8 columns of one group.
// The tests on pointers are the same for every lane (a branch, not per-element selects).
template <int FORM, int BITS>
__device__ __forceinline__ void load_stats(const DeviceArgs& a, int64_t tile, int64_t g, int64_t at, float (&s)[8],
                                           float (&z)[8]) {
  if (FORM == kTwoLevel) {
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = two_level(a, a.scale_codes, a.scale_stats, tile, g, at, j);
  } else if (a.scales_f16) {
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = half_to_float_dev(__ldg(a.scales_f16 + at + j));
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = __ldg(a.scales + at + j);
  }
  if (FORM == kMins) {
    if (a.mins_f16) {
#pragma unroll
      for (int j = 0; j < 8; ++j) z[j] = half_to_float_dev(__ldg(a.mins_f16 + at + j));
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) z[j] = __ldg(a.mins_f32 + at + j);
    }
  } else if (FORM == kTwoLevel && a.zero_codes) {
#pragma unroll
    for (int j = 0; j < 8; ++j) z[j] = two_level(a, a.zero_codes, a.zero_stats, tile, g, at, j);
  } else if (a.zeros_u8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) z[j] = static_cast<float>(__ldg(a.zeros_u8 + at + j));
  } else if (a.zeros_f32) {
#pragma unroll
    for (int j = 0; j < 8; ++j) z[j] = __ldg(a.zeros_f32 + at + j);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) z[j] = static_cast<float>(1 << (BITS - 1));
  }
}

// The 8 code words of a unit (one per column) and, for 3-bit, the 8 words of high bits.
struct Unit {
  uint32_t w[8];
  uint32_t hi[8];
};

template <int BITS>
__device__ __forceinline__ void load_unit(const uint8_t* p, Unit& u) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
  u.w[0] = a.x, u.w[1] = a.y, u.w[2] = a.z, u.w[3] = a.w, u.w[4] = b.x, u.w[5] = b.y, u.w[6] = b.z, u.w[7] = b.w;
  if (BITS == 3) {
    const uint4 c = __ldg(reinterpret_cast<const uint4*>(p) + 2);
    const uint32_t h[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) u.hi[j] = (h[j / 2] >> (16 * (j % 2))) & 0xffffu;
  }
}

template <int BITS>
__device__ __forceinline__ float code(const Unit& u, int j, int i) {
  if (BITS == 4) return static_cast<float>((u.w[j] >> (4 * i)) & 15u);
  if (BITS == 8) return static_cast<float>((u.w[j] >> (8 * i)) & 255u);
  uint32_t c = (u.w[j] >> (2 * i)) & 3u;
  if (BITS == 3) c |= ((u.hi[j] >> i) & 1u) << 2;
  return static_cast<float>(c);
}

// Sum the 8R slots over the 32 lanes with the xor-16..1 butterfly; afterwards lane l holds the totals of slots
// 8R/32 * l ... (when 8R >= 32) or slot (l * 8R / 32) (when fewer), see owned_slot.
template <int S>
__device__ __forceinline__ void warp_sum(float (&v)[S], int lane) {
  int live = S;  // slots this lane still carries: v[0..live)
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) {
    if (live > 1) {
      const int half = live / 2;
      const bool upper = lane & off;
#pragma unroll
      for (int i = 0; i < S / 2; ++i) {
        if (i < half) {
          const float send = upper ? v[i] : v[i + half];
          const float keep = upper ? v[i + half] : v[i];
          v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
      }
      live = half;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
    }
  }
}

// The first slot lane `lane` holds after warp_sum: lane bits, high to low, pick halves of the slot range in turn.
template <int S>
__device__ __forceinline__ int owned_slot(int lane) {
  int slot = 0, span = S;
  for (int off = 16; off >= 1 && span > 1; off >>= 1) {
    span /= 2;
    if (lane & off) slot += span;
  }
  return slot;
}

template <int FORM, int BITS, int R, bool NORM, typename T>
__device__ void tile_rows(const DeviceArgs& a, int64_t tile, int64_t m0, int rows) {
  const T* x = static_cast<const T*>(a.x);
  constexpr int UK = BITS == 4 ? 8 : (BITS == 8 ? 4 : 16), UB = BITS == 3 ? 48 : 32, S = 8 * R;
  constexpr int PER_LANE = S >= 32 ? S / 32 : 1;
  __shared__ float red[kMaxWarps][S];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float acc[S];
#pragma unroll
  for (int s = 0; s < S; ++s) acc[s] = 0.0f;
  float squares[R];  // NORM: this lane's sum of (x + skip)^2 per row
#pragma unroll
  for (int r = 0; r < R; ++r) squares[r] = 0.0f;
  const bool write_sum = NORM && a.norm.skip != nullptr && tile == 0;  // X + skip, once per row
  const uint8_t* tile_codes = a.codes + tile * a.tile_bytes;
  for (int64_t u = static_cast<int64_t>(warp) * 32 + lane; u < a.units; u += static_cast<int64_t>(a.warps) * 32) {
    Unit unit;
    load_unit<BITS>(tile_codes + u * UB, unit);
    const int64_t k0 = u * UK;
    const int64_t at = (tile * a.G + k0 / a.group) * 8;
    float s[8], z[8];  // with mins, z holds the min
    load_stats<FORM, BITS>(a, tile, k0 / a.group, at, s, z);
    // k in steps of 4: x of every row for those k, then each column's 4 weights, each used by every row.
    const bool vec = sizeof(T) == 4 && a.vec_x && k0 + UK <= a.K;
#pragma unroll
    for (int q = 0; q < UK / 4; ++q) {
      float xq[R][4];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t m = m0 + (r < rows ? r : 0), k = k0 + 4 * q;
        float h[4];  // x, or with NORM x + skip
        if (vec) {
          float4 f = __ldg(reinterpret_cast<const float4*>(x + m * a.K + k));
          if (NORM && a.norm.skip != nullptr) {
            const float4 sk = __ldg(reinterpret_cast<const float4*>(a.norm.skip + m * a.K + k));
            f.x += sk.x, f.y += sk.y, f.z += sk.z, f.w += sk.w;
            if (write_sum && r < rows) *reinterpret_cast<float4*>(a.norm.sum + m * a.K + k) = f;
          }
          h[0] = f.x, h[1] = f.y, h[2] = f.z, h[3] = f.w;
        } else {
#pragma unroll
          for (int t = 0; t < 4; ++t) {  // padded k: x = 0
            h[t] = k + t < a.K ? to_float(__ldg(x + m * a.K + k + t)) : 0.0f;
            if (NORM && a.norm.skip != nullptr && k + t < a.K) {
              h[t] += __ldg(a.norm.skip + m * a.K + k + t);
              if (write_sum && r < rows) a.norm.sum[m * a.K + k + t] = h[t];
            }
          }
        }
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          if (NORM) {
            squares[r] += h[t] * h[t];
            xq[r][t] = k + t < a.K ? h[t] * __ldg(a.norm.weight + k + t) : 0.0f;
          } else {
            xq[r][t] = h[t];
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float c = code<BITS>(unit, j, 4 * q + t);
          const float w = FORM == kMins ? c * s[j] + z[j] : (c - z[j]) * s[j];
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r * 8 + j] = fmaf(xq[r][t], w, acc[r * 8 + j]);
        }
      }
    }
  }
  warp_sum<S>(acc, lane);
  __shared__ float row_squares[kMaxWarps][R];
  if (NORM) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) squares[r] += __shfl_xor_sync(0xffffffffu, squares[r], off);
      if (lane == 0) row_squares[warp][r] = squares[r];
    }
  }
  const int first = owned_slot<S>(lane);
  if (S >= 32 || lane % (32 / S) == 0) {
#pragma unroll
    for (int p = 0; p < PER_LANE; ++p) red[warp][first + p] = acc[p];
  }
  __syncthreads();
  __shared__ float done[S];  // the tile's finished outputs, for the gated pairs
  const int r = threadIdx.x / 8, j = threadIdx.x % 8;
  const int64_t col = tile * 8 + j;
  const bool mine = threadIdx.x < S && r < rows && col < a.N;
  if (mine) {
    float v = red[0][threadIdx.x];
    for (int w = 1; w < a.warps; ++w) v += red[w][threadIdx.x];
    if (a.outlier_rowptr != nullptr) {
      for (int32_t e = a.outlier_rowptr[col]; e < a.outlier_rowptr[col + 1]; ++e)
        v += half_to_float_dev(a.outlier_values[e]) * x_at<NORM>(a, x, m0 + r, a.outlier_cols[e]);
    }
    if (NORM) {
      float squares_total = row_squares[0][r];
      for (int w = 1; w < a.warps; ++w) squares_total += row_squares[w][r];
      v *= inverse_rms(squares_total, a.K, a.norm.epsilon);
    } else if (a.row_scale != nullptr) {
      v *= a.row_scale[m0 + r];
    }
    if (a.bias != nullptr) v += a.bias[col];
    if (a.gated) done[threadIdx.x] = v;
    else store(static_cast<T*>(a.y) + (m0 + r) * a.N + col, v);
  }
  if (!a.gated) return;
  __syncthreads();
  if (mine && j < 4) {  // N is a multiple of 8 here (checked at kernel creation)
    const float g = done[threadIdx.x], u = done[threadIdx.x + 4];
    const float act = a.gated == 1 ? g / (1.0f + expf(-g))
                                   : 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
    store(static_cast<T*>(a.y) + (m0 + r) * (a.N / 2) + tile * 4 + j, act * u);
  }
}

// The norm ahead of a plain launch (many rows): block m writes row m's (x + skip) * g into xn, x + skip into the
// norm's sum, and r into row_scale, summing the squares exactly as tile_rows does (a lane's units in order, the
// xor-16..1 butterfly, the warps in order), so that the plain kernel's y equals the NORM kernel's bit for bit.
template <int UK>
__global__ void norm_rows_kernel(const float* __restrict__ x, CudaNorm n, int64_t K, int64_t units, int warps,
                                 float* __restrict__ xn, float* __restrict__ row_scale) {
  __shared__ float part[kMaxWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * K;
  float squares = 0.0f;
  for (int64_t u = static_cast<int64_t>(warp) * 32 + lane; u < units; u += static_cast<int64_t>(warps) * 32) {
#pragma unroll
    for (int i = 0; i < UK; ++i) {
      const int64_t k = u * UK + i;
      float h = k < K ? x[row + k] : 0.0f;  // padded k: 0
      if (k < K && n.skip != nullptr) {
        h += n.skip[row + k];
        n.sum[row + k] = h;
      }
      squares += h * h;
      if (k < K) xn[row + k] = h * n.weight[k];
    }
  }
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, off);
  if (lane == 0) part[warp] = squares;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = part[0];
    for (int w = 1; w < warps; ++w) total += part[w];
    row_scale[blockIdx.x] = inverse_rms(total, K, n.epsilon);
  }
}

// Device memory that only grows, one per host thread (a session's nodes run in order on its stream, and a run ends
// with the stream synchronised, so the next node or run on this thread may reuse it).
struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  ~DeviceBuffer() {
    if (data != nullptr) cudaFree(data);  // at process exit the context may be gone already: nothing to report
  }
  std::string reserve(size_t wanted) {
    if (wanted <= bytes) return "";
    if (data != nullptr) cudaFree(data);  // cudaFree waits for the device, so no queued kernel still reads it
    data = nullptr;
    bytes = 0;
    if (cudaMalloc(&data, wanted) != cudaSuccess) return "cannot allocate " + std::to_string(wanted) + " bytes";
    bytes = wanted;
    return "";
  }
};

// Many rows in norm mode: norm_rows_kernel into this thread's scratch, then the plain kernels on it.
std::string launch_norm_rows(DeviceArgs& a, cudaStream_t s) {
  thread_local DeviceBuffer scratch;
  const size_t floats = static_cast<size_t>(a.M) * static_cast<size_t>(a.K + 1);
  if (std::string err = scratch.reserve(floats * sizeof(float)); !err.empty()) return err;
  float* xn = static_cast<float*>(scratch.data);
  float* row_scale = xn + a.M * a.K;
  const float* x = static_cast<const float*>(a.x);
  const dim3 grid(static_cast<unsigned>(a.M)), block(a.warps * 32);
  if (a.bits == 4) norm_rows_kernel<8><<<grid, block, 0, s>>>(x, a.norm, a.K, a.units, a.warps, xn, row_scale);
  else if (a.bits == 8) norm_rows_kernel<4><<<grid, block, 0, s>>>(x, a.norm, a.K, a.units, a.warps, xn, row_scale);
  else norm_rows_kernel<16><<<grid, block, 0, s>>>(x, a.norm, a.K, a.units, a.warps, xn, row_scale);
  a.x = xn;
  a.row_scale = row_scale;
  a.vec_x = a.K % 4 == 0;  // xn rows start 16-byte aligned when K % 4 == 0 (cudaMalloc aligns the base)
  return "";
}

// blockIdx.x: tile; blockIdx.y: rows m0 + R*y .. + R-1. R is the kernel's, chosen per launch; the sums do not
// depend on it, so a full launch of R = 4 and a tail launch of fewer rows give every row the same bits.
// The norm's kernels keep fewer blocks per SM for more registers (the default's 4-bit one spilled 48 bytes at 64):
// the nodes they serve have 72-384 column tiles, under 3 blocks per SM at one row group.
template <int FORM, int BITS, int R, bool NORM, typename T>
__global__ void __launch_bounds__(kMaxWarps * 32, NORM ? (R >= 2 ? 3 : 4) : (R >= 2 ? 4 : 8))
    qmatmul_kernel(DeviceArgs a, int64_t m_begin) {
  const int64_t m0 = m_begin + static_cast<int64_t>(blockIdx.y) * R;
  const int rows = static_cast<int>(a.M - m0 < R ? a.M - m0 : R);
  tile_rows<FORM, BITS, R, NORM, T>(a, blockIdx.x, m0, rows);
}

template <int FORM, int BITS, bool NORM, typename T>
void launch_bits(const DeviceArgs& a, cudaStream_t s) {
  const int64_t full = a.M / kMaxRows, tail = a.M % kMaxRows;
  const dim3 block(a.warps * 32);
  if (full > 0) qmatmul_kernel<FORM, BITS, kMaxRows, NORM, T><<<dim3(a.tiles, full), block, 0, s>>>(a, 0);
  const int64_t m = full * kMaxRows;
  if (tail == 1) qmatmul_kernel<FORM, BITS, 1, NORM, T><<<dim3(a.tiles, 1), block, 0, s>>>(a, m);
  else if (tail == 2) qmatmul_kernel<FORM, BITS, 2, NORM, T><<<dim3(a.tiles, 1), block, 0, s>>>(a, m);
  else if (tail > 0) qmatmul_kernel<FORM, BITS, kMaxRows, NORM, T><<<dim3(a.tiles, 1), block, 0, s>>>(a, m);
}

template <int FORM, bool NORM, typename T>
void launch_form(const DeviceArgs& a, cudaStream_t s) {
  if (a.bits == 4) launch_bits<FORM, 4, NORM, T>(a, s);
  else if (a.bits == 8) launch_bits<FORM, 8, NORM, T>(a, s);
  else if (a.bits == 3) launch_bits<FORM, 3, NORM, T>(a, s);
  else launch_bits<FORM, 2, NORM, T>(a, s);
}

template <bool NORM, typename T>
void launch_type(const DeviceArgs& a, cudaStream_t s) {
  if (a.scale_codes) launch_form<kTwoLevel, NORM, T>(a, s);
  else if (a.mins_f32 || a.mins_f16) launch_form<kMins, NORM, T>(a, s);
  else launch_form<kZeros, NORM, T>(a, s);
}

}  // namespace

std::string launch_qmatmul_cuda(const QMatMulArgs& h, const uint16_t* x16, uint16_t* y16, const CudaNorm* norm,
                                void* stream) {
  if (h.M == 0) return "";
  if (reinterpret_cast<uintptr_t>(h.codes) % 16 != 0) return "the packed codes must be 16-byte aligned";
  const bool half = x16 != nullptr;
  if (half && norm != nullptr) return "the norm needs float32 X";
  const void* x = half ? static_cast<const void*>(x16) : h.x;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec_x = !half && h.K % 4 == 0 && aligned(h.x) &&
                     (norm == nullptr || (aligned(norm->weight) && aligned(norm->skip) && aligned(norm->sum)));
  const int64_t units = h.Kp / unit_k(h.bits);
  const int warps = static_cast<int>(units >= 96 ? kMaxWarps : (units + 31) / 32);
  DeviceArgs a{x, h.M, h.K, h.G, h.tiles, h.tile_bytes, h.group, units, static_cast<int>(h.N), h.bits, warps,
               h.gated, vec_x, h.codes, h.scales, h.scales_f16, h.zeros_u8, h.zeros_f32, h.mins_f32, h.mins_f16,
               h.scale_codes, h.scale_stats, h.zero_codes, h.zero_stats, h.stat_rows,
               static_cast<int>(h.stat_row_count), h.bias, h.outlier_values, h.outlier_cols,
               h.outlier_rowptr, half ? static_cast<void*>(y16) : h.y, norm != nullptr ? *norm : CudaNorm{}, nullptr};
  if (h.tiles > 0x7fffffff || h.M / kMaxRows > 65535) return "too many rows or columns for one launch";
  const auto s = static_cast<cudaStream_t>(stream);
  if (half) {
    launch_type<false, __half>(a, s);
  } else if (norm != nullptr && h.M <= kOnePassRows) {
    launch_type<true, float>(a, s);
  } else {
    if (norm != nullptr)
      if (std::string err = launch_norm_rows(a, s); !err.empty()) return err;
    launch_type<false, float>(a, s);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? std::string() : std::string("CUDA launch failed: ") + cudaGetErrorString(err);
}

std::string launch_projection_cuda(QMatMulArgs& a, void* stream) {
  thread_local DeviceBuffer projected;  // not launch_norm_rows' scratch: the node's matmul reads both
  if (std::string err = projected.reserve(static_cast<size_t>(a.M * a.N) * sizeof(float)); !err.empty()) return err;
  a.y = static_cast<float*>(projected.data);
  return launch_qmatmul_cuda(a, nullptr, nullptr, nullptr, stream);
}

}  // namespace edge
