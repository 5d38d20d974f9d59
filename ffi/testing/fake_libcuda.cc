// A stand-in for libcuda.so.1, for testing ffi/xgemm_ffi.cc on machines without a GPU.
//
// It implements the nine driver entry points the handler opens, over host memory: a "cubin"
// is any blob starting with "XGEMM-FAKE-CUBIN", its "kernels" are the two functions below,
// and cuLaunchKernelEx runs them on the host buffers XLA:CPU hands the handler. Every call
// is counted and the last launch configuration is kept, so tests can check the module cache,
// the shared-memory / cluster attributes and the parameter packing end to end.
#include <cmath>
#include <cstdint>
#include <cstring>

extern "C" {

typedef int CUresult;
struct FakeModule { int id; };
struct FakeFunction { int kind; };

static FakeModule g_module = {1};
static FakeFunction g_gemm = {1};
static FakeFunction g_softmax = {2};
static int g_fake_context = 7;

static int64_t g_loads = 0, g_set_attribute = 0, g_launches = 0;
static int64_t g_last[10];   // grid xyz, block xyz, cluster xyz, shared memory
static int64_t g_max_smem_attr = 0, g_non_portable = 0;

typedef struct {
  int id;
  char pad[4];
  union { char raw[64]; struct { unsigned x, y, z; } cluster; int policy; } value;
} Attr;
typedef struct {
  unsigned gx, gy, gz, bx, by, bz, smem;
  void* stream;
  Attr* attrs;
  unsigned num_attrs;
} Config;

CUresult cuGetErrorString(CUresult rc, const char** s) {
  *s = rc == 200 ? "CUDA_ERROR_INVALID_IMAGE (fake)" : rc == 500 ? "CUDA_ERROR_NOT_FOUND (fake)" : "fake error";
  return 0;
}

CUresult cuModuleLoadData(void** module, const void* image) {
  if (std::strncmp(static_cast<const char*>(image), "XGEMM-FAKE-CUBIN", 16) != 0) return 200;
  ++g_loads;
  *module = &g_module;
  return 0;
}

CUresult cuModuleGetFunction(void** fn, void* module, const char* name) {
  if (module != &g_module) return 400;
  if (std::strcmp(name, "fake_gemm_f32") == 0) { *fn = &g_gemm; return 0; }
  if (std::strcmp(name, "fake_softmax_f32") == 0) { *fn = &g_softmax; return 0; }
  return 500;
}

CUresult cuFuncSetAttribute(void* fn, int attr, int value) {
  ++g_set_attribute;
  if (attr == 8) g_max_smem_attr = value;
  if (attr == 14) g_non_portable = value;
  return 0;
}

CUresult cuStreamGetCtx(void* stream, void** ctx) { *ctx = &g_fake_context; return 0; }
CUresult cuStreamIsCapturing(void* stream, int* status) { *status = 0; return 0; }
CUresult cuCtxPushCurrent_v2(void* ctx) { return ctx == &g_fake_context ? 0 : 201; }
CUresult cuCtxPopCurrent_v2(void** ctx) { *ctx = &g_fake_context; return 0; }
// the torch fast path binds a thread's context (its CPU tests run on CPU tensors: never called)
CUresult cuCtxGetCurrent(void** ctx) { *ctx = &g_fake_context; return 0; }
CUresult cuCtxSetCurrent(void* ctx) { return ctx == &g_fake_context ? 0 : 201; }
CUresult cuDeviceGet(int* dev, int ordinal) { *dev = ordinal; return 0; }
CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) { *ctx = &g_fake_context; return 0; }

}  // extern "C"

template <typename T>
static T P(void** params, int i) { T v; std::memcpy(&v, params[i], sizeof v); return v; }

// D[l] = alpha * A[l] @ B[l] + beta * C[l]; parameters:
// (A, B, C|null, D, M:i32, N:i32, K:i32, L:i32, sA:i64, sB:i64, sC:i64, a_col:i32, b_col:i32,
//  alpha:f32, beta:f32, scratch|null)
static void FakeGemm(void** p) {
  const float* A = P<const float*>(p, 0);
  const float* B = P<const float*>(p, 1);
  const float* C = P<const float*>(p, 2);
  float* D = P<float*>(p, 3);
  const int M = P<int32_t>(p, 4), N = P<int32_t>(p, 5), K = P<int32_t>(p, 6), L = P<int32_t>(p, 7);
  const int64_t sA = P<int64_t>(p, 8), sB = P<int64_t>(p, 9), sC = P<int64_t>(p, 10);
  const int a_col = P<int32_t>(p, 11), b_col = P<int32_t>(p, 12);
  const float alpha = P<float>(p, 13), beta = P<float>(p, 14);
  for (int l = 0; l < L; ++l)
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double acc = 0;
        for (int k = 0; k < K; ++k) {
          const float a = A[l * sA + (a_col ? int64_t(k) * M + m : int64_t(m) * K + k)];
          const float b = B[l * sB + (b_col ? int64_t(n) * K + k : int64_t(k) * N + n)];
          acc += double(a) * double(b);
        }
        float d = alpha * float(acc);
        if (C != nullptr) d += beta * C[l * sC + int64_t(m) * N + n];
        D[int64_t(l) * M * N + int64_t(m) * N + n] = d;
      }
}

// y = softmax(x) over rows x cols, row-major; parameters: (x, y, rows:i32, cols:i32)
static void FakeSoftmax(void** p) {
  const float* x = P<const float*>(p, 0);
  float* y = P<float*>(p, 1);
  const int rows = P<int32_t>(p, 2), cols = P<int32_t>(p, 3);
  for (int r = 0; r < rows; ++r) {
    float mx = -INFINITY;
    for (int c = 0; c < cols; ++c) mx = std::fmax(mx, x[int64_t(r) * cols + c]);
    double s = 0;
    for (int c = 0; c < cols; ++c) s += std::exp(double(x[int64_t(r) * cols + c]) - mx);
    for (int c = 0; c < cols; ++c) y[int64_t(r) * cols + c] = float(std::exp(double(x[int64_t(r) * cols + c]) - mx) / s);
  }
}

extern "C" {

CUresult cuLaunchKernelEx(const Config* cfg, void* fn, void** params, void** extra) {
  ++g_launches;
  const int64_t last[10] = {cfg->gx, cfg->gy, cfg->gz, cfg->bx, cfg->by, cfg->bz, 1, 1, 1, cfg->smem};
  std::memcpy(g_last, last, sizeof last);
  for (unsigned i = 0; i < cfg->num_attrs; ++i)
    if (cfg->attrs[i].id == 4) {
      g_last[6] = cfg->attrs[i].value.cluster.x;
      g_last[7] = cfg->attrs[i].value.cluster.y;
      g_last[8] = cfg->attrs[i].value.cluster.z;
    }
  if (fn == &g_gemm) FakeGemm(params);
  else if (fn == &g_softmax) FakeSoftmax(params);
  else return 400;
  return 0;
}

// Test accessors: [loads, set_attribute calls, launches, max-smem attribute, non-portable flag,
// grid x y z, block x y z, cluster x y z, smem]
void fake_cuda_stats(int64_t* out) {
  out[0] = g_loads; out[1] = g_set_attribute; out[2] = g_launches;
  out[3] = g_max_smem_attr; out[4] = g_non_portable;
  std::memcpy(out + 5, g_last, sizeof g_last);
}

}  // extern "C"
