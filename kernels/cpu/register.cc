// RegisterCustomOps, the entry point ORT calls: binds the OrtApi slots, self-checks them, and registers edge.QMatMul
// and edge.Attention (attention_op.cc) in domain "edge" for the CPU, and in the CUDA build both again for the
// CUDAExecutionProvider.
//
// Inputs of edge.QMatMul (attributes K, N, bits, group_size, optional accuracy_level 0 or 4, optional activation
// 0, 1 or 2: Y = act(gate) * up with N / 2 columns, act silu (1) or gelu_tanh (2), rows of W in tiles of 4 gate
// rows and their 4 up rows):
//   0 X        float32 or float16 (..., K); Y has X's type (two registrations, onnxruntime picks by type)
//   1 codes    uint8, the packed codes (any shape; only the byte count is checked)
//   2 scales   float32 or float16, (ceil(N/8), Kp/group, 8)
//   3 zeros    optional, uint8 or float32, same shape as scales: W = (code - zero) * scale (absent: 2^(bits-1))
//   4 bias     optional, float32 (N,)
//   5-7        optional CSR outliers added to W: values float16 (nnz,), columns int32 (nnz,), row_ptr int32 (N+1,)
//   8 mins     optional, float32 or float16, same shape as scales, instead of zeros: W = code * scale + min
//   9-11       optional SpQR two-level statistics (QMatMulArgs): scale_stats float16 (R, G, 2), zero_stats float16
//              (R, G, 2), stat_rows int32 (2 * ceil(N/8)); with scale_stats, scales are uint8 codes, and with
//              zero_stats, zeros are uint8 codes of float zero points
//   12 skip    optional, float32 like X; only with the attribute norm_epsilon (float): the residual stream
//   13 norm_weight  float32 (K,), required with norm_epsilon: Y = RMSNorm(X + skip) W^T, the norm a decoder layer
//              runs before the matmul (rms_norm.h)
//   14-17 pre_codes, pre_scales, pre_zeros, pre_mins: only with the attribute pre_K (and norm_epsilon): X is
//              (..., pre_K) and first becomes X W_pre^T (..., K), W_pre packed like inputs 1-3 and 8 with N = K and
//              this node's bits, group_size and accuracy_level; the norm then reads that (QMatMulKernel::pre)
// Outputs Y (..., N), and with skip, output 1: X + skip (..., K), X here the pre-projection's output if any.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "attention_op.h"
#include "ort_api.h"
#include "qmatmul.h"
#include "qmatmul_op.h"
#include "rms_norm.h"
#include "row_top.h"
#include "team.h"

namespace edge {

namespace {

int input_type(const OrtCustomOp*, size_t index) {
  switch (index) {
    case 0: case 4: case 12: case 13: return kOrtFloat;
    case 1: case 14: return kOrtUint8;
    case 2: case 3: case 8: case 15: case 16: case 17:
      return kOrtUndefined;  // scales float32, float16 or uint8 codes; zeros uint8 or float32
    case 5: case 9: case 10: return kOrtFloat16;
    default: return kOrtInt32;
  }
}
int input_type_f16(const OrtCustomOp* op, size_t index) { return index == 0 ? kOrtFloat16 : input_type(op, index); }
int output_type_f16(const OrtCustomOp*, size_t) { return kOrtFloat16; }
size_t input_count(const OrtCustomOp*) { return kQMatMulInputs + kPreInputs; }
size_t output_count(const OrtCustomOp*) { return 3; }
int input_characteristic(const OrtCustomOp*, size_t index) { return index < 3 ? kOrtRequired : kOrtOptional; }
int output_characteristic(const OrtCustomOp*, size_t index) { return index == 0 ? kOrtRequired : kOrtOptional; }
const char* op_name(const OrtCustomOp*) { return "QMatMul"; }
const char* cpu_provider(const OrtCustomOp*) { return nullptr; }

// An optional int attribute: fallback when the node does not have it.
int64_t optional_attr(const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t value = fallback;
  if (OrtStatus* missing = g_ort.KernelInfoGetAttribute_int64(info, name, &value)) {
    g_ort.ReleaseStatus(missing);
    value = fallback;
  }
  return value;
}

OrtStatus* read_attr(const OrtKernelInfo* info, const char* name, int64_t* out) {
  OrtStatus* st = g_ort.KernelInfoGetAttribute_int64(info, name, out);
  if (st == nullptr) return nullptr;
  g_ort.ReleaseStatus(st);
  return make_status(kOrtInvalidArgument, std::string("edge.QMatMul: missing int attribute '") + name + "'");
}

// A constant's bytes: it streams from memory on every call, so it is read from a copy in 2 MB pages where one can be
// had (huge_pages.h); otherwise, and for types this does not size, from onnxruntime's buffer as before.
void move_to_huge_pages(TensorView& v, std::vector<const void*>& copies) {
  const int64_t size = v.type == kOrtUint8     ? 1
                       : v.type == kOrtFloat16 ? 2
                       : v.type == kOrtFloat || v.type == kOrtInt32 ? 4
                                                                     : 0;
  if (v.data == nullptr || size == 0) return;
  if (const void* copy = huge_copy(v.data, static_cast<size_t>(v.count * size))) {
    v.data = const_cast<void*>(copy);
    copies.push_back(copy);
  }
}

OrtStatus* create_kernel(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
  auto* k = new QMatMulKernel();
  int64_t bits = 0;
  OrtStatus* st = read_attr(info, "K", &k->K);
  if (st == nullptr) st = read_attr(info, "N", &k->N);
  if (st == nullptr) st = read_attr(info, "bits", &bits);
  if (st == nullptr) st = read_attr(info, "group_size", &k->group);
  const int64_t accuracy = optional_attr(info, "accuracy_level", 0);  // as MatMulNBits': 4 = int8 activations
  k->digits = accuracy == 4 ? 1 : 3;
  const int64_t activation = optional_attr(info, "activation", 0);  // 1 or 2, a gated activation (QMatMulArgs::gated)
  k->gated = static_cast<int>(activation);
  const int64_t pre_k = optional_attr(info, "pre_K", 0);  // a pre-projection (QMatMulKernel::pre)
  const int64_t top = optional_attr(info, "top", 0);  // output 2 (QMatMulKernel::top)
  k->top = top == 1;
  if (st == nullptr) {  // optional: present, the norm mode (inputs skip and norm_weight)
    if (OrtStatus* missing = g_ort.KernelInfoGetAttribute_float(info, "norm_epsilon", &k->norm_epsilon)) {
      g_ort.ReleaseStatus(missing);
    } else {
      k->norm = true;
    }
  }
  k->bits = static_cast<int>(bits);
  if (st == nullptr) {
    std::string err;
    if (k->K <= 0 || k->N <= 0) err = "K and N must be positive";
    else if (bits != 2 && bits != 3 && bits != 4 && bits != 8)
      err = "bits must be 2, 3, 4 or 8, got " + std::to_string(bits);
    else if (k->group < 16 || k->group > 128 || k->group % 16 != 0)
      err = "group_size must be a multiple of 16 in 16..128, got " + std::to_string(k->group);
    else if (accuracy != 0 && accuracy != 4)
      err = "accuracy_level must be 0 (float activations) or 4 (int8 activations), got " + std::to_string(accuracy);
    else if (activation < 0 || activation > 2)
      err = "activation must be 0 (none), 1 (silu-gated) or 2 (gelu_tanh-gated), got " + std::to_string(activation);
    else if (k->norm && !(k->norm_epsilon >= 0.0f))
      err = "norm_epsilon must be >= 0, got " + std::to_string(k->norm_epsilon);
    else if (activation != 0 && k->N % 8 != 0)
      err = "a gated activation needs N to be a multiple of 8 (tiles of 4 gate and 4 up rows)";
    else if (pre_k < 0 || (pre_k > 0 && !k->norm))
      err = "pre_K must be positive and comes with norm_epsilon (the projection before the residual add), got " +
            std::to_string(pre_k);
    else if (top != 0 && (top != 1 || activation != 0))
      err = "top must be 0 or 1, and 1 (output 2: each row's argmax and maximum) only without an activation";
    else if (top == 1 && op->GetExecutionProviderType(op) != nullptr)
      err = "top = 1 is computed on the CPU only; on a GPU edge loads the graph without output 2";
    if (!err.empty()) st = make_status(kOrtInvalidArgument, "edge.QMatMul: " + err);
  }
  if (st != nullptr) {
    delete k;
    return st;
  }
  if (pre_k > 0) {
    k->pre = std::make_unique<QMatMulKernel>();
    QMatMulKernel& p = *k->pre;
    p.K = pre_k;
    p.N = k->K;
    p.group = k->group;
    p.bits = k->bits;
    p.digits = k->digits;
  }
  if (op->GetExecutionProviderType(op) == nullptr) {  // the CPU's: on CUDA a constant's copy may live elsewhere
    for (size_t i = 1; i < kQMatMulInputs; ++i) {
      view_constant(info, i, &k->constants[i]);
      move_to_huge_pages(k->constants[i], k->huge_copies);
    }
    for (size_t j = 0; k->pre && j < kPreInputs; ++j) {
      TensorView& v = k->pre->constants[kPreSlots[j]];
      view_constant(info, kQMatMulInputs + j, &v);
      move_to_huge_pages(v, k->pre->huge_copies);
    }
  }
  *kernel = k;
  return nullptr;
}

void destroy_kernel(void* kernel) { delete static_cast<QMatMulKernel*>(kernel); }

// Fewest rows whose prologue for_rows splits. Measured on a Zen 4 (session 35, 2 threads, whole default model,
// paired): split from 4 rows, 4- to 9-token steps ran 1-2% slower (the second job and the rows crossing to the
// other core's cache cost what the split saves), 12- and 16-token steps 1-3% faster, a 200-token prefill ~5%.
constexpr int64_t kSharedRows = 12;

// Work split for ParallelFor: contiguous ranges of tiles; a tile's result never depends on the split.
constexpr int64_t kMaxTileChunks = 8;
struct TileJob {
  const QMatMulArgs* args;
  TilesFn fn;
  int64_t chunks;
  int64_t bounds[kMaxTileChunks + 1];  // chunk i: pairs of tiles [bounds[i], bounds[i + 1])
  RowTop* tops = nullptr;  // output 2 asked for: each chunk's top of each row, (chunks, M)
};

// Chunk borders in pairs of tiles. On the team each thread's share runs from big chunks to small ones (weights k, k-1,
// .., 1 over a share of k chunks): the owner walks it from the front, a thread done with its own takes from the back,
// so the last pieces left to wait on are small. With equal chunks the calling thread spent 6.4% of a 1-token step
// and 4.7% of an 8-token one waiting for the other's last chunk (perf, session 36); paired, whole model, 1- to
// 16-token steps 0.98-0.995 of their time (16 chunks of equal size instead: within the noise, 32: S=1 2% slower).
void tile_bounds(TileJob& job, int64_t pairs, int members) {
  const int64_t n = job.chunks;
  int64_t weight[kMaxTileChunks], total = 0;
  for (int m = 0; m < members; ++m) {
    const int64_t first = n * m / members, last = n * (m + 1) / members;
    for (int64_t i = first; i < last; ++i) total += weight[i] = members > 1 ? last - i : 1;
  }
  int64_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    job.bounds[i] = pairs * sum / total;
    sum += weight[i];
  }
  job.bounds[n] = pairs;
}

// Two-level statistics: tiles in blocks of kTwoLevelBlock (even, for the AVX-512 pairs), each block's scales and
// zero points expanded to float32 in a per-thread buffer (a few KB: stays in L1/L2) and run as plain statistics.
constexpr int64_t kTwoLevelBlock = 16;

void run_two_level(const QMatMulArgs& a, TilesFn fn, int64_t t0, int64_t t1) {
  thread_local std::vector<float> scales, zeros;
  const size_t block = static_cast<size_t>(kTwoLevelBlock * a.G * 8);
  scales.resize(block);
  zeros.resize(a.zero_codes != nullptr ? block : 0);
  QMatMulArgs local = a;
  local.scales = scales.data();
  if (a.zero_codes != nullptr) local.zeros_f32 = zeros.data();
  for (int64_t t = t0; t < t1; t += kTwoLevelBlock) {
    const int64_t end = std::min(t + kTwoLevelBlock, t1), offset = t * a.G * 8;
    (uses_avx2() ? expand_two_level_avx2 : expand_two_level)(a, t, end, scales.data(), zeros.data());
    local.stats_tile0 = t;  // plain zero points, if any, are read from the same block of tiles
    if (a.zeros_u8 != nullptr) local.zeros_u8 = a.zeros_u8 + offset;
    if (a.zeros_f32 != nullptr && a.zero_codes == nullptr) local.zeros_f32 = a.zeros_f32 + offset;
    fn(local, t, end);
  }
}

void run_chunk(void* user, size_t index) {
  const auto* job = static_cast<const TileJob*>(user);
  // Chunk borders fall on even tiles, so the AVX-512 kernel (two tiles per vector) rarely gets an odd remainder.
  const int64_t i = static_cast<int64_t>(index);
  const int64_t t0 = 2 * job->bounds[i];
  const int64_t t1 = std::min<int64_t>(2 * job->bounds[i + 1], job->args->tiles);
  if (t0 >= t1) return;
  if (job->args->scale_codes != nullptr) run_two_level(*job->args, job->fn, t0, t1);
  else job->fn(*job->args, t0, t1);
  if (job->tops == nullptr) return;
  const QMatMulArgs& a = *job->args;  // output 2 needs ungated float32 Y (bind_tensors): rows of N floats
  const int64_t c0 = t0 * 8, c1 = std::min(t1 * 8, a.N);
  const auto top = uses_avx2() ? row_top_avx2 : row_top;
  for (int64_t m = 0; m < a.M; ++m) job->tops[i * a.M + m] = top(a.y + m * a.N + c0, c0, c1);
}

// Output 2: the chunks' tops merged in column order, as (index, maximum) pairs of floats (an index below 2^24 is
// exact in a float). A chunk with no tiles has no top.
void write_tops(const TileJob& job, float* out) {
  const int64_t M = job.args->M;
  for (int64_t m = 0; m < M; ++m) {
    RowTop top{0.0f, -1};
    for (int64_t i = 0; i < job.chunks; ++i) {
      const int64_t t0 = 2 * job.bounds[i], t1 = std::min<int64_t>(2 * job.bounds[i + 1], job.args->tiles);
      if (t0 < t1) merge_top(top, job.tops[i * M + m]);
    }
    out[2 * m] = static_cast<float>(top.index);
    out[2 * m + 1] = top.max;
  }
}

// fn(m0, m1) over rows [0, M) of a call's prologue (its norm, its activation digits): split by rows over the team
// when it runs and the call has kSharedRows or more, else on the calling thread, while the other threads wait
// (perf, 8-token steps, 2 threads: ~10% of the step's wall time).
template <class Fn>
void for_rows(int64_t M, const Fn& fn) {
  struct Job {
    const Fn* fn;
    int64_t M, chunks;
  };
  Job job{&fn, M, std::min<int64_t>(M, 16)};
  const auto run = [](void* user, size_t i) {
    const auto* j = static_cast<const Job*>(user);
    (*j->fn)(j->M * static_cast<int64_t>(i) / j->chunks, j->M * static_cast<int64_t>(i + 1) / j->chunks);
  };
  if (M < kSharedRows || !team_parallel_for(run, static_cast<size_t>(job.chunks), &job)) fn(0, M);
}

// Per-call activation buffers: zero-padded rows when the last group is partial, the per-group row sums, and what
// the chosen kernel reads (prescaled x, or digits for the integer kernels). Kept per calling thread and reused: no
// malloc per call.
void prepare_activations(QMatMulArgs& a, TilesFn fn) {
  thread_local std::vector<float> scratch;
  const bool pad = a.Kp != a.K, digits = reads_digits(fn);
  const bool prescale = fn != qmatmul_tiles_portable && !digits && a.bits != 3;
  const size_t rows = static_cast<size_t>(a.M), kp = static_cast<size_t>(a.Kp), g = static_cast<size_t>(a.G);
  // Digits take 2 * a.digits int32 per 8 k, i.e. a.digits / 4 floats per k.
  const size_t x_floats = digits ? rows * kp * a.digits / 4 + rows * g : (prescale ? rows * kp : 0);
  scratch.resize((pad ? rows * kp : 0) + rows * g + x_floats);
  float* next = scratch.data();
  if (pad) {
    for (int64_t m = 0; m < a.M; ++m) {
      std::memcpy(next + m * a.Kp, a.x + m * a.K, a.K * sizeof(float));
      std::memset(next + m * a.Kp + a.K, 0, (a.Kp - a.K) * sizeof(float));
    }
    a.x = next;
    a.ldx = a.Kp;
    next += rows * kp;
  }
  a.xsum = next;
  float* xsum = next;
  next += rows * g;
  a.xq = a.x;
  if (digits) {
    static_assert(sizeof(float) == sizeof(int32_t), "digits share the float scratch");
    auto* xd = reinterpret_cast<int32_t*>(next);
    float* xpow = next + rows * kp * a.digits / 4;
    const auto prepare = fn == qmatmul_tiles_avx512vnni ? prepare_digits_avx512
                         : a.digits == 1 && uses_avx2()  ? prepare_int8_avx2
                                                         : prepare_digits;
    for_rows(a.M, [&](int64_t m0, int64_t m1) { prepare(a, m0, m1, xd, xpow, xsum); });
    a.xd = xd;
    a.xpow = xpow;
    return;
  }
  row_group_sums(a, xsum);
  if (prescale) {
    prescale_x(a, next);
    a.xq = next;
  }
}

// Two-level statistics: their float16 (base, step) tables widened once per call (a few KB per layer).
void prepare_two_level(QMatMulArgs& a) {
  if (a.scale_codes == nullptr) return;
  thread_local std::vector<float> tables;
  const int64_t n = a.stat_row_count * a.G * 2;
  tables.resize(static_cast<size_t>(a.zero_codes != nullptr ? 2 * n : n));
  const auto widen = uses_avx2() ? widen_halves_avx2 : widen_halves;
  widen(a.scale_stats, n, tables.data());
  a.scale_stats_f32 = tables.data();
  if (a.zero_codes != nullptr) {
    widen(a.zero_stats, n, tables.data() + n);
    a.zero_stats_f32 = tables.data() + n;
  }
}

// Prepare the activations and run every tile, split over ORT's threads when the call is big enough. top: output 2,
// or null.
OrtStatus* run_tiles(QMatMulArgs& a, OrtKernelContext* ctx, float* top = nullptr) {
  TileJob job{&a, select_tiles_fn(a.bits, a.digits), 1, {}};
  prepare_activations(a, job.fn);
  prepare_two_level(a);

  const int64_t work = a.M * a.Kp * a.tiles * 8;
  if (work >= (int64_t{1} << 17) && a.tiles >= 4) job.chunks = std::min<int64_t>(a.tiles / 2, kMaxTileChunks);
  tile_bounds(job, (a.tiles + 1) / 2, team_members());
  thread_local std::vector<RowTop> tops;
  if (top != nullptr) {
    tops.resize(static_cast<size_t>(job.chunks * a.M));
    job.tops = tops.data();
  }
  if (job.chunks > 1) {
    if (OrtStatus* st = parallel_for(ctx, run_chunk, static_cast<size_t>(job.chunks), &job)) return st;
  } else {
    run_chunk(&job, 0);
  }
  if (top != nullptr) write_tops(job, top);
  return nullptr;
}

OrtStatus* compute_cpu(void* kernel, OrtKernelContext* ctx) {
  const auto* k = static_cast<const QMatMulKernel*>(kernel);
  BoundTensors t;
  if (OrtStatus* st = bind_tensors(*k, ctx, &t)) return st;
  QMatMulArgs& a = t.args;
  if (a.M == 0) return nullptr;
  if (!k->host_checked.load(std::memory_order_relaxed)) {
    if (std::string err = validate_outliers_host(a); !err.empty())
      return make_status(kOrtInvalidArgument, "edge.QMatMul: " + err);
    if (std::string err = validate_stat_rows_host(a); !err.empty())
      return make_status(kOrtInvalidArgument, "edge.QMatMul: " + err);
    const bool outliers = a.outlier_rowptr == nullptr ||
                          (k->constants[5].value && k->constants[6].value && k->constants[7].value);
    const bool stat_rows = a.stat_rows == nullptr || (k->constants[9].value && k->constants[11].value);
    if (outliers && stat_rows) k->host_checked.store(true, std::memory_order_relaxed);  // constants: checked for good
  }
  thread_local std::vector<float> projected;  // the pre-projection's output rows, when there is no output 1
  if (t.has_pre) {
    // Into output 1 where the node has one: the norm then adds the skip there in place (each element read before
    // it is written), and a step's memory grows by no buffer of the projection's own.
    if (t.sum == nullptr) projected.resize(static_cast<size_t>(a.M * a.K));
    t.pre.y = t.sum != nullptr ? t.sum : projected.data();
    if (OrtStatus* st = run_tiles(t.pre, ctx)) return st;
    a.x = t.pre.y;
  }
  thread_local std::vector<float> normed;  // the norm mode's input rows
  if (k->norm) {
    normed.resize(static_cast<size_t>(a.M * a.K));
    float* out = normed.data();  // this thread's buffer: the team's threads write into it too
    const auto norm = uses_avx2() ? rms_norm_rows_avx2 : rms_norm_rows;
    for_rows(a.M, [&](int64_t m0, int64_t m1) {
      const int64_t at = m0 * a.K;
      norm(a.x + at, t.skip != nullptr ? t.skip + at : nullptr, t.norm_weight, k->norm_epsilon, m1 - m0, a.K,
           t.sum != nullptr ? t.sum + at : nullptr, out + at);
    });
    a.x = out;
  }
  thread_local std::vector<float> x32, y32;  // float16 X and Y: widened on entry, rounded once on exit
  if (t.x16 != nullptr) {
    x32.resize(static_cast<size_t>(a.M * a.K));
    y32.resize(static_cast<size_t>(a.M * (a.gated ? a.N / 2 : a.N)));
    for (size_t i = 0; i < x32.size(); ++i) x32[i] = half_to_float(t.x16[i]);
    a.x = x32.data();
    a.y = y32.data();
  }
  if (OrtStatus* st = run_tiles(a, ctx, t.top)) return st;
  if (t.y16 != nullptr)
    for (size_t i = 0; i < y32.size(); ++i) t.y16[i] = float_to_half(y32[i]);
  return nullptr;
}


}  // namespace

OrtCustomOp make_qmatmul_op(const char* (*provider)(const OrtCustomOp*),
                            OrtStatus* (*compute)(void*, OrtKernelContext*),
                            void (*compute_v1_fn)(void*, OrtKernelContext*), bool half) {
  return make_custom_op({op_name, provider, half ? input_type_f16 : input_type, input_count, output_count,
                         input_characteristic, create_kernel, destroy_kernel, compute, compute_v1_fn, nullptr,
                         half ? output_type_f16 : nullptr, output_characteristic});
}

namespace {

// Static storage: ORT keeps pointers to the ops for the life of every session.
OrtCustomOp g_cpu_op = make_qmatmul_op(cpu_provider, compute_cpu, compute_v1<compute_cpu>, false);
OrtCustomOp g_cpu_op_f16 = make_qmatmul_op(cpu_provider, compute_cpu, compute_v1<compute_cpu>, true);

OrtStatus* add_ops(OrtSessionOptions* options) {
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* st = g_ort.CreateCustomOpDomain("edge", &domain)) return st;
  OrtStatus* st = g_ort.CustomOpDomain_Add(domain, &g_cpu_op);
  if (st == nullptr) st = g_ort.CustomOpDomain_Add(domain, &g_cpu_op_f16);
  if (st == nullptr) st = g_ort.CustomOpDomain_Add(domain, cpu_attention_op(false));
  if (st == nullptr) st = g_ort.CustomOpDomain_Add(domain, cpu_attention_op(true));
#ifdef EDGE_WITH_CUDA
  if (st == nullptr) st = g_ort.CustomOpDomain_Add(domain, cuda_op(false));
  if (st == nullptr) st = g_ort.CustomOpDomain_Add(domain, cuda_op(true));
  if (st == nullptr) st = g_ort.CustomOpDomain_Add(domain, cuda_attention_op());
#endif
  if (st == nullptr) st = g_ort.AddCustomOpDomain(options, domain);
  // The domain must outlive the sessions using it; ORT does not take ownership, so it is intentionally not released.
  return st;
}

}  // namespace

}  // namespace edge

extern "C" __attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                                  const OrtApiBase* base) {
  using namespace edge;
  if (base == nullptr || base->GetApi == nullptr) return nullptr;  // cannot even report: nothing to register with
  if (!bind_api(base->GetApi(kEdgeOrtApiVersion))) {
    // Too old a runtime for API 17: version 1 of the table still has CreateStatus at slot 0 to say so.
    const OrtApi* v1 = base->GetApi(1);
    if (v1 == nullptr) return nullptr;
    auto create_status = reinterpret_cast<OrtStatus* (*)(int, const char*)>(reinterpret_cast<void* const*>(v1)[0]);
    return create_status(kOrtFail, "edge kernels need onnxruntime>=1.28 (C API version 17); upgrade onnxruntime.");
  }
  bind_api_24(base->GetApi(24));
  const std::string err = self_check();
  if (!err.empty())
    return make_status(kOrtFail, "edge kernels: ONNX Runtime ABI self-check failed (" + err +
                                     "); this onnxruntime build does not match the library's declarations. "
                                     "Reinstall edge against onnxruntime>=1.28, or run without edge kernels.");
  return add_ops(options);
}

// Which CPU kernel this process uses for `bits` and accuracy_level (0 or 4): "avx512vnni", "avx512", "avxvnni",
// "avx2-int8", "avx2" or "portable"; for diagnostics and benchmark reports (edge.kernels.library.kernel_isa).
extern "C" __attribute__((visibility("default"))) const char* EdgeKernelsIsa(int bits, int accuracy_level) {
  const edge::TilesFn fn = edge::select_tiles_fn(bits, accuracy_level == 4 ? 1 : 3);
  if (fn == edge::qmatmul_tiles_avx512vnni) return "avx512vnni";
  if (fn == edge::qmatmul_tiles_avxvnni) return "avxvnni";
  if (fn == edge::qmatmul_tiles_avx512) return "avx512";
  if (fn == edge::qmatmul_tiles_avx2_int8) return "avx2-int8";
  if (fn == edge::qmatmul_tiles_avx2) return "avx2";
  return "portable";
}

// What the weight copies in 2 MB pages hold in this process (huge_pages.h): out = copies, bytes, references,
// blocks. For tests and diagnostics (edge.kernels.library.huge_copy_stats).
extern "C" __attribute__((visibility("default"))) void EdgeHugeCopyStats(int64_t* out) {
  const edge::HugeCopyStats s = edge::huge_copy_stats();
  out[0] = s.copies;
  out[1] = s.bytes;
  out[2] = s.references;
  out[3] = s.blocks;
}
