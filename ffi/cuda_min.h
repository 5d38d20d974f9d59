// The few CUDA driver API declarations the xgemm FFI handler needs.
//
// Declared here so the handler builds with no CUDA toolkit (CI builds it on CPU); libcuda.so.1
// is opened with dlopen at run time. Values and layouts are those of cuda.h (CUDA 12/13);
// tests/test_jax_ffi.py compares them with a real cuda.h when one is at hand.
#ifndef XGEMM_FFI_CUDA_MIN_H_
#define XGEMM_FFI_CUDA_MIN_H_

#include <cstddef>
#include <cstdint>

extern "C" {

typedef int CUresult;                       // enum cudaError_enum; 0 == CUDA_SUCCESS
typedef unsigned long long CUdeviceptr;     // CUdeviceptr_v2
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;

enum { CUDA_SUCCESS_ = 0 };

// CUfunction_attribute
enum {
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES_ = 8,
  CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED_ = 14,
};

// CUlaunchAttributeID
enum {
  CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION_ = 4,
  CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE_ = 5,
  CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION_ = 6,
};
enum { CU_CLUSTER_SCHEDULING_POLICY_SPREAD_ = 1 };
enum { CU_STREAM_CAPTURE_STATUS_NONE_ = 0 };
enum { CU_STREAM_NON_BLOCKING_ = 1 };        // CUstream_flags
enum { CU_EVENT_DISABLE_TIMING_ = 2 };       // CUevent_flags

typedef union XgemmCUlaunchAttributeValue {
  char pad[64];
  struct {
    unsigned int x;
    unsigned int y;
    unsigned int z;
  } clusterDim;
  int clusterSchedulingPolicyPreference;
  int programmaticStreamSerializationAllowed;
} XgemmCUlaunchAttributeValue;

typedef struct XgemmCUlaunchAttribute {
  int id;                                   // CUlaunchAttributeID (an enum: 4 bytes)
  char pad[8 - sizeof(int)];
  XgemmCUlaunchAttributeValue value;
} XgemmCUlaunchAttribute;

typedef struct XgemmCUlaunchConfig {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  XgemmCUlaunchAttribute* attrs;
  unsigned int numAttrs;
} XgemmCUlaunchConfig;

// Driver entry points, by the exported symbol names (cuda.h maps cuCtxPushCurrent to _v2).
typedef CUresult (*PFN_cuGetErrorString)(CUresult, const char**);
typedef CUresult (*PFN_cuModuleLoadData)(CUmodule*, const void*);
typedef CUresult (*PFN_cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
typedef CUresult (*PFN_cuFuncSetAttribute)(CUfunction, int, int);
typedef CUresult (*PFN_cuLaunchKernelEx)(const XgemmCUlaunchConfig*, CUfunction, void**, void**);
typedef CUresult (*PFN_cuStreamGetCtx)(CUstream, CUcontext*);
typedef CUresult (*PFN_cuStreamIsCapturing)(CUstream, int*);
typedef CUresult (*PFN_cuCtxPushCurrent)(CUcontext);
typedef CUresult (*PFN_cuCtxPopCurrent)(CUcontext*);
// A thread without a current context (the torch fast path binds the primary one)
typedef CUresult (*PFN_cuCtxGetCurrent)(CUcontext*);
typedef CUresult (*PFN_cuCtxSetCurrent)(CUcontext);
typedef CUresult (*PFN_cuDeviceGet)(int*, int);
typedef CUresult (*PFN_cuDevicePrimaryCtxRetain)(CUcontext*, int);
// The peer exchange (peer_exchange.h)
typedef CUresult (*PFN_cuEventCreate)(CUevent*, unsigned int);
typedef CUresult (*PFN_cuEventRecord)(CUevent, CUstream);
typedef CUresult (*PFN_cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
typedef CUresult (*PFN_cuStreamCreate)(CUstream*, unsigned int);
typedef CUresult (*PFN_cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*PFN_cuCtxEnablePeerAccess)(CUcontext, unsigned int);

}  // extern "C"

#endif  // XGEMM_FFI_CUDA_MIN_H_
