// Host side of edge.QMatMul's norm mode on CUDA (rms_norm_cuda.cu); plain C++ so the ORT glue compiles with g++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace edge {

// Device pointers; skip may be null (then sum is not written). Queued on `stream` (a cudaStream_t); "" on success.
std::string launch_rms_norm_cuda(const float* x, const float* skip, const float* weight, float epsilon, int64_t rows,
                                 int64_t k, float* sum, float* out, void* stream);

// Device memory that only grows, freed with its owner (a thread's scratch for the normalised rows).
struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  ~DeviceBuffer();
  std::string reserve(size_t wanted);  // "" on success
};

}  // namespace edge
