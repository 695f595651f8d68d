// CUDA kernels of edge.Attention (the CPU op's contract, attention_op.cc), with the CPU kernel's batch-invariance.
//
// One warp per (row, head). Scores are computed per key (lanes take keys t = lane, lane + 32, ...; each dot product
// is a sequential sum over the head dimension), the maximum is exact in any order, and exp(score - max) is written
// per key; then every lane walks the keys in order, adding e to the softmax sum and e * value to the head
// dimensions it owns. So each output is the same sequence of roundings whatever the call's number of rows, and a
// key masked by the tree bias adds exact zeros: a tree row equals its path decoded alone, as on the CPU.
#include <cuda_runtime.h>

#include <string>

#include "attention.h"
#include "attention_cuda.h"

namespace edge {
namespace {

constexpr int kMaxHeadDim = 256;  // 8 dimensions per lane

__device__ __forceinline__ int64_t clamp_position(const AttentionArgs& a, int64_t s) {
  const int64_t p = a.positions[s];  // device memory: out-of-range positions are clamped, never read outside
  return p < 0 ? 0 : (p >= a.rope_rows ? a.rope_rows - 1 : p);
}

// Rows P .. P+S-1 of the cache: keys rotated, values copied. Grid (S, KV), threads over the half head.
__global__ void write_cache_kernel(AttentionArgs a) {
  const int64_t s = blockIdx.x, g = blockIdx.y, half = a.D / 2, pos = clamp_position(a, s);
  const float* kin = a.k + s * a.kv_stride + g * a.D;
  const float* vin = a.v + s * a.kv_stride + g * a.D;
  float* key = a.kcache + (g * a.L + a.P + s) * a.D;
  float* val = a.vcache + (g * a.L + a.P + s) * a.D;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float x0 = kin[i], x1 = kin[i + half], c = a.cos[pos * half + i], sn = a.sin[pos * half + i];
    key[i] = x0 * c - x1 * sn;
    key[i + half] = x1 * c + x0 * sn;
    val[i] = vin[i];
    val[i + half] = vin[i + half];
  }
}

// One warp per (row s, head h): blockIdx.x = s * H + h. Shared memory: the rotated query (D) and the row's scores.
__global__ void attend_kernel(AttentionArgs a) {
  extern __shared__ float smem[];
  float* q = smem;
  float* scores = smem + a.D;
  const int lane = threadIdx.x;
  const int64_t s = blockIdx.x / a.H, h = blockIdx.x % a.H, D = a.D, half = D / 2;
  const int64_t g = h / (a.H / a.KV), pos = clamp_position(a, s);
  const float* qin = a.q + s * a.q_stride + h * D;
  for (int64_t i = lane; i < half; i += 32) {
    const float x0 = qin[i], x1 = qin[i + half], c = a.cos[pos * half + i], sn = a.sin[pos * half + i];
    q[i] = x0 * c - x1 * sn;
    q[i + half] = x1 * c + x0 * sn;
  }
  __syncwarp();
  const int64_t first = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
  const int64_t n = a.P + s + 1 - first;
  const float* keys = a.kcache + (g * a.L + first) * D;
  const float* values = a.vcache + (g * a.L + first) * D;
  const float* bias = a.bias != nullptr ? a.bias + s * (a.P + a.S) + first : nullptr;
  float top = -INFINITY;
  const bool vec = D % 4 == 0;  // rows of D floats, 16-byte aligned (the cache is ORT's allocation)
  for (int64_t t = lane; t < n; t += 32) {
    const float* kr = keys + t * D;
    float dot = 0.0f;
    if (vec) {
#pragma unroll 4
      for (int64_t d = 0; d < D; d += 4) {
        const float4 k4 = __ldg(reinterpret_cast<const float4*>(kr + d));
        dot = fmaf(q[d], k4.x, dot);
        dot = fmaf(q[d + 1], k4.y, dot);
        dot = fmaf(q[d + 2], k4.z, dot);
        dot = fmaf(q[d + 3], k4.w, dot);
      }
    } else {
      for (int64_t d = 0; d < D; ++d) dot = fmaf(q[d], __ldg(kr + d), dot);
    }
    const float score = dot * a.scale + (bias != nullptr ? bias[t] : 0.0f);
    scores[t] = score;
    top = fmaxf(top, score);
  }
  for (int off = 16; off >= 1; off >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, off));
  for (int64_t t = lane; t < n; t += 32) scores[t] = expf(scores[t] - top);
  __syncwarp();
  float acc[kMaxHeadDim / 32], sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxHeadDim / 32; ++j) acc[j] = 0.0f;
  // Keys in order, in blocks of kBlock whose values are loaded before any is added (loads in flight, not one
  // memory latency per key); the additions stay in key order.
  constexpr int kBlock = 8;
  for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
    float e[kBlock], v[kBlock][kMaxHeadDim / 32];
#pragma unroll
    for (int b = 0; b < kBlock; ++b) {
      const bool live = t0 + b < n;
      e[b] = live ? scores[t0 + b] : 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxHeadDim / 32; ++j)
        v[b][j] = live && lane + 32 * j < D ? __ldg(values + (t0 + b) * D + lane + 32 * j) : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < kBlock; ++b) {
      if (t0 + b >= n) break;
      sum += e[b];
#pragma unroll
      for (int j = 0; j < kMaxHeadDim / 32; ++j) acc[j] = fmaf(e[b], v[b][j], acc[j]);
    }
  }
  float* out = a.out + s * a.H * D + h * D;
#pragma unroll
  for (int j = 0; j < kMaxHeadDim / 32; ++j)
    if (lane + 32 * j < D) out[lane + 32 * j] = acc[j] / sum;
}

}  // namespace

std::string launch_attention_cuda(const AttentionArgs& a, const float* past_key, const float* past_value,
                                  void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  if (a.D > kMaxHeadDim) return "head_dim above " + std::to_string(kMaxHeadDim) + " is not supported on CUDA";
  const float* past[2] = {past_key, past_value};
  float* present[2] = {a.kcache, a.vcache};
  for (int i = 0; i < 2; ++i) {  // not bound in place: carry the past over
    if (present[i] == past[i] || a.P == 0) continue;
    const size_t pitch = sizeof(float) * a.L * a.D;
    if (cudaError_t e = cudaMemcpy2DAsync(present[i], pitch, past[i], pitch, sizeof(float) * a.P * a.D, a.KV,
                                          cudaMemcpyDeviceToDevice, st))
      return std::string("copying the past cache: ") + cudaGetErrorString(e);
  }
  if (a.S == 0) return "";
  const int threads = static_cast<int>(a.D / 2 >= 128 ? 128 : ((a.D / 2 + 31) / 32) * 32);
  write_cache_kernel<<<dim3(static_cast<unsigned>(a.S), static_cast<unsigned>(a.KV)), threads, 0, st>>>(a);
  const size_t shared = sizeof(float) * (a.D + a.P + a.S);
  if (shared > 48 * 1024) {
    int device = 0, limit = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (shared > static_cast<size_t>(limit))
      return "a context of " + std::to_string(a.P + a.S) + " tokens needs more shared memory than this GPU has";
    cudaFuncSetAttribute(attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  }
  attend_kernel<<<static_cast<unsigned>(a.S * a.H), 32, shared, st>>>(a);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? std::string() : std::string("CUDA launch failed: ") + cudaGetErrorString(err);
}

}  // namespace edge
