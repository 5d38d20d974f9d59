// The C ABIs of other libraries that xgemm's native code calls, declared once for xgemm_ffi.cc,
// torch_fastpath.cc and peer_exchange.h (no CUDA toolkit, dlpack or tvm-ffi headers needed):
//   the CUDA driver   entry points looked up at run time in libcuda.so.1 (or a test's stand-in);
//   DLPack            the tensor descriptor (dlpack.h v1 layout);
//   TVM-FFI           argument cells, function and error objects (tvm/ffi/c_api.h), the same
//                     layouts xgemm/tvm_abi.py marshals from Python.
#ifndef XGEMM_FFI_FOREIGN_ABI_H_
#define XGEMM_FFI_FOREIGN_ABI_H_

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda_min.h"

// Not the global namespace: a real dlpack.h (torch ships one) may end up in the same file.
namespace xgemm_foreign {

// ---- CUDA driver -------------------------------------------------------------------------------

struct CudaDriver {
  // Launching (xgemm_ffi.cc requires all of them)
  PFN_cuGetErrorString get_error_string = nullptr;
  PFN_cuModuleLoadData module_load_data = nullptr;
  PFN_cuModuleGetFunction module_get_function = nullptr;
  PFN_cuFuncSetAttribute func_set_attribute = nullptr;
  PFN_cuLaunchKernelEx launch_kernel_ex = nullptr;
  PFN_cuStreamGetCtx stream_get_ctx = nullptr;
  PFN_cuStreamIsCapturing stream_is_capturing = nullptr;
  PFN_cuCtxPushCurrent ctx_push = nullptr;
  PFN_cuCtxPopCurrent ctx_pop = nullptr;
  // The peer exchange only: optional, so a driver (or test stand-in) without them still launches
  PFN_cuEventCreate event_create = nullptr;
  PFN_cuEventRecord event_record = nullptr;
  PFN_cuStreamWaitEvent stream_wait_event = nullptr;
  PFN_cuStreamCreate stream_create = nullptr;
  PFN_cuMemcpyAsync memcpy_async = nullptr;
  PFN_cuCtxEnablePeerAccess ctx_enable_peer_access = nullptr;
  bool exchange_ok() const {
    return stream_get_ctx && ctx_push && ctx_pop && event_create && event_record && stream_wait_event &&
           stream_create && memcpy_async && ctx_enable_peer_access;
  }
};

}  // namespace xgemm_foreign

// Hidden: nothing below joins the libraries' exported symbols (std::vector<DLTensor> in
// torch_fastpath.cc, the loader's functions). CudaDriver above is not: peer_exchange.h's inline
// functions take it, and hiding it would hide them too.
namespace __attribute__((visibility("hidden"))) xgemm_foreign {

// The driver library, or nullptr with *error set. Never closed: loaded modules live in it.
inline void* OpenCudaDriver(const std::string& path, std::string* error) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    *error = "cannot open the CUDA driver " + path + ": " + (why ? why : "?");
  }
  return lib;
}

template <typename T>
bool CudaSym(void* lib, const char* name, T* out, std::string* error) {
  *out = reinterpret_cast<T>(dlsym(lib, name));
  if (*out == nullptr) {
    *error = std::string("symbol ") + name + " not found in the CUDA driver library";
    return false;
  }
  return true;
}

// Fills every entry point; false (with *error naming the first missing one) when a launching
// one is missing. Symbol names are the exported ones (cuda.h maps cuCtxPushCurrent to _v2).
inline bool LoadCudaDriver(void* lib, CudaDriver* d, std::string* error) {
  const bool ok = CudaSym(lib, "cuGetErrorString", &d->get_error_string, error) &&
                  CudaSym(lib, "cuModuleLoadData", &d->module_load_data, error) &&
                  CudaSym(lib, "cuModuleGetFunction", &d->module_get_function, error) &&
                  CudaSym(lib, "cuFuncSetAttribute", &d->func_set_attribute, error) &&
                  CudaSym(lib, "cuLaunchKernelEx", &d->launch_kernel_ex, error) &&
                  CudaSym(lib, "cuStreamGetCtx", &d->stream_get_ctx, error) &&
                  CudaSym(lib, "cuStreamIsCapturing", &d->stream_is_capturing, error) &&
                  CudaSym(lib, "cuCtxPushCurrent_v2", &d->ctx_push, error) &&
                  CudaSym(lib, "cuCtxPopCurrent_v2", &d->ctx_pop, error);
  d->event_create = reinterpret_cast<PFN_cuEventCreate>(dlsym(lib, "cuEventCreate"));
  d->event_record = reinterpret_cast<PFN_cuEventRecord>(dlsym(lib, "cuEventRecord"));
  d->stream_wait_event = reinterpret_cast<PFN_cuStreamWaitEvent>(dlsym(lib, "cuStreamWaitEvent"));
  d->stream_create = reinterpret_cast<PFN_cuStreamCreate>(dlsym(lib, "cuStreamCreate"));
  d->memcpy_async = reinterpret_cast<PFN_cuMemcpyAsync>(dlsym(lib, "cuMemcpyAsync"));
  d->ctx_enable_peer_access = reinterpret_cast<PFN_cuCtxEnablePeerAccess>(dlsym(lib, "cuCtxEnablePeerAccess"));
  return ok;
}

// ---- DLPack ------------------------------------------------------------------------------------

struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
enum { kDLCPU = 1, kDLCUDA = 2 };                                              // DLDeviceType
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6,      // DLDataTypeCode
       kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12 };

// ---- TVM-FFI -----------------------------------------------------------------------------------

struct TVMFFIAny {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    double v_float64;
    void* v_ptr;
  };
};
static_assert(sizeof(TVMFFIAny) == 16, "TVMFFIAny is 16 bytes");
typedef int (*TVMFFISafeCallType)(void* handle, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);
struct TVMFFIObjectHeader {
  uint64_t combined_ref_count;
  int32_t type_index;
  uint32_t padding;
  void* deleter;
};
static_assert(sizeof(TVMFFIObjectHeader) == 24, "TVMFFIObjectHeader is 24 bytes");
struct TVMFFIFunctionCell {
  TVMFFISafeCallType safe_call;
  void* cpp_call;
};
struct TVMFFIByteArray {
  const char* data;
  size_t size;
};
struct TVMFFIErrorCellHead {
  TVMFFIByteArray kind;
  TVMFFIByteArray message;
};
enum : int32_t {
  kTVMFFINone = 0, kTVMFFIInt = 1, kTVMFFIBool = 2, kTVMFFIFloat = 3, kTVMFFIOpaquePtr = 4,
  kTVMFFIDLTensorPtr = 7, kTVMFFIStaticObjectBegin = 64,
};

// What follows an object's header: a function's TVMFFIFunctionCell, an error's TVMFFIErrorCellHead.
template <typename Cell>
const Cell* TvmObjectCell(const void* object) {
  return reinterpret_cast<const Cell*>(static_cast<const char*>(object) + sizeof(TVMFFIObjectHeader));
}

}  // namespace xgemm_foreign

#endif  // XGEMM_FFI_FOREIGN_ABI_H_
