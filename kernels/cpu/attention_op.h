// The ORT registration of edge.Attention (attention_op.cc; CUDA: cuda/attention_cuda_op.cc); the kernels themselves
// are in attention.h and cuda/attention_cuda.cu.
#pragma once

#include <cstdint>

#include "attention.h"
#include "ort_api.h"

namespace edge {

constexpr size_t kAttentionInputs = 13;

// The node's attributes.
struct AttentionKernel {
  int64_t H = 0, KV = 0;
  float scale = 0.0f;  // 0: 1/sqrt(D)
  int64_t window = 0;  // local_window_size; 0: none
  float norm_eps = 0.0f;  // qk_norm_epsilon, for inputs 11 and 12
};

OrtStatus* create_attention_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** kernel);
void destroy_attention_kernel(void* kernel);

// Read and check every input, get the three outputs, and fill `a` (kcache/vcache: the present buffers, which are the
// past ones when bound in place). host_positions: whether position_ids are in host memory (then range-checked; the
// CUDA kernel clamps device ones instead).
OrtStatus* prepare_attention(const AttentionKernel& k, OrtKernelContext* ctx, TensorView* in, AttentionArgs& a,
                             bool host_positions);

// The op's spec for make_custom_op, on the given provider. half_cache: the registration whose past and present are
// float16 (kcache16/vcache16), beside the float32 one: onnxruntime merges same-named ops' type constraints.
CustomOpSpec attention_spec(const char* (*provider)(const OrtCustomOp*), OrtStatus* (*compute)(void*, OrtKernelContext*),
                            void (*compute_v1)(void*, OrtKernelContext*), int (*input_memory)(const OrtCustomOp*, size_t),
                            bool half_cache = false);

// edge.Attention on the CPU execution provider (version 17 OrtCustomOp, static storage), for a float32 or a float16
// KV cache.
const OrtCustomOp* cpu_attention_op(bool half_cache);

#ifdef EDGE_WITH_CUDA
// The same op on the CUDAExecutionProvider (cuda/attention_cuda_op.cc).
const OrtCustomOp* cuda_attention_op();
#endif

}  // namespace edge
