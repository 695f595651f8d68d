// The CUDAExecutionProvider registration of edge.QMatMul: same name, inputs and attributes as the CPU op, inputs and
// output in device memory, work queued on ORT's compute stream (OrtApi slot 193).
#include "qmatmul_cuda.h"
#include "qmatmul_op.h"

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
  if (t.has_pre) {
    if (std::string err = launch_projection_cuda(t.pre, stream); !err.empty())
      return make_status(kOrtRuntimeException, "edge.QMatMul (CUDA): " + err);
    t.args.x = t.pre.y;
  }
  CudaNorm norm{t.skip, t.norm_weight, t.sum, k->norm_epsilon};
  // Outlier indices live on the device and are not range-checked here (the CPU op checks them).
  const std::string err = launch_qmatmul_cuda(t.args, t.x16, t.y16, k->norm ? &norm : nullptr, stream);
  return err.empty() ? nullptr : make_status(kOrtRuntimeException, "edge.QMatMul (CUDA): " + err);
}

OrtCustomOp g_cuda_op = make_qmatmul_op(cuda_provider, compute_cuda, compute_v1<compute_cuda>, false);
OrtCustomOp g_cuda_op_f16 = make_qmatmul_op(cuda_provider, compute_cuda, compute_v1<compute_cuda>, true);

}  // namespace

const OrtCustomOp* cuda_op(bool half) { return half ? &g_cuda_op_f16 : &g_cuda_op; }

}  // namespace edge
