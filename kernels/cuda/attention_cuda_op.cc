// The CUDAExecutionProvider registration of edge.Attention: the CPU op's inputs, checks and attributes, with
// seqlens_k and total_sequence_length in host memory (they size the call) and everything else on the device.
#include "attention_cuda.h"
#include "attention_op.h"

namespace edge {

namespace {

const char* cuda_provider(const OrtCustomOp*) { return "CUDAExecutionProvider"; }

int input_memory(const OrtCustomOp*, size_t index) { return index == 5 || index == 6 ? kOrtMemTypeCPUInput : 0; }

OrtStatus* compute_cuda(void* kernel, OrtKernelContext* ctx) {
  TensorView in[kAttentionInputs];
  AttentionArgs a;
  if (OrtStatus* st = prepare_attention(*static_cast<const AttentionKernel*>(kernel), ctx, in, a, false)) return st;
  void* stream = nullptr;
  if (OrtStatus* st = g_ort.KernelContext_GetGPUComputeStream(ctx, &stream)) return st;
  const std::string err = launch_attention_cuda(a, static_cast<const float*>(in[3].data),
                                                static_cast<const float*>(in[4].data), stream);
  return err.empty() ? nullptr : make_status(kOrtRuntimeException, "edge.Attention (CUDA): " + err);
}

OrtCustomOp g_op = make_custom_op(attention_spec(cuda_provider, compute_cuda, compute_v1<compute_cuda>, input_memory));

}  // namespace

const OrtCustomOp* cuda_attention_op() { return &g_op; }

}  // namespace edge
