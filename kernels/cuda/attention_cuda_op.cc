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
  float* present[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    OrtValue* out = nullptr;
    if (OrtStatus* st = g_ort.KernelContext_GetOutput(ctx, 1 + i, in[3].dims.data(), 4, &out)) return st;
    void* data = nullptr;
    if (OrtStatus* st = g_ort.GetTensorMutableData(out, &data)) return st;
    present[i] = static_cast<float*>(data);
  }
  a.kcache = present[0];
  a.vcache = present[1];
  void* stream = nullptr;
  if (OrtStatus* st = g_ort.KernelContext_GetGPUComputeStream(ctx, &stream)) return st;
  const std::string err = launch_attention_cuda(a, static_cast<const float*>(in[3].data),
                                                static_cast<const float*>(in[4].data), stream);
  return err.empty() ? nullptr : make_status(kOrtRuntimeException, "edge.Attention (CUDA): " + err);
}

void compute_cuda_v1(void* kernel, OrtKernelContext* ctx) {
  if (OrtStatus* st = compute_cuda(kernel, ctx)) g_ort.ReleaseStatus(st);
}

OrtCustomOp g_op = make_custom_op(attention_spec(cuda_provider, compute_cuda, compute_cuda_v1, input_memory));

}  // namespace

const OrtCustomOp* cuda_attention_op() { return &g_op; }

}  // namespace edge
