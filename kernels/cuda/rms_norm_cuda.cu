// The norm mode of edge.QMatMul on CUDA (cpu/rms_norm.h): one block per row, a fixed-order sum of squares, so a row's
// result never depends on the other rows or on how many there are.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "rms_norm_cuda.h"

namespace edge {

namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ skip,
                                const float* __restrict__ weight, float epsilon, int64_t k, float* __restrict__ sum,
                                float* __restrict__ out) {
  __shared__ float partial[kThreads];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * k;
  const float* sr = skip != nullptr ? skip + row * k : nullptr;
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < k; i += kThreads) {
    const float h = sr != nullptr ? xr[i] + sr[i] : xr[i];
    if (sr != nullptr) sum[row * k + i] = h;
    acc += h * h;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  const float r = 1.0f / sqrtf(partial[0] / static_cast<float>(k) + epsilon);
  for (int64_t i = threadIdx.x; i < k; i += kThreads) {
    const float h = sr != nullptr ? xr[i] + sr[i] : xr[i];
    out[row * k + i] = (h * r) * weight[i];
  }
}

}  // namespace

std::string launch_rms_norm_cuda(const float* x, const float* skip, const float* weight, float epsilon, int64_t rows,
                                 int64_t k, float* sum, float* out, void* stream) {
  if (rows == 0) return "";
  if (rows > 0x7fffffff) return "too many rows for one launch";
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, skip, weight, epsilon, k, sum, out);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? std::string() : std::string("CUDA launch failed: ") + cudaGetErrorString(err);
}

DeviceBuffer::~DeviceBuffer() {
  if (data != nullptr) cudaFree(data);  // at process exit the context may be gone already: nothing to report
}

std::string DeviceBuffer::reserve(size_t wanted) {
  if (wanted <= bytes) return "";
  if (data != nullptr) cudaFree(data);  // cudaFree waits for the device, so no queued kernel still reads it
  data = nullptr;
  bytes = 0;
  if (cudaMalloc(&data, wanted) != cudaSuccess) return "cannot allocate " + std::to_string(wanted) + " bytes";
  bytes = wanted;
  return "";
}

}  // namespace edge
