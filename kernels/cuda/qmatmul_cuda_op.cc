// The CUDAExecutionProvider registration of edge.QMatMul: same name, inputs and attributes as the CPU op, inputs and
// output in device memory, work queued on ORT's compute stream (OrtApi slot 193).
#include "qmatmul_cuda.h"
#include "qmatmul_op.h"
#include "rms_norm_cuda.h"

namespace edge {

namespace {

const char* cuda_provider(const OrtCustomOp*) { return "CUDAExecutionProvider"; }

OrtStatus* compute_cuda(void* kernel, OrtKernelContext* ctx) {
  const auto* k = static_cast<const QMatMulKernel*>(kernel);
  BoundTensors t;
  if (OrtStatus* st = bind_tensors(*k, ctx, &t)) return st;
  if (t.args.M == 0) return nullptr;
  void* stream = nullptr;
  if (OrtStatus* st = g_ort.KernelContext_GetGPUComputeStream(ctx, &stream)) return st;
  std::string err;
  if (k->norm) {  // the rows normalised into this thread's scratch, in stream order before the matmul reads them
    thread_local DeviceBuffer normed;
    err = normed.reserve(static_cast<size_t>(t.args.M * t.args.K) * sizeof(float));
    if (err.empty())
      err = launch_rms_norm_cuda(t.args.x, t.skip, t.norm_weight, k->norm_epsilon, t.args.M, t.args.K, t.sum,
                                 static_cast<float*>(normed.data), stream);
    t.args.x = static_cast<const float*>(normed.data);
  }
  // Outlier indices live on the device and are not range-checked here (the CPU op checks them).
  if (err.empty()) err = launch_qmatmul_cuda(t.args, t.x16, t.y16, stream);
  return err.empty() ? nullptr : make_status(kOrtRuntimeException, "edge.QMatMul (CUDA): " + err);
}

OrtCustomOp g_cuda_op = make_qmatmul_op(cuda_provider, compute_cuda, compute_v1<compute_cuda>, false);
OrtCustomOp g_cuda_op_f16 = make_qmatmul_op(cuda_provider, compute_cuda, compute_v1<compute_cuda>, true);

}  // namespace

const OrtCustomOp* cuda_op(bool half) { return half ? &g_cuda_op_f16 : &g_cuda_op; }

}  // namespace edge
