// The OrtApi entries edge's kernels call, bound by their fixed slot index in the runtime's function table.
//
// Why a struct of typed pointers filled from indices: the indices below are the whole ABI contract, kept in one place,
// checked at registration by self_check() (ort_api.cc), and corruptible on purpose for the test of that check
// (environment variable EDGE_KERNELS_DEBUG_CORRUPT_SLOT=<index> binds that entry to the next slot instead).
#pragma once

#include <string>
#include <vector>

#include "ort_abi.h"

namespace edge {

// Slot numbers in the append-only OrtApi table (all frozen since API 18 or earlier).
enum OrtSlot : int {
  kSlotCreateStatus = 0,
  kSlotGetErrorCode = 1,
  kSlotGetErrorMessage = 2,
  kSlotCreateCustomOpDomain = 26,
  kSlotCustomOpDomainAdd = 27,
  kSlotAddCustomOpDomain = 28,
  kSlotGetTensorMutableData = 51,
  kSlotCreateTensorTypeAndShapeInfo = 57,
  kSlotSetTensorElementType = 58,
  kSlotSetDimensions = 59,
  kSlotGetTensorElementType = 60,
  kSlotGetDimensionsCount = 61,
  kSlotGetDimensions = 62,
  kSlotGetTensorShapeElementCount = 64,
  kSlotGetTensorTypeAndShape = 65,
  kSlotKernelInfoGetAttributeFloat = 85,
  kSlotKernelInfoGetAttributeInt64 = 86,
  kSlotKernelContextGetInputCount = 88,
  kSlotKernelContextGetOutputCount = 89,
  kSlotKernelContextGetInput = 90,
  kSlotKernelContextGetOutput = 91,
  kSlotReleaseStatus = 93,
  kSlotReleaseTensorTypeAndShapeInfo = 99,
  kSlotReleaseCustomOpDomain = 101,
  kSlotKernelContextGetGPUComputeStream = 193,
  kSlotKernelInfoGetConstantInputTensor = 249,
  kSlotKernelContextParallelFor = 274,
  kSlotGetTensorElementTypeAndShapeDataReference = 414,  // API 24
};

struct OrtApiFns {
  OrtStatus* (*CreateStatus)(int code, const char* msg);
  int (*GetErrorCode)(const OrtStatus* status);
  const char* (*GetErrorMessage)(const OrtStatus* status);
  OrtStatus* (*CreateCustomOpDomain)(const char* domain, OrtCustomOpDomain** out);
  OrtStatus* (*CustomOpDomain_Add)(OrtCustomOpDomain* domain, const OrtCustomOp* op);
  OrtStatus* (*AddCustomOpDomain)(OrtSessionOptions* options, OrtCustomOpDomain* domain);
  OrtStatus* (*GetTensorMutableData)(OrtValue* value, void** out);
  OrtStatus* (*CreateTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo** out);
  OrtStatus* (*SetTensorElementType)(OrtTensorTypeAndShapeInfo* info, int type);
  OrtStatus* (*SetDimensions)(OrtTensorTypeAndShapeInfo* info, const int64_t* dims, size_t count);
  OrtStatus* (*GetTensorElementType)(const OrtTensorTypeAndShapeInfo* info, int* out);
  OrtStatus* (*GetDimensionsCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out);
  OrtStatus* (*GetDimensions)(const OrtTensorTypeAndShapeInfo* info, int64_t* dims, size_t count);
  OrtStatus* (*GetTensorShapeElementCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out);
  OrtStatus* (*GetTensorTypeAndShape)(const OrtValue* value, OrtTensorTypeAndShapeInfo** out);
  OrtStatus* (*KernelInfoGetAttribute_float)(const OrtKernelInfo* info, const char* name, float* out);
  OrtStatus* (*KernelInfoGetAttribute_int64)(const OrtKernelInfo* info, const char* name, int64_t* out);
  OrtStatus* (*KernelContext_GetInputCount)(const OrtKernelContext* ctx, size_t* out);
  OrtStatus* (*KernelContext_GetOutputCount)(const OrtKernelContext* ctx, size_t* out);
  OrtStatus* (*KernelContext_GetInput)(const OrtKernelContext* ctx, size_t index, const OrtValue** out);
  OrtStatus* (*KernelContext_GetOutput)(OrtKernelContext* ctx, size_t index, const int64_t* dims, size_t count,
                                        OrtValue** out);
  void (*ReleaseStatus)(OrtStatus* status);
  void (*ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo* info);
  void (*ReleaseCustomOpDomain)(OrtCustomOpDomain* domain);
  OrtStatus* (*KernelContext_GetGPUComputeStream)(const OrtKernelContext* ctx, void** out);
  OrtStatus* (*KernelInfoGetConstantInput_tensor)(const OrtKernelInfo* info, size_t index, int* is_constant,
                                                const OrtValue** out);
  OrtStatus* (*KernelContext_ParallelFor)(const OrtKernelContext* ctx, void (*fn)(void*, size_t), size_t total,
                                          size_t num_batch, void* user_data);
  // API 24 (onnxruntime 1.24) and later; null on older runtimes.
  OrtStatus* (*GetTensorElementTypeAndShapeDataReference)(const OrtValue* value, int* type, const int64_t** dims,
                                                          size_t* rank);
};

// The bound entries; valid after bind_api() succeeded (the table lives as long as the runtime).
extern OrtApiFns g_ort;

// Bind g_ort from the runtime's table. Returns false only when the table is missing.
bool bind_api(const OrtApi* api);
// Bind the optional entries of API 24 (GetTensorElementTypeAndShapeDataReference) from its table; null: none.
// Checked against the version-1 entries on the first tensor described before it is used (ort_api.cc: describe).
void bind_api_24(const OrtApi* api);

// Exercise the status and type-and-shape entries with known values; returns "" when all agree, else what differed.
std::string self_check();

// A status carrying `msg` (nullptr would mean success to ORT, so never pass an empty failure).
OrtStatus* make_status(int code, const std::string& msg);

// An input's type, shape and data, read once per call (value null: an optional input that is absent).
struct TensorView {
  OrtValue* value = nullptr;
  int type = 0;
  std::vector<int64_t> dims;
  int64_t count = 0;
  void* data = nullptr;
};

// Describe input `index` of the `count` the kernel got; absent or past the end leaves `v` empty.
OrtStatus* view_input(OrtKernelContext* ctx, size_t index, size_t count, TensorView* v);

// Describe input `index` when it is a constant initializer (at kernel creation: its value lives as long as the
// kernel); otherwise `v` stays empty. Never fails: an input it cannot describe is simply not constant.
void view_constant(const OrtKernelInfo* info, size_t index, TensorView* v);

// What differs between edge's ops. make_custom_op() fills the rest of the version-17 struct the same way for all:
// no variadic arguments, and a version-1
// CreateKernel that calls `create` (runtimes of this API version call the V2 entries; v1 is kept for safety).
struct CustomOpSpec {
  const char* (*name)(const OrtCustomOp*);
  const char* (*provider)(const OrtCustomOp*);  // returns nullptr for the CPU
  int (*input_type)(const OrtCustomOp*, size_t);
  size_t (*input_count)(const OrtCustomOp*);
  size_t (*output_count)(const OrtCustomOp*);
  int (*input_characteristic)(const OrtCustomOp*, size_t);
  OrtStatus* (*create)(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void**);
  void (*destroy)(void*);
  OrtStatus* (*compute)(void*, OrtKernelContext*);
  void (*compute_v1)(void*, OrtKernelContext*);  // `compute` with its status dropped
  // Where each input must be (0: the provider's memory; kOrtMemTypeCPUInput: the host); nullptr: all 0.
  int (*input_memory)(const OrtCustomOp*, size_t) = nullptr;
  int (*output_type)(const OrtCustomOp*, size_t) = nullptr;  // nullptr: every output float32
  int (*output_characteristic)(const OrtCustomOp*, size_t) = nullptr;  // nullptr: every output required
};

constexpr int kOrtMemTypeCPUInput = -2;

OrtCustomOp make_custom_op(const CustomOpSpec& spec);

// fn(user, i) for i in [0, n): on the library's team when the runtime started one (team.h), otherwise split over
// onnxruntime's threads.
OrtStatus* parallel_for(OrtKernelContext* ctx, void (*fn)(void*, size_t), size_t n, void* user);

// The version-1 KernelCompute of a V2 compute function: the same work with its status released.
template <OrtStatus* (*Compute)(void*, OrtKernelContext*)>
void compute_v1(void* kernel, OrtKernelContext* ctx) {
  if (OrtStatus* st = Compute(kernel, ctx)) g_ort.ReleaseStatus(st);
}

}  // namespace edge
