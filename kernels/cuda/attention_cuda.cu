// CUDA kernels of edge.Attention (the CPU op's contract, attention_op.cc), with the CPU kernel's batch-invariance.
//
// One block per (row, head). Scores are computed per key (threads take keys t = tid, tid + blockDim, ...; each dot
// product is a sequential sum over the head dimension), the maximum is exact in any order, and exp(score - max) is
// written per key; then the thread of each output dimension walks the keys in order, adding e to the softmax sum
// and e * value to its dimension. So each output is the same sequence of roundings whatever the call's number of
// rows, and a key masked by the tree bias adds exact zeros: a tree row equals its path decoded alone, as on the CPU.
#include <cuda_runtime.h>

#include <string>

#include "attention.h"
#include "attention_cuda.h"

namespace edge {
namespace {

constexpr int kMaxHeadDim = 256;  // a thread for each dimension of a head, at most a block of 256

__device__ __forceinline__ int64_t clamp_position(const AttentionArgs& a, int64_t s) {
  const int64_t p = a.positions[s];  // device memory: out-of-range positions are clamped, never read outside
  return p < 0 ? 0 : (p >= a.rope_rows ? a.rope_rows - 1 : p);
}

// The sum of v over the block's threads (blockDim a multiple of 32, every thread calling), in an order fixed by the
// block's size alone. `warp_sums`: shared memory for one float per warp.
__device__ float block_sum(float v, float* warp_sums) {
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += warp_sums[w];
  __syncthreads();
  return total;
}

// The factor that RMS-normalises the head vector x (D floats; q/k norms: the CPU's rms_norm.h with the sum in another
// fixed order), each thread of the block summing its dimensions i and i + D/2; 1 without norm weights.
__device__ float head_norm_factor(const float* x, const float* weight, int64_t D, float eps, float* warp_sums) {
  if (weight == nullptr) return 1.0f;
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < D / 2; i += blockDim.x) squares += x[i] * x[i] + x[i + D / 2] * x[i + D / 2];
  return 1.0f / sqrtf(block_sum(squares, warp_sums) / static_cast<float>(D) + eps);
}

// Rows P .. P+S-1 of the cache: keys normalised (q/k norms) and rotated, values copied. Grid (S, KV), threads over
// the half head.
__global__ void write_cache_kernel(AttentionArgs a) {
  __shared__ float warp_sums[kMaxHeadDim / 32];
  const int64_t s = blockIdx.x, g = blockIdx.y, half = a.D / 2, pos = clamp_position(a, s);
  const float* kin = a.k + s * a.kv_stride + g * a.D;
  const float* vin = a.v + s * a.kv_stride + g * a.D;
  float* key = a.kcache + (g * a.L + a.P + s) * a.D;
  float* val = a.vcache + (g * a.L + a.P + s) * a.D;
  const float inv = head_norm_factor(kin, a.k_norm, a.D, a.norm_eps, warp_sums);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float x0 = kin[i], x1 = kin[i + half];
    if (a.k_norm != nullptr) x0 = x0 * inv * a.k_norm[i], x1 = x1 * inv * a.k_norm[i + half];
    const float c = a.cos[pos * half + i], sn = a.sin[pos * half + i];
    key[i] = x0 * c - x1 * sn;
    key[i + half] = x1 * c + x0 * sn;
    val[i] = vin[i];
    val[i + half] = vin[i + half];
  }
}

// Up to this many rows a call (decode and verify steps, a few blocks on the whole GPU) asks for its rows' keys and
// values from memory at once, before the first is needed: the step's weights have pushed the cache out of L2, and
// the loops below would otherwise wait for memory once per block of keys (H200, 195-token past: 15 -> 13 us a
// layer). A prefill's many blocks hide the wait anyway.
constexpr int64_t kPrefetchRows = 16;

__device__ __forceinline__ void prefetch_l2(const float* keys, const float* values, int64_t bytes) {
  const char* k = reinterpret_cast<const char*>(keys);
  const char* v = reinterpret_cast<const char*>(values);
  for (int64_t off = threadIdx.x * 128; off < bytes; off += blockDim.x * 128) {  // a 128-byte line a thread
    asm volatile("prefetch.global.L2 [%0];" ::"l"(k + off));
    asm volatile("prefetch.global.L2 [%0];" ::"l"(v + off));
  }
}

// One block per (row s, head h): blockIdx.x = s * H + h. Shared memory: the rotated query (D) and the row's scores.
// All threads score keys (each key's dot product by one thread, in order over d); thread i < D then accumulates
// output dimension i over the keys in order. A warp per (row, head) did the same arithmetic with 9 warps on the
// GPU for a decode step, one memory latency after another: 44 us a layer at a 195-token past on an H200 (13 now).
__global__ void __launch_bounds__(kMaxHeadDim) attend_kernel(AttentionArgs a) {
  extern __shared__ float smem[];
  __shared__ float warp_top[kMaxHeadDim / 32];
  __shared__ float warp_sums[kMaxHeadDim / 32];
  float* q = smem;
  float* scores = smem + a.D;
  const int tid = threadIdx.x, lane = tid & 31, warps = blockDim.x / 32;
  const int64_t s = blockIdx.x / a.H, h = blockIdx.x % a.H, D = a.D, half = D / 2;
  const int64_t g = h / (a.H / a.KV), pos = clamp_position(a, s);
  const int64_t first = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
  const int64_t n = a.P + s + 1 - first;
  const float* keys = a.kcache + (g * a.L + first) * D;
  const float* values = a.vcache + (g * a.L + first) * D;
  if (a.S <= kPrefetchRows) prefetch_l2(keys, values, n * D * static_cast<int64_t>(sizeof(float)));
  const float* qin = a.q + s * a.q_stride + h * D;
  const float inv = head_norm_factor(qin, a.q_norm, D, a.norm_eps, warp_sums);
  for (int64_t i = tid; i < half; i += blockDim.x) {
    float x0 = qin[i], x1 = qin[i + half];
    if (a.q_norm != nullptr) x0 = x0 * inv * a.q_norm[i], x1 = x1 * inv * a.q_norm[i + half];
    const float c = a.cos[pos * half + i], sn = a.sin[pos * half + i];
    q[i] = x0 * c - x1 * sn;
    q[i + half] = x1 * c + x0 * sn;
  }
  __syncthreads();
  const float* bias = a.bias != nullptr ? a.bias + s * (a.P + a.S) + first : nullptr;
  float top = -INFINITY;
  const bool vec = D % 4 == 0;  // rows of D floats, 16-byte aligned (the cache is ORT's allocation)
  for (int64_t t = tid; t < n; t += blockDim.x) {
    const float* kr = keys + t * D;
    float dot = 0.0f;
    if (vec) {
#pragma unroll 8
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
  if (lane == 0) warp_top[tid / 32] = top;
  __syncthreads();
  for (int w = 0; w < warps; ++w) top = fmaxf(top, warp_top[w]);  // the maximum is exact in any order
  for (int64_t t = tid; t < n; t += blockDim.x) scores[t] = expf(scores[t] - top);
  __syncthreads();
  if (tid >= D) return;
  // Keys in order, in blocks of kBlock whose values are loaded before any is added (loads in flight, not one
  // memory latency per key); the additions stay in key order.
  constexpr int kBlock = 32;
  float acc = 0.0f, sum = 0.0f;
  for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
    float v[kBlock];
#pragma unroll
    for (int b = 0; b < kBlock; ++b) v[b] = t0 + b < n ? __ldg(values + (t0 + b) * D + tid) : 0.0f;
#pragma unroll
    for (int b = 0; b < kBlock; ++b) {
      if (t0 + b >= n) break;
      const float e = scores[t0 + b];
      sum += e;
      acc = fmaf(e, v[b], acc);
    }
  }
  a.out[s * a.H * D + h * D + tid] = acc / sum;
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
  const int block = a.D > 128 ? kMaxHeadDim : 128;  // at least D threads: one for each dimension of the output
  attend_kernel<<<static_cast<unsigned>(a.S * a.H), block, shared, st>>>(a);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? std::string() : std::string("CUDA launch failed: ") + cudaGetErrorString(err);
}

}  // namespace edge
