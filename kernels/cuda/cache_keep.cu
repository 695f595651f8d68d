// Compaction of a device KV cache after a draft tree: keep, in order, the accepted rows src[0..n) and move them to
// rows start, start+1, ... of every cache buffer (what edge.kv_cache.KVCache.keep does with numpy on the CPU).
//
// src is increasing and src[i] >= start + i, so copying rows in increasing i never overwrites a row that a later
// copy reads; a block walks its buffer's rows in that order (one block per buffer and kv head).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace {

constexpr int kMaxBuffers = 256, kMaxRows = 64;

struct KeepArgs {
  float* buffers[kMaxBuffers];
  int32_t src[kMaxRows];
  int64_t capacity, head_dim, start;
  int n;
};

__global__ void keep_kernel(const __grid_constant__ KeepArgs a) {
  float* head = a.buffers[blockIdx.x] + static_cast<int64_t>(blockIdx.y) * a.capacity * a.head_dim;
  for (int i = 0; i < a.n; ++i) {
    if (a.src[i] != a.start + i) {
      const float* from = head + a.src[i] * a.head_dim;
      float* to = head + (a.start + i) * a.head_dim;
      for (int64_t d = threadIdx.x; d < a.head_dim; d += blockDim.x) to[d] = from[d];
    }
    __syncthreads();
  }
}

}  // namespace

// buffers: `count` device pointers to (1, kv_heads, capacity, head_dim) float32 caches. Runs on the legacy default
// stream and waits for it (the caller's onnxruntime runs have finished; the next must see the moved rows).
// Returns nullptr on success, else the error.
extern "C" __attribute__((visibility("default"))) const char* edge_cache_keep(
    float* const* buffers, int64_t count, int64_t kv_heads, int64_t capacity, int64_t head_dim, int64_t start,
    const int64_t* src, int64_t n) {
  static thread_local std::string error;
  if (count > kMaxBuffers || n > kMaxRows) return "too many cache buffers or kept rows for one call";
  KeepArgs a{};
  for (int64_t i = 0; i < count; ++i) a.buffers[i] = buffers[i];
  for (int64_t i = 0; i < n; ++i) {
    if (src[i] < start + i || src[i] >= capacity || (i > 0 && src[i] <= src[i - 1]))
      return "kept rows must be increasing, at or after their destination, and inside the cache";
    a.src[i] = static_cast<int32_t>(src[i]);
  }
  a.capacity = capacity, a.head_dim = head_dim, a.start = start, a.n = static_cast<int>(n);
  keep_kernel<<<dim3(static_cast<unsigned>(count), static_cast<unsigned>(kv_heads)), 128>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaStreamSynchronize(0);
  if (err == cudaSuccess) return nullptr;
  error = std::string("compacting the device KV cache: ") + cudaGetErrorString(err);
  return error.c_str();
}
