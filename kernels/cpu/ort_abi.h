// Our own minimal declarations of the ONNX Runtime C ABI (custom-op subset).
//
// Why hand-written: no ORT headers ship on PyPI, and copying upstream header text is not allowed. Everything here is a
// fact about the binary interface, written from /work/shared/notes/onnxruntime.md section 4: the two-pointer
// OrtApiBase, the OrtCustomOp field order (we fill version 17), and the fixed positions of the OrtApi entries we call
// (the table is append-only, so a position never moves once released).
//
// We never link libonnxruntime: the runtime hands us its table in RegisterCustomOps, and every call goes through it.
// Slots are read by index from that table (see EdgeOrtApi in ort_api.h), which lets a debug switch corrupt one on
// purpose to prove the registration self-check catches a wrong index.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// Opaque runtime objects: we only ever hold pointers to them.
struct OrtApi;
struct OrtStatus;
struct OrtSessionOptions;
struct OrtCustomOpDomain;
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtValue;
struct OrtTensorTypeAndShapeInfo;
struct OrtShapeInferContext;

// Element types, error codes and memory types are plain ints at the ABI level.
enum EdgeOrtElementType : int {
  kOrtUndefined = 0,
  kOrtFloat = 1,
  kOrtUint8 = 2,
  kOrtInt32 = 6,
  kOrtInt64 = 7,
  kOrtFloat16 = 10,
};

enum EdgeOrtErrorCode : int {
  kOrtOk = 0,
  kOrtFail = 1,
  kOrtInvalidArgument = 2,
  kOrtRuntimeException = 6,
  kOrtNotImplemented = 9,
};

enum EdgeOrtCharacteristic : int { kOrtRequired = 0, kOrtOptional = 1, kOrtVariadic = 2 };

// What the runtime passes to RegisterCustomOps: two function pointers, frozen for all versions.
struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
};

// The custom-op description ORT reads. Field order and types are the ABI; the runtime reads fields up to the version
// we declare (17), the later ones are kept zero.
struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info);
  const char* (*GetName)(const OrtCustomOp* op);
  const char* (*GetExecutionProviderType)(const OrtCustomOp* op);
  int (*GetInputType)(const OrtCustomOp* op, size_t index);
  size_t (*GetInputTypeCount)(const OrtCustomOp* op);
  int (*GetOutputType)(const OrtCustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const OrtCustomOp* op);
  void (*KernelCompute)(void* kernel, OrtKernelContext* context);
  void (*KernelDestroy)(void* kernel);
  int (*GetInputCharacteristic)(const OrtCustomOp* op, size_t index);
  int (*GetOutputCharacteristic)(const OrtCustomOp* op, size_t index);
  int (*GetInputMemoryType)(const OrtCustomOp* op, size_t index);
  int (*GetVariadicInputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp* op);
  int (*GetVariadicOutputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp* op);
  OrtStatus* (*CreateKernelV2)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info, void** kernel);
  OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context);
  OrtStatus* (*InferOutputShapeFn)(const OrtCustomOp* op, OrtShapeInferContext* ctx);
  int (*GetStartVersion)(const OrtCustomOp* op);
  int (*GetEndVersion)(const OrtCustomOp* op);
  // Fields of later versions; ORT does not read them for version 17, we keep them zero.
  void* reserved_since_18[4];
};

}  // extern "C"

// The API version we request and declare in OrtCustomOp::version: accepted by every ORT from 1.20 to 1.31.
constexpr uint32_t kEdgeOrtApiVersion = 17;
