// xgemm's native XLA FFI handler: launch a prebuilt cubin kernel on XLA's CUDA stream.
//
// Contract (the Python side is xgemm/jax_ffi.py, which encodes the attributes):
//   target   "xgemm_cubin_launch_v1", platform CUDA, stages initialize + execute,
//            CUDA-graph compatible (XLA may capture it in a command buffer).
//   buffers  any number of XLA operands, then results (the kernel's output, then optional
//            scratch results). Each is described as a DLPack tensor (data, device, dtype, logical
//            shape, strides from the layout the lowering asked for) and checked against "buffers".
//   attrs    cubin      the cubin bytes (string attribute; loaded once per CUDA context)
//            kernel     the kernel symbol in the cubin
//            module_key 64-bit fingerprint of (cubin, kernel), computed in Python: the cache key
//            grid, block, cluster   3 x i64 each; cluster (1,1,1) launches without a cluster;
//                       block may carry a 4th value, launch flags: 1 = programmatic dependent
//                       launch (the kernel waits for its predecessor with griddepcontrol.wait)
//            smem       dynamic shared memory bytes (> 48 KiB sets the function's opt-in limit)
//            params     3 x i64 per kernel parameter: (kind, a, b), kinds below
//            buffers    3 x i64 per buffer: (XLA_FFI_DataType, rank, required pointer alignment)
//            layouts    per buffer, `rank` i64: minor-to-major dimension order (XLA layout)
// A second target, "xgemm_tvm_ffi_call_v1" (CUDA, execute stage; "..._graph_v1" is the same
// handler declared CUDA-graph compatible, for functions already warm in the process), calls a TVM-FFI function (a
// CuTe-DSL kernel compiled with --enable-tvm-ffi: the very function xgemm's eager path calls) with
// the XLA buffers as DLTensor* arguments and XLA's stream:
//   attrs    function   the function object's handle (process-local; checked against `token`)
//            token      the process token the Python side registered (a module lowered in another
//                       process fails with a clear error instead of calling a stale pointer)
//            args       3 x i64 per argument: (kind, a, b): tensor (a = buffer, b = offset of an
//                       explicit view in `views` or -1), int, float64 bits, none, stream
//            views      [ndim, shape..., strides...] records for tensors passed as views
//            buffers, layouts   as above
// No CUDA toolkit is needed to build: cuda_min.h declares the driver API, and libcuda.so.1 is
// opened with dlopen on first use (XgemmFfiSetDriverPath substitutes another library for tests).
// The module is loaded in the initialize stage (outside any CUDA-graph capture); execute only
// looks the function up, packs the parameters and calls cuLaunchKernelEx.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "cuda_min.h"
#include "foreign_abi.h"
#include "peer_exchange.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using xgemm_foreign::DLDataType;
using xgemm_foreign::DLTensor;
using xgemm_foreign::kDLBfloat, xgemm_foreign::kDLBool, xgemm_foreign::kDLCPU, xgemm_foreign::kDLCUDA,
    xgemm_foreign::kDLFloat, xgemm_foreign::kDLInt, xgemm_foreign::kDLUInt;
using xgemm_foreign::TVMFFIAny;
using xgemm_foreign::TVMFFIErrorCellHead;
using xgemm_foreign::TVMFFIFunctionCell;
using xgemm_foreign::TvmObjectCell;
using xgemm_foreign::kTVMFFIBool, xgemm_foreign::kTVMFFIDLTensorPtr, xgemm_foreign::kTVMFFIFloat,
    xgemm_foreign::kTVMFFIInt, xgemm_foreign::kTVMFFINone, xgemm_foreign::kTVMFFIOpaquePtr,
    xgemm_foreign::kTVMFFIStaticObjectBegin;

constexpr int64_t kAbiVersion = 1;
constexpr int kMaxParams = 64;
constexpr int kMaxBuffers = 16;
constexpr int kMaxRank = 8;

// Parameter kinds of the "params" attribute.
enum ParamKind : int64_t {
  kPtr = 0,      // a = buffer index (operands first, then results): its device address
  kI32 = 1,      // a = value
  kI64 = 2,      // a = value
  kF32 = 3,      // a = IEEE-754 bits of the float
  kF64 = 4,      // a = IEEE-754 bits of the double
  kNull = 5,     // a null pointer (e.g. Triton's profile scratch when its size is 0)
  kDimI32 = 6,   // a = buffer, b = dim: that dim of the buffer's DLPack shape, as int32
  kDimI64 = 7,   // same, as int64
  kStrideI64 = 8,  // a = buffer, b = dim: the DLPack stride (elements) of that dim, as int64
};

// ---------------------------------------------------------------------------------------------
// DLPack description of XLA buffers

bool ToDLDataType(ffi::DataType t, DLDataType* out) {
  switch (t) {
    case ffi::DataType::F16: *out = {kDLFloat, 16, 1}; return true;
    case ffi::DataType::F32: *out = {kDLFloat, 32, 1}; return true;
    case ffi::DataType::F64: *out = {kDLFloat, 64, 1}; return true;
    case ffi::DataType::BF16: *out = {kDLBfloat, 16, 1}; return true;
    case ffi::DataType::F8E4M3FN: *out = {xgemm_foreign::kDLFloat8_e4m3fn, 8, 1}; return true;
    case ffi::DataType::F8E5M2: *out = {xgemm_foreign::kDLFloat8_e5m2, 8, 1}; return true;
    case ffi::DataType::S8: *out = {kDLInt, 8, 1}; return true;
    case ffi::DataType::S32: *out = {kDLInt, 32, 1}; return true;
    case ffi::DataType::S64: *out = {kDLInt, 64, 1}; return true;
    case ffi::DataType::U8: *out = {kDLUInt, 8, 1}; return true;
    case ffi::DataType::U32: *out = {kDLUInt, 32, 1}; return true;
    case ffi::DataType::PRED: *out = {kDLBool, 8, 1}; return true;
    default: return false;
  }
}

struct Described {
  DLTensor tensors[kMaxBuffers];
  int64_t shapes[kMaxBuffers][kMaxRank];
  int64_t strides[kMaxBuffers][kMaxRank];
  int count = 0;
};

// ---------------------------------------------------------------------------------------------
// The CUDA driver, opened at run time (foreign_abi.h)

struct Driver : xgemm_foreign::CudaDriver {
  bool ok = false;                     // every launching entry point was found
  std::string error;
};

std::mutex g_driver_mu;
std::string g_driver_path = "libcuda.so.1";
std::atomic<const Driver*> g_driver{nullptr};

const Driver& GetDriver() {
  const Driver* d = g_driver.load(std::memory_order_acquire);
  if (d != nullptr) return *d;
  std::lock_guard<std::mutex> lock(g_driver_mu);
  d = g_driver.load(std::memory_order_relaxed);
  if (d != nullptr) return *d;
  auto* drv = new Driver();  // lives for the process, like the modules it loads
  if (void* lib = xgemm_foreign::OpenCudaDriver(g_driver_path, &drv->error))
    drv->ok = xgemm_foreign::LoadCudaDriver(lib, drv, &drv->error);
  g_driver.store(drv, std::memory_order_release);
  return *drv;
}

ffi::Error CuError(const Driver& drv, CUresult rc, const char* what) {
  const char* text = nullptr;
  if (drv.get_error_string == nullptr || drv.get_error_string(rc, &text) != CUDA_SUCCESS_) text = nullptr;
  return ffi::Error::Internal(std::string("xgemm_cubin_launch: ") + what + " failed: " +
                              (text ? text : "unknown CUDA error") + " (" + std::to_string(rc) + ")");
}

// ---------------------------------------------------------------------------------------------
// Loaded functions, one per (CUDA context, module key)

struct FnKey {
  CUcontext ctx;
  int64_t key;
  bool operator==(const FnKey& o) const { return ctx == o.ctx && key == o.key; }
};
struct FnKeyHash {
  size_t operator()(const FnKey& k) const {
    return std::hash<const void*>()(k.ctx) ^ (std::hash<int64_t>()(k.key) * 0x9E3779B97F4A7C15ull);
  }
};
struct FnEntry {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  int64_t smem_limit = 48 * 1024;     // dynamic shared memory the function is allowed so far
  bool non_portable_cluster = false;
};

std::mutex g_fn_mu;
std::unordered_map<FnKey, FnEntry, FnKeyHash>* g_fns = new std::unordered_map<FnKey, FnEntry, FnKeyHash>();
std::atomic<int64_t> g_modules_loaded{0};
// Kernel launches through the execute handler, and those made while XLA was capturing the
// stream into a CUDA graph (a command buffer): tests tell graph replay from handler calls.
std::atomic<int64_t> g_launches{0};
std::atomic<int64_t> g_captured_launches{0};

struct Attrs {
  std::string_view cubin;
  std::string_view kernel;
  int64_t module_key;
  ffi::Span<const int64_t> grid, block, cluster;
  int64_t smem;
  ffi::Span<const int64_t> params, buffers, layouts;
};

// Finds (or loads, when `may_load`) the kernel's function in the stream's context and raises
// its shared-memory / cluster limits as this launch needs.
ffi::Error GetFunction(const Driver& drv, CUstream stream, const Attrs& at, bool may_load,
                       CUfunction* out) {
  CUcontext ctx = nullptr;
  if (CUresult rc = drv.stream_get_ctx(stream, &ctx); rc != CUDA_SUCCESS_)
    return CuError(drv, rc, "cuStreamGetCtx");
  const int64_t cluster_size = at.cluster[0] * at.cluster[1] * at.cluster[2];
  std::lock_guard<std::mutex> lock(g_fn_mu);
  FnEntry& e = (*g_fns)[FnKey{ctx, at.module_key}];
  if (e.function == nullptr) {
    if (!may_load) {
      int status = 0;
      drv.stream_is_capturing(stream, &status);
      if (status != CU_STREAM_CAPTURE_STATUS_NONE_)
        return ffi::Error::Internal(
            "xgemm_cubin_launch: kernel " + std::string(at.kernel) +
            " was not loaded before CUDA-graph capture (the FFI initialize stage did not run)");
    }
    if (CUresult rc = drv.ctx_push(ctx); rc != CUDA_SUCCESS_) return CuError(drv, rc, "cuCtxPushCurrent");
    std::string cubin(at.cubin);  // a private, NUL-terminated copy for the loader
    std::string name(at.kernel);
    CUresult rc = drv.module_load_data(&e.module, cubin.data());
    if (rc == CUDA_SUCCESS_) rc = drv.module_get_function(&e.function, e.module, name.c_str());
    CUcontext popped = nullptr;
    drv.ctx_pop(&popped);
    if (rc != CUDA_SUCCESS_) {
      e.function = nullptr;
      return CuError(drv, rc, ("loading kernel " + name).c_str());
    }
    g_modules_loaded.fetch_add(1);
  }
  if (at.smem > e.smem_limit) {
    if (CUresult rc = drv.func_set_attribute(e.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES_,
                                             static_cast<int>(at.smem));
        rc != CUDA_SUCCESS_)
      return CuError(drv, rc, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    e.smem_limit = at.smem;
  }
  if (cluster_size > 8 && !e.non_portable_cluster) {
    if (CUresult rc = drv.func_set_attribute(e.function, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED_, 1);
        rc != CUDA_SUCCESS_)
      return CuError(drv, rc, "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
    e.non_portable_cluster = true;
  }
  *out = e.function;
  return ffi::Error::Success();
}

ffi::Error CheckShapes(const Attrs& at) {
  if (at.grid.size() != 3 || (at.block.size() != 3 && at.block.size() != 4) || at.cluster.size() != 3)
    return ffi::Error::InvalidArgument("xgemm_cubin_launch: grid and cluster need 3 values each, block 3 (+ flags)");
  if (at.params.size() % 3 != 0 || at.buffers.size() % 3 != 0)
    return ffi::Error::InvalidArgument("xgemm_cubin_launch: params and buffers come in triples");
  if (at.params.size() / 3 > kMaxParams)
    return ffi::Error::InvalidArgument("xgemm_cubin_launch: more than 64 kernel parameters");
  return ffi::Error::Success();
}

// Buffer i of a call, counting the operands first, then the results.
ffi::ErrorOr<ffi::AnyBuffer> BufferAt(ffi::RemainingArgs& args, ffi::RemainingRets& rets, int64_t i) {
  const int64_t na = static_cast<int64_t>(args.size());
  if (i < 0 || i >= na + static_cast<int64_t>(rets.size()))
    return ffi::Unexpected<ffi::Error>(ffi::Error::InvalidArgument("xgemm FFI: buffer index out of range"));
  if (i < na) return args.get<ffi::AnyBuffer>(i);
  auto r = rets.get<ffi::AnyBuffer>(i - na);
  if (!r.has_value()) return ffi::Unexpected<ffi::Error>(r.error());
  return **r;
}

// Describes every operand and result as a DLPack tensor and checks it against "buffers".
ffi::Error Describe(ffi::RemainingArgs& args, ffi::RemainingRets& rets, const Attrs& at, int device_type,
                    Described* d) {
  const int64_t n = static_cast<int64_t>(args.size() + rets.size());
  if (n > kMaxBuffers) return ffi::Error::InvalidArgument("xgemm_cubin_launch: more than 16 buffers");
  if (n * 3 != static_cast<int64_t>(at.buffers.size()))
    return ffi::Error::InvalidArgument("xgemm_cubin_launch: got " + std::to_string(n) +
                                       " buffers but the attribute describes " +
                                       std::to_string(at.buffers.size() / 3));
  size_t layout_pos = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto buffer = BufferAt(args, rets, i);
    if (!buffer.has_value()) return buffer.error();
    void* data = buffer->untyped_data();
    const ffi::DataType dtype = buffer->element_type();
    const ffi::Span<const int64_t> dims = buffer->dimensions();
    const int64_t want_dtype = at.buffers[3 * i], want_rank = at.buffers[3 * i + 1], align = at.buffers[3 * i + 2];
    const int64_t rank = static_cast<int64_t>(dims.size());
    if (static_cast<int64_t>(dtype) != want_dtype || rank != want_rank || rank > kMaxRank)
      return ffi::Error::InvalidArgument("xgemm_cubin_launch: buffer " + std::to_string(i) + " has dtype " +
                                         std::to_string(static_cast<int>(dtype)) + " rank " + std::to_string(rank) +
                                         "; the kernel was built for dtype " + std::to_string(want_dtype) +
                                         " rank " + std::to_string(want_rank));
    if (align > 1 && reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(align) != 0)
      return ffi::Error::InvalidArgument("xgemm_cubin_launch: buffer " + std::to_string(i) +
                                         " is not aligned to the " + std::to_string(align) +
                                         " bytes the kernel assumes");
    if (layout_pos + rank > at.layouts.size())
      return ffi::Error::InvalidArgument("xgemm_cubin_launch: layouts attribute too short");
    DLTensor& t = d->tensors[i];
    t.data = data;
    t.device = {device_type, 0};
    t.ndim = static_cast<int32_t>(rank);
    if (!ToDLDataType(dtype, &t.dtype)) t.dtype = {kDLUInt, 8, 1};
    t.shape = d->shapes[i];
    t.strides = d->strides[i];
    t.byte_offset = 0;
    int64_t step = 1;
    for (int64_t j = 0; j < rank; ++j) {  // minor-to-major: compact strides in that order
      const int64_t dim = at.layouts[layout_pos + j];
      if (dim < 0 || dim >= rank) return ffi::Error::InvalidArgument("xgemm_cubin_launch: bad layout");
      d->strides[i][dim] = step;
      step *= dims[dim] > 0 ? dims[dim] : 1;
    }
    for (int64_t j = 0; j < rank; ++j) d->shapes[i][j] = dims[j];
    layout_pos += rank;
  }
  d->count = static_cast<int>(n);
  return ffi::Error::Success();
}

ffi::Error PackParams(const Attrs& at, const Described& d, uint64_t* slots, void** kernel_params, int* count) {
  const int np = static_cast<int>(at.params.size() / 3);
  for (int p = 0; p < np; ++p) {
    const int64_t kind = at.params[3 * p], a = at.params[3 * p + 1], b = at.params[3 * p + 2];
    uint64_t& s = slots[p];
    s = 0;
    auto buffer = [&](int64_t i) -> const DLTensor* { return (i >= 0 && i < d.count) ? &d.tensors[i] : nullptr; };
    switch (kind) {
      case kPtr: {
        const DLTensor* t = buffer(a);
        if (!t) return ffi::Error::InvalidArgument("xgemm_cubin_launch: parameter names a missing buffer");
        const CUdeviceptr v = reinterpret_cast<CUdeviceptr>(t->data);
        std::memcpy(&s, &v, sizeof v);
        break;
      }
      case kI32: { const int32_t v = static_cast<int32_t>(a); std::memcpy(&s, &v, sizeof v); break; }
      case kI64: { std::memcpy(&s, &a, sizeof a); break; }
      case kF32: { const uint32_t v = static_cast<uint32_t>(a); std::memcpy(&s, &v, sizeof v); break; }
      case kF64: { std::memcpy(&s, &a, sizeof a); break; }
      case kNull: break;
      case kDimI32: case kDimI64: case kStrideI64: {
        const DLTensor* t = buffer(a);
        if (!t || b < 0 || b >= t->ndim)
          return ffi::Error::InvalidArgument("xgemm_cubin_launch: parameter names a missing buffer dim");
        const int64_t v = kind == kStrideI64 ? t->strides[b] : t->shape[b];
        if (kind == kDimI32) { const int32_t v32 = static_cast<int32_t>(v); std::memcpy(&s, &v32, sizeof v32); }
        else std::memcpy(&s, &v, sizeof v);
        break;
      }
      default:
        return ffi::Error::InvalidArgument("xgemm_cubin_launch: unknown parameter kind " + std::to_string(kind));
    }
    kernel_params[p] = &s;
  }
  *count = np;
  return ffi::Error::Success();
}

// One more handler launch (cubin or TVM-FFI call); captured when XLA is recording the stream.
void CountLaunch(CUstream stream) {
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (stream == nullptr) return;               // the host test variant
  const Driver& drv = GetDriver();
  int capturing = 0;
  if (drv.ok && drv.stream_is_capturing(stream, &capturing) == CUDA_SUCCESS_ &&
      capturing != CU_STREAM_CAPTURE_STATUS_NONE_)
    g_captured_launches.fetch_add(1, std::memory_order_relaxed);
}

ffi::Error Launch(CUstream stream, ffi::RemainingArgs& args, ffi::RemainingRets& rets, const Attrs& at,
                  int device_type) {
  if (ffi::Error e = CheckShapes(at); e.failure()) return e;
  const Driver& drv = GetDriver();
  if (!drv.ok) return ffi::Error::Internal("xgemm_cubin_launch: " + drv.error);
  CUfunction fn = nullptr;
  if (ffi::Error e = GetFunction(drv, stream, at, /*may_load=*/false, &fn); e.failure()) return e;
  Described d;
  if (ffi::Error e = Describe(args, rets, at, device_type, &d); e.failure()) return e;
  uint64_t slots[kMaxParams];
  void* kernel_params[kMaxParams + 1];
  int count = 0;
  if (ffi::Error e = PackParams(at, d, slots, kernel_params, &count); e.failure()) return e;
  kernel_params[count] = nullptr;

  XgemmCUlaunchAttribute attrs[3];
  std::memset(attrs, 0, sizeof attrs);
  unsigned int num_attrs = 0;
  if (at.cluster[0] * at.cluster[1] * at.cluster[2] > 1) {
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION_;
    attrs[0].value.clusterDim.x = static_cast<unsigned int>(at.cluster[0]);
    attrs[0].value.clusterDim.y = static_cast<unsigned int>(at.cluster[1]);
    attrs[0].value.clusterDim.z = static_cast<unsigned int>(at.cluster[2]);
    attrs[1].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE_;
    attrs[1].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD_;
    num_attrs = 2;
  }
  if (at.block.size() > 3 && (at.block[3] & 1)) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION_;
    attrs[num_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++num_attrs;
  }
  XgemmCUlaunchConfig config;
  config.gridDimX = static_cast<unsigned int>(at.grid[0]);
  config.gridDimY = static_cast<unsigned int>(at.grid[1]);
  config.gridDimZ = static_cast<unsigned int>(at.grid[2]);
  config.blockDimX = static_cast<unsigned int>(at.block[0]);
  config.blockDimY = static_cast<unsigned int>(at.block[1]);
  config.blockDimZ = static_cast<unsigned int>(at.block[2]);
  config.sharedMemBytes = static_cast<unsigned int>(at.smem);
  config.hStream = stream;
  config.attrs = num_attrs ? attrs : nullptr;
  config.numAttrs = num_attrs;
  if (config.gridDimX * config.gridDimY * config.gridDimZ == 0) return ffi::Error::Success();  // empty problem
  if (CUresult rc = drv.launch_kernel_ex(&config, fn, kernel_params, nullptr); rc != CUDA_SUCCESS_)
    return CuError(drv, rc, "cuLaunchKernelEx");
  CountLaunch(stream);
  return ffi::Error::Success();
}

ffi::Error Initialize(CUstream stream, const Attrs& at) {
  if (ffi::Error e = CheckShapes(at); e.failure()) return e;
  const Driver& drv = GetDriver();
  if (!drv.ok) return ffi::Error::Internal("xgemm_cubin_launch: " + drv.error);
  CUfunction fn = nullptr;
  return GetFunction(drv, stream, at, /*may_load=*/true, &fn);
}

#define XGEMM_ATTR_PARAMS                                                                     \
  std::string_view cubin, std::string_view kernel, int64_t module_key,                        \
      ffi::Span<const int64_t> grid, ffi::Span<const int64_t> block,                          \
      ffi::Span<const int64_t> cluster, int64_t smem, ffi::Span<const int64_t> params,       \
      ffi::Span<const int64_t> buffers, ffi::Span<const int64_t> layouts
#define XGEMM_ATTRS Attrs{cubin, kernel, module_key, grid, block, cluster, smem, params, buffers, layouts}

ffi::Error ExecuteCuda(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets, XGEMM_ATTR_PARAMS) {
  return Launch(stream, args, rets, XGEMM_ATTRS, kDLCUDA);
}

ffi::Error InitializeCuda(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets, XGEMM_ATTR_PARAMS) {
  (void)args; (void)rets;
  return Initialize(stream, XGEMM_ATTRS);
}

// Host variant for tests on machines without a GPU: the same decoding, description, module cache
// and parameter packing, driven through a substitute driver library (ffi/testing/fake_libcuda.cc)
// whose "kernels" run on the host buffers XLA:CPU passes.
ffi::Error ExecuteHost(ffi::RemainingArgs args, ffi::RemainingRets rets, XGEMM_ATTR_PARAMS) {
  const Attrs at = XGEMM_ATTRS;
  if (ffi::Error e = Initialize(nullptr, at); e.failure()) return e;
  return Launch(nullptr, args, rets, at, kDLCPU);
}

template <typename B>
auto BindAttrs(B&& binding) {
  return std::move(binding).template Attr<std::string_view>("cubin")
      .template Attr<std::string_view>("kernel")
      .template Attr<int64_t>("module_key")
      .template Attr<ffi::Span<const int64_t>>("grid")
      .template Attr<ffi::Span<const int64_t>>("block")
      .template Attr<ffi::Span<const int64_t>>("cluster")
      .template Attr<int64_t>("smem")
      .template Attr<ffi::Span<const int64_t>>("params")
      .template Attr<ffi::Span<const int64_t>>("buffers")
      .template Attr<ffi::Span<const int64_t>>("layouts");
}

// ---------------------------------------------------------------------------------------------
// TVM-FFI calls (the ABI: foreign_abi.h)

// Argument kinds of the "args" attribute.
enum ArgKind : int64_t { kArgTensor = 0, kArgInt = 1, kArgF64 = 2, kArgNone = 3, kArgStream = 4, kArgBool = 5 };

std::atomic<int64_t> g_process_token{0};

std::string TvmFfiErrorMessage(int rc) {
  std::string msg = "TVM-FFI call failed (" + std::to_string(rc) + ")";
  void* lib = dlopen("libtvm_ffi.so", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return msg;
  using MoveFn = void (*)(void**);
  using DecRefFn = int (*)(void*);
  auto move = reinterpret_cast<MoveFn>(dlsym(lib, "TVMFFIErrorMoveFromRaised"));
  auto decref = reinterpret_cast<DecRefFn>(dlsym(lib, "TVMFFIObjectDecRef"));
  if (move != nullptr) {
    void* err = nullptr;
    move(&err);
    if (err != nullptr) {
      const TVMFFIErrorCellHead* cell = TvmObjectCell<TVMFFIErrorCellHead>(err);
      msg = std::string(cell->kind.data, cell->kind.size) + ": " + std::string(cell->message.data, cell->message.size);
      if (decref != nullptr) decref(err);
    }
  }
  dlclose(lib);
  return msg;
}

struct TvmAttrs {
  int64_t function, token;
  ffi::Span<const int64_t> args, views, buffers, layouts;
};

ffi::Error TvmCall(CUstream stream, ffi::RemainingArgs& args, ffi::RemainingRets& rets, const TvmAttrs& t,
                   int device_type, int device_id) {
  if (t.token != g_process_token.load() || t.function == 0)
    return ffi::Error::InvalidArgument(
        "xgemm_tvm_ffi_call: this module names a TVM-FFI function of another process (or none); "
        "lower it again in this process (jax.export of it is not portable)");
  Attrs at{};
  at.buffers = t.buffers;
  at.layouts = t.layouts;
  Described d;
  if (ffi::Error e = Describe(args, rets, at, device_type, &d); e.failure()) return e;
  for (int i = 0; i < d.count; ++i) d.tensors[i].device.device_id = device_id;
  const int64_t n = static_cast<int64_t>(t.args.size() / 3);
  if (t.args.size() % 3 != 0 || n > kMaxParams)
    return ffi::Error::InvalidArgument("xgemm_tvm_ffi_call: bad args attribute");
  TVMFFIAny any[kMaxParams];
  DLTensor views[kMaxParams];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t kind = t.args[3 * i], a = t.args[3 * i + 1], b = t.args[3 * i + 2];
    TVMFFIAny& v = any[i];
    v.zero_padding = 0;
    v.v_int64 = 0;
    switch (kind) {
      case kArgTensor: {
        if (a < 0 || a >= d.count) return ffi::Error::InvalidArgument("xgemm_tvm_ffi_call: missing buffer");
        const DLTensor* src = &d.tensors[a];
        if (b >= 0) {  // an explicit view of the buffer: [ndim, shape..., strides...]
          const int64_t nd = (b < static_cast<int64_t>(t.views.size())) ? t.views[b] : -1;
          if (nd < 0 || b + 1 + 2 * nd > static_cast<int64_t>(t.views.size()))
            return ffi::Error::InvalidArgument("xgemm_tvm_ffi_call: bad view");
          views[i] = *src;
          views[i].ndim = static_cast<int32_t>(nd);
          views[i].shape = const_cast<int64_t*>(t.views.begin() + b + 1);
          views[i].strides = const_cast<int64_t*>(t.views.begin() + b + 1 + nd);
          src = &views[i];
        }
        v.type_index = kTVMFFIDLTensorPtr;
        v.v_ptr = const_cast<DLTensor*>(src);
        break;
      }
      case kArgInt: v.type_index = kTVMFFIInt; v.v_int64 = a; break;
      case kArgBool: v.type_index = kTVMFFIBool; v.v_int64 = a != 0; break;
      case kArgF64: v.type_index = kTVMFFIFloat; std::memcpy(&v.v_float64, &a, sizeof a); break;
      case kArgNone: v.type_index = kTVMFFINone; break;
      case kArgStream: v.type_index = kTVMFFIOpaquePtr; v.v_ptr = stream; break;
      default: return ffi::Error::InvalidArgument("xgemm_tvm_ffi_call: unknown argument kind");
    }
  }
  void* handle = reinterpret_cast<void*>(t.function);
  const TVMFFIFunctionCell* cell = TvmObjectCell<TVMFFIFunctionCell>(handle);
  TVMFFIAny result;
  result.type_index = kTVMFFINone;
  result.zero_padding = 0;
  result.v_int64 = 0;
  const int rc = cell->safe_call(handle, any, static_cast<int32_t>(n), &result);
  if (rc != 0) return ffi::Error::Internal("xgemm_tvm_ffi_call: " + TvmFfiErrorMessage(rc));
  CountLaunch(stream);
  if (result.type_index >= kTVMFFIStaticObjectBegin && result.v_ptr != nullptr) {
    void* lib = dlopen("libtvm_ffi.so", RTLD_NOW | RTLD_NOLOAD);   // drop a returned object
    if (lib != nullptr) {
      if (auto decref = reinterpret_cast<int (*)(void*)>(dlsym(lib, "TVMFFIObjectDecRef"))) decref(result.v_ptr);
      dlclose(lib);
    }
  }
  return ffi::Error::Success();
}

#define XGEMM_TVM_PARAMS                                                                      \
  int64_t function, int64_t token, ffi::Span<const int64_t> args_attr, ffi::Span<const int64_t> views, \
      ffi::Span<const int64_t> buffers, ffi::Span<const int64_t> layouts
#define XGEMM_TVM_ATTRS TvmAttrs{function, token, args_attr, views, buffers, layouts}

ffi::Error TvmCallCuda(CUstream stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                       XGEMM_TVM_PARAMS) {
  return TvmCall(stream, args, rets, XGEMM_TVM_ATTRS, kDLCUDA, device);
}

ffi::Error TvmCallHost(ffi::RemainingArgs args, ffi::RemainingRets rets, XGEMM_TVM_PARAMS) {
  return TvmCall(nullptr, args, rets, XGEMM_TVM_ATTRS, kDLCPU, 0);
}

// ---------------------------------------------------------------------------------------------
// The peer exchange (peer_exchange.h): a copy-engine collective-permute, fused with a TVM-FFI call
// (function != 0: the GEMM runs on XLA's stream while the copy runs beside it) or alone.
//   attrs    channel     the op's id (process-unique, from Python); the calls of one group meet on it
//            group_size, devices, sources   the route (peer_exchange.h)
//            exchange    [send, recv, block_bytes, chunk_offset, local_copy]: buffer indices (operands
//                        first, then results); block_bytes 0: recv is the whole recv buffer; else the
//                        bytes land at sources[rank] * block_bytes + chunk_offset in it (the sender's
//                        rows of a result), and local_copy 1 also copies this rank's send to
//                        rank * block_bytes + chunk_offset (its own rows)
//            + the TVM-FFI call's attributes (function 0: no call)

struct ExchangeAttrs {
  int64_t channel, group_size;
  ffi::Span<const int64_t> devices, sources, exchange;
};

xgemm_exchange::Route ToRoute(const ExchangeAttrs& x) {
  xgemm_exchange::Route r;
  r.channel = x.channel;
  r.group_size = x.group_size;
  r.devices = x.devices.begin();
  r.n_devices = static_cast<int64_t>(x.devices.size());
  r.sources = x.sources.begin();
  r.n_sources = static_cast<int64_t>(x.sources.size());
  return r;
}

ffi::Error RawBuffer(ffi::RemainingArgs& args, ffi::RemainingRets& rets, int64_t i, void** data, size_t* bytes) {
  auto buffer = BufferAt(args, rets, i);
  if (!buffer.has_value()) return buffer.error();
  *data = buffer->untyped_data();
  *bytes = buffer->size_bytes();
  return ffi::Error::Success();
}

// One call's part of an exchange: its group and rank, where it sends from and receives to, and
// where its own send is copied (null: no local copy).
struct Prepared {
  xgemm_exchange::Group* group = nullptr;
  int64_t rank = 0;
  void *send = nullptr, *recv = nullptr, *local = nullptr;
  size_t bytes = 0;
};

ffi::Error PrepareExchange(ffi::RemainingArgs& args, ffi::RemainingRets& rets, const ExchangeAttrs& x,
                           int32_t device, Prepared* p) {
  if (x.exchange.size() != 5) return ffi::Error::InvalidArgument("xgemm_exchange: exchange needs 5 values");
  if (std::string why = xgemm_exchange::Locate(ToRoute(x), device, &p->group, &p->rank); !why.empty())
    return ffi::Error::InvalidArgument("xgemm_exchange: " + why);
  size_t recv_bytes = 0;
  if (ffi::Error e = RawBuffer(args, rets, x.exchange[0], &p->send, &p->bytes); e.failure()) return e;
  if (ffi::Error e = RawBuffer(args, rets, x.exchange[1], &p->recv, &recv_bytes); e.failure()) return e;
  const int64_t block = x.exchange[2], chunk = x.exchange[3];
  if (block == 0) {
    if (recv_bytes != p->bytes) return ffi::Error::InvalidArgument("xgemm_exchange: send and recv differ in size");
    return ffi::Error::Success();
  }
  const int64_t size = static_cast<int64_t>(p->bytes), limit = static_cast<int64_t>(recv_bytes);
  const int64_t at = x.sources[p->rank] * block + chunk, own = p->rank * block + chunk;
  if (block < 0 || chunk < 0 || at + size > limit || (x.exchange[4] && own + size > limit))
    return ffi::Error::InvalidArgument("xgemm_exchange: the rows to receive fall outside the result");
  char* base = static_cast<char*>(p->recv);
  p->recv = base + at;
  if (x.exchange[4]) p->local = base + own;
  return ffi::Error::Success();
}

#define XGEMM_XCHG_PARAMS                                                                      \
  int64_t channel, int64_t group_size, ffi::Span<const int64_t> devices, ffi::Span<const int64_t> sources, \
      ffi::Span<const int64_t> exchange
#define XGEMM_XCHG_ATTRS ExchangeAttrs{channel, group_size, devices, sources, exchange}

ffi::Error ExchangeCallCuda(CUstream stream, int32_t device, ffi::RunId run, ffi::RemainingArgs args,
                            ffi::RemainingRets rets, XGEMM_TVM_PARAMS, XGEMM_XCHG_PARAMS) {
  const Driver& drv = GetDriver();
  if (!drv.ok) return ffi::Error::Internal("xgemm_exchange: " + drv.error);
  if (!drv.exchange_ok())
    return ffi::Error::Internal("xgemm_exchange: the CUDA driver lacks an event / stream / memcpy entry point");
  const ExchangeAttrs x = XGEMM_XCHG_ATTRS;
  Prepared p;
  if (ffi::Error e = PrepareExchange(args, rets, x, device, &p); e.failure()) return e;
  xgemm_exchange::CudaExchange ex(drv, stream, p.group, p.rank, x.sources.begin(), run.run_id);
  std::string error = ex.Begin(p.send, p.recv, p.bytes, p.local);
  ffi::Error call = ffi::Error::Success();
  if (error.empty() && function != 0) call = TvmCall(stream, args, rets, XGEMM_TVM_ATTRS, kDLCUDA, device);
  const std::string end = ex.End();
  if (!error.empty() || !end.empty()) return ffi::Error::Internal("xgemm_exchange: " + (error.empty() ? end : error));
  return call;
}

ffi::Error ExchangeHost(int32_t device, ffi::RunId run, ffi::RemainingArgs args, ffi::RemainingRets rets,
                        XGEMM_XCHG_PARAMS) {
  const ExchangeAttrs x = XGEMM_XCHG_ATTRS;
  Prepared p;
  if (ffi::Error e = PrepareExchange(args, rets, x, device, &p); e.failure()) return e;
  if (std::string error = xgemm_exchange::HostExchange(p.group, p.rank, x.sources.begin(), run.run_id, p.send,
                                                       p.recv, p.bytes, p.local);
      !error.empty())
    return ffi::Error::Internal("xgemm_exchange: " + error);
  return ffi::Error::Success();
}

template <typename B>
auto BindExchangeAttrs(B&& binding) {
  return std::move(binding).template Attr<int64_t>("channel")
      .template Attr<int64_t>("group_size")
      .template Attr<ffi::Span<const int64_t>>("devices")
      .template Attr<ffi::Span<const int64_t>>("sources")
      .template Attr<ffi::Span<const int64_t>>("exchange");
}

template <typename B>
auto BindTvmAttrs(B&& binding) {
  return std::move(binding).template Attr<int64_t>("function")
      .template Attr<int64_t>("token")
      .template Attr<ffi::Span<const int64_t>>("args")
      .template Attr<ffi::Span<const int64_t>>("views")
      .template Attr<ffi::Span<const int64_t>>("buffers")
      .template Attr<ffi::Span<const int64_t>>("layouts");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    XgemmTvmFfiCallExecute, TvmCallCuda,
    BindTvmAttrs(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>().Ctx<ffi::DeviceOrdinal>()
                     .RemainingArgs().RemainingRets()));

// The same call, declared CUDA-graph compatible: the default target (tests/test_jax_gpu.py runs a
// cold process's jit, whose CuTe functions load their modules on first call, under capture).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    XgemmTvmFfiCallGraphExecute, TvmCallCuda,
    BindTvmAttrs(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>().Ctx<ffi::DeviceOrdinal>()
                     .RemainingArgs().RemainingRets()),
    {ffi::Traits::kCmdBufferCompatible});

// Not CUDA-graph compatible: the devices meet on the host at every call.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    XgemmExchangeCallExecute, ExchangeCallCuda,
    BindExchangeAttrs(BindTvmAttrs(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>().Ctx<ffi::DeviceOrdinal>()
                                       .Ctx<ffi::RunId>().RemainingArgs().RemainingRets())));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    XgemmExchangeHost, ExchangeHost,
    BindExchangeAttrs(ffi::Ffi::Bind().Ctx<ffi::DeviceOrdinal>().Ctx<ffi::RunId>().RemainingArgs().RemainingRets()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(XgemmTvmFfiCallHost, TvmCallHost,
                              BindTvmAttrs(ffi::Ffi::Bind().RemainingArgs().RemainingRets()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    XgemmCubinLaunchExecute, ExecuteCuda,
    BindAttrs(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>().RemainingArgs().RemainingRets()),
    {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    XgemmCubinLaunchInitialize, InitializeCuda,
    BindAttrs(ffi::Ffi::BindInitialize().Ctx<ffi::PlatformStream<CUstream>>().RemainingArgs().RemainingRets()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(XgemmCubinLaunchHost, ExecuteHost,
                              BindAttrs(ffi::Ffi::Bind().RemainingArgs().RemainingRets()));

extern "C" {

__attribute__((visibility("default"))) int64_t XgemmFfiAbiVersion() { return kAbiVersion; }

// Substitutes the driver library (tests); only before the first launch in the process.
__attribute__((visibility("default"))) int XgemmFfiSetDriverPath(const char* path) {
  std::lock_guard<std::mutex> lock(g_driver_mu);
  if (g_driver.load() != nullptr) return 1;
  g_driver_path = path;
  return 0;
}

// The token modules lowered in this process carry for their TVM-FFI function handles.
__attribute__((visibility("default"))) void XgemmFfiSetProcessToken(int64_t token) { g_process_token.store(token); }

// Number of (context, module) loads so far: tests check that the module cache works.
__attribute__((visibility("default"))) int64_t XgemmFfiModulesLoaded() { return g_modules_loaded.load(); }

// Handler launches so far (cubin launches and TVM-FFI calls): out[0] all, out[1] those recorded
// into a CUDA graph being captured.
__attribute__((visibility("default"))) void XgemmFfiLaunchCounts(int64_t* out) {
  out[0] = g_launches.load();
  out[1] = g_captured_launches.load();
}

}  // extern "C"
