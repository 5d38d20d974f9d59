// xgemm's native torch fast path: a repeat eager call of a signature seen before, done in C++.
//
// Contract (the Python side is xgemm/torch_native.py, which builds this file against the
// installed torch and registers plans; xgemm/fastpath.py decides what is registered):
//   hit(op, forced, s0, s1, a, b, c) -> torch.Tensor, or None on a miss (Python plans then).
//     op       small int (matmul / gemm / softmax), forced: the forced kernel name or None
//     s0, s1   exact Python floats or ints: alpha, beta (gemm) or axis, 0 (softmax)
//     a, b, c  exact torch.Tensor (or None for b, c): strided, CUDA, not requiring grad.
//              c is ignored (not keyed, not passed) when s1 == 0, as the Python fast path does.
//   A hit allocates the result (at::empty: the caching allocator, a's device) and launches on
//   the device's current torch stream what the first call of that signature launched, with only
//   the data pointers changed: either a TVM-FFI "safe call" of a CuTe function (store_tvm) or a
//   cuLaunchKernelEx of a loaded cubin function (store_cu).
//   Keys: op, forced, s0, s1 and, per operand, dtype, device, sizes, strides and the 16-byte
//   alignment class of its data pointer: everything a bound launch depends on.
//   store_tvm / store_cu copy what they are given (argument cells and DLTensors, or the launch
//   configuration and parameter block) into the entry, which also holds a reference to the
//   Python object owning the function (its library or module stays loaded).
// Why: the Python fast path spends ~2x torch's own per-op host cost (allocation and launch
// through Python); this is at::empty + one launch, like a native torch op.
// No CUDA toolkit needed: cuda_min.h declares the driver API; libcuda.so.1 is opened on first use.
// Never releases the GIL; each call copies its cells and parameters onto its own stack.
#include <Python.h>
#include <dlfcn.h>

#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_min.h"
#include "foreign_abi.h"

namespace {

constexpr int kMaxDims = 8;
constexpr int kMaxCells = 32;
constexpr int kMaxParamBytes = 1024;
constexpr size_t kMaxEntries = 1024;
enum Role { kA = 0, kB = 1, kC = 2, kOut = 3 };

using xgemm_foreign::DLTensor;
using xgemm_foreign::TVMFFIAny;
using xgemm_foreign::TVMFFIErrorCellHead;
using xgemm_foreign::TVMFFISafeCallType;
using xgemm_foreign::TvmObjectCell;
using xgemm_foreign::kTVMFFIDLTensorPtr, xgemm_foreign::kTVMFFIStaticObjectBegin;

// ---- key -------------------------------------------------------------------------------------
struct Key {
  std::array<int64_t, 5 + 3 * (4 + 2 * kMaxDims)> w{};
  int n = 0;
  bool push(int64_t v) { if (n == (int)w.size()) return false; w[n++] = v; return true; }
  bool operator==(const Key& o) const { return n == o.n && std::memcmp(w.data(), o.w.data(), n * 8) == 0; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < k.n; ++i) h = (h ^ (uint64_t)k.w[i]) * 1099511628211ull;
    return (size_t)h;
  }
};

// ---- entries ---------------------------------------------------------------------------------
struct TvmCall {
  TVMFFISafeCallType fn = nullptr;
  std::vector<TVMFFIAny> cells;
  std::vector<DLTensor> tensors;            // shape / strides point into dims
  std::vector<int> tensor_cell, tensor_role;
  std::vector<std::unique_ptr<int64_t[]>> dims;
  int stream_cell = -1;
};
struct CuLaunch {
  CUfunction func = nullptr;
  XgemmCUlaunchConfig config{};
  std::vector<XgemmCUlaunchAttribute> attrs;
  std::vector<uint8_t> params;              // 8-byte slots, the pointer slots zero
  std::vector<std::pair<int, int>> slots;   // (byte offset, role)
};
struct Entry {
  std::vector<int64_t> out_sizes;
  at::ScalarType out_dtype;
  int64_t out_align;
  bool is_tvm;
  TvmCall tvm;
  CuLaunch cu;
  PyObject* keep = nullptr;                 // owner of the function (strong reference)
};

std::unordered_map<Key, std::unique_ptr<Entry>, KeyHash> g_entries;
std::vector<PyObject*> g_forced;            // forced-kernel names seen (strong references)
int64_t g_hits = 0;
bool g_allow_cpu = false;                   // tests: CPU tensors stand for one CUDA device
uint64_t g_test_stream = 0;
PFN_cuLaunchKernelEx g_launch = nullptr;
PFN_cuCtxGetCurrent g_ctx_get = nullptr;
PFN_cuCtxSetCurrent g_ctx_set = nullptr;
PFN_cuDeviceGet g_device_get = nullptr;
PFN_cuDevicePrimaryCtxRetain g_primary_retain = nullptr;
PyObject* g_cuda_error = nullptr;           // (call, code, detail) -> exception instance
PyObject* g_tvm_error = nullptr;            // (kind, message) -> exception instance
std::string g_driver_path = "libcuda.so.1";

// ---- argument reading ------------------------------------------------------------------------
bool Scalar(PyObject* o, double* out) {
  if (PyFloat_CheckExact(o)) { *out = PyFloat_AS_DOUBLE(o); return true; }
  if (PyLong_CheckExact(o)) {
    *out = PyLong_AsDouble(o);
    if (*out == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return false; }
    return true;
  }
  return false;
}

int64_t ForcedId(PyObject* forced, bool add) {
  if (forced == Py_None) return 0;
  if (!PyUnicode_CheckExact(forced)) return -1;
  for (size_t i = 0; i < g_forced.size(); ++i) {
    if (g_forced[i] == forced) return (int64_t)i + 1;
    int eq = PyUnicode_Compare(g_forced[i], forced);
    if (eq == 0) return (int64_t)i + 1;
  }
  if (PyErr_Occurred()) PyErr_Clear();
  if (!add) return -1;
  Py_INCREF(forced);
  g_forced.push_back(forced);
  return (int64_t)g_forced.size();
}

// The tensor of a Python object the fast path may serve, or nullptr.
const at::Tensor* Served(PyObject* o) {
  if (!THPVariable_CheckExact(o)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (!t.defined() || t.layout() != c10::kStrided || t.requires_grad() || t.dim() > kMaxDims) return nullptr;
  if (!(t.is_cuda() || (g_allow_cpu && t.is_cpu()))) return nullptr;
  return &t;
}

bool KeyTensor(Key& k, const at::Tensor& t) {
  if (!k.push((int64_t)t.scalar_type()) || !k.push(t.get_device()) || !k.push(t.dim()) ||
      !k.push((int64_t)((uintptr_t)t.data_ptr() & 15)))
    return false;
  for (int64_t s : t.sizes()) if (!k.push(s)) return false;
  for (int64_t s : t.strides()) if (!k.push(s)) return false;
  return true;
}

// Reads (op, forced, s0, s1, a, b, c) into a key and the operands; false: not servable.
bool ReadCall(PyObject* const* args, bool add_forced, Key& key, const at::Tensor* ops[3]) {
  double s0, s1;
  if (!PyLong_CheckExact(args[0]) || !Scalar(args[2], &s0) || !Scalar(args[3], &s1)) return false;
  int64_t forced = ForcedId(args[1], add_forced);
  if (forced < 0) return false;
  int64_t b0, b1;
  std::memcpy(&b0, &s0, 8);
  std::memcpy(&b1, &s1, 8);
  key.push(PyLong_AsLongLong(args[0]));
  key.push(forced);
  key.push(b0);
  key.push(b1);
  key.push(PyFloat_CheckExact(args[2]) * 2 + PyFloat_CheckExact(args[3]));   // axis=1 is not axis=1.0
  for (int i = 0; i < 3; ++i) {
    PyObject* o = args[4 + i];
    ops[i] = nullptr;
    if (o == Py_None || (i == kC && s1 == 0.0)) { key.push(-1); continue; }
    if (!(ops[i] = Served(o)) || !KeyTensor(key, *ops[i])) return false;
  }
  return ops[0] != nullptr;
}

// ---- errors ----------------------------------------------------------------------------------
PyObject* RaiseFrom(PyObject* factory, PyObject* args) {
  if (args == nullptr) return nullptr;
  PyObject* exc = factory ? PyObject_CallObject(factory, args) : nullptr;
  Py_DECREF(args);
  if (exc == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "xgemm native fast path: launch failed");
    return nullptr;
  }
  PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return nullptr;
}

// The TVM-FFI runtime's object release (libtvm_ffi, loaded RTLD_GLOBAL by xgemm/tvm_abi.py).
void TvmDecRef(void* object) {
  typedef int (*DecRef)(void*);
  static auto decref = (DecRef)dlsym(RTLD_DEFAULT, "TVMFFIObjectDecRef");
  if (decref) decref(object);
}

PyObject* TvmError(int rc) {
  typedef void (*MoveFromRaised)(void**);
  static auto move = (MoveFromRaised)dlsym(RTLD_DEFAULT, "TVMFFIErrorMoveFromRaised");
  std::string kind = "RuntimeError", message = "CuTe function call failed (" + std::to_string(rc) + ")";
  void* err = nullptr;
  if (move) move(&err);
  if (err) {
    const TVMFFIErrorCellHead* cell = TvmObjectCell<TVMFFIErrorCellHead>(err);
    kind.assign(cell->kind.data, cell->kind.size);
    message.assign(cell->message.data, cell->message.size);
    TvmDecRef(err);
  }
  return RaiseFrom(g_tvm_error, Py_BuildValue("(ss)", kind.c_str(), message.c_str()));
}

// ---- launching -------------------------------------------------------------------------------
uint64_t CurrentStream(const c10::Device& device) {
  return (uint64_t)(uintptr_t)c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
}

PyObject* RunTvm(const TvmCall& call, void* const ptrs[4], uint64_t stream) {
  TVMFFIAny cells[kMaxCells];
  DLTensor tensors[4];
  const size_t n = call.cells.size();
  std::memcpy(cells, call.cells.data(), n * sizeof(TVMFFIAny));
  for (size_t i = 0; i < call.tensors.size(); ++i) {
    tensors[i] = call.tensors[i];
    tensors[i].data = ptrs[call.tensor_role[i]];
    cells[call.tensor_cell[i]].v_ptr = &tensors[i];
  }
  cells[call.stream_cell].v_int64 = (int64_t)stream;
  TVMFFIAny result{};
  int rc = call.fn(nullptr, cells, (int32_t)n, &result);
  if (rc != 0) return TvmError(rc);
  if (result.type_index >= kTVMFFIStaticObjectBegin && result.v_ptr) TvmDecRef(result.v_ptr);
  Py_RETURN_NONE;
}

// cuLaunchKernelEx and the calls that bind a thread's context: modules and functions come loaded
// from the Python side.
bool LoadDriver() {
  if (g_launch) return true;
  std::string unused;                       // the message below says the same for every failure
  void* lib = xgemm_foreign::OpenCudaDriver(g_driver_path, &unused);
  const bool ok = lib && xgemm_foreign::CudaSym(lib, "cuCtxGetCurrent", &g_ctx_get, &unused) &&
                  xgemm_foreign::CudaSym(lib, "cuCtxSetCurrent", &g_ctx_set, &unused) &&
                  xgemm_foreign::CudaSym(lib, "cuDeviceGet", &g_device_get, &unused) &&
                  xgemm_foreign::CudaSym(lib, "cuDevicePrimaryCtxRetain", &g_primary_retain, &unused) &&
                  xgemm_foreign::CudaSym(lib, "cuLaunchKernelEx", &g_launch, &unused);
  if (!ok) {
    g_launch = nullptr;
    PyErr_Format(PyExc_RuntimeError, "xgemm native fast path: no CUDA driver entry points in %s",
                 g_driver_path.c_str());
  }
  return ok;
}

// A thread that has run no CUDA runtime call has no current context: torch's autograd worker
// threads (c10's SetDevice skips cudaSetDevice when the device index already matches) and fresh
// user threads. Driver-API launches need one, so the device's primary context (the runtime's, the
// one the tensors live in) is made current once per thread and device, as the runtime would.
// False when it cannot be: the call is then a miss and the Python path reports the error.
bool BindThread(int index) {
  thread_local int bound = -1;
  if (bound == index) return true;
  CUcontext current = nullptr;
  if (g_ctx_get(&current) != 0) return false;
  if (current == nullptr) {
    int dev = 0;
    CUcontext primary = nullptr;
    if (g_device_get(&dev, index) != 0 || g_primary_retain(&primary, dev) != 0 || g_ctx_set(primary) != 0)
      return false;
  }
  bound = index;
  return true;
}

PyObject* RunCu(const CuLaunch& cu, void* const ptrs[4], uint64_t stream) {
  alignas(16) uint8_t params[kMaxParamBytes];
  void* slots[kMaxParamBytes / 8];
  const size_t bytes = cu.params.size();
  std::memcpy(params, cu.params.data(), bytes);
  for (const auto& [offset, role] : cu.slots) std::memcpy(params + offset, &ptrs[role], 8);
  for (size_t i = 0; i < bytes / 8; ++i) slots[i] = params + 8 * i;
  XgemmCUlaunchConfig config = cu.config;
  config.attrs = const_cast<XgemmCUlaunchAttribute*>(cu.attrs.data());
  config.hStream = reinterpret_cast<CUstream>(stream);
  if (!LoadDriver()) return nullptr;
  CUresult rc = g_launch(&config, cu.func, slots, nullptr);
  if (rc != 0) {
    std::string what = "grid " + std::to_string(config.gridDimX) + " block " + std::to_string(config.blockDimX) +
                       " shared " + std::to_string(config.sharedMemBytes) + " (native fast path)";
    return RaiseFrom(g_cuda_error, Py_BuildValue("(sis)", "cuLaunchKernelEx", (int)rc, what.c_str()));
  }
  Py_RETURN_NONE;
}

// ---- module functions ------------------------------------------------------------------------
PyObject* Hit(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) { PyErr_SetString(PyExc_TypeError, "hit(op, forced, s0, s1, a, b, c)"); return nullptr; }
  if (g_entries.empty()) Py_RETURN_NONE;
  Key key;
  const at::Tensor* ops[3];
  if (!ReadCall(args, false, key, ops)) Py_RETURN_NONE;
  auto it = g_entries.find(key);
  if (it == g_entries.end()) Py_RETURN_NONE;
  const Entry& e = *it->second;
  HANDLE_TH_ERRORS      // c10 errors become torch's Python exceptions (torch.OutOfMemoryError, ...)
  const at::Tensor& a = *ops[0];
  const c10::Device device = a.device();
  uint64_t stream = g_test_stream;
  std::optional<c10::DeviceGuard> guard;
  if (device.is_cuda()) {
    guard.emplace(device);
    if (!LoadDriver()) return nullptr;
    if (!BindThread(device.index())) Py_RETURN_NONE;
    stream = CurrentStream(device);
  }
  at::Tensor out = at::empty(e.out_sizes, at::TensorOptions().dtype(e.out_dtype).device(device));
  if (((uintptr_t)out.data_ptr() & 15) != (uintptr_t)e.out_align) Py_RETURN_NONE;   // bound for another class
  void* ptrs[4] = {a.data_ptr(), ops[1] ? ops[1]->data_ptr() : nullptr, ops[2] ? ops[2]->data_ptr() : nullptr,
                   out.data_ptr()};
  PyObject* done = e.is_tvm ? RunTvm(e.tvm, ptrs, stream) : RunCu(e.cu, ptrs, stream);
  if (done == nullptr) return nullptr;
  Py_DECREF(done);
  ++g_hits;
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

// The entry for (op, forced, s0, s1, a, b, c) with `result` as the first call's result; nullptr
// (an exception set) when the call is not one the fast path serves.
Entry* NewEntry(PyObject* const* args, PyObject* result, PyObject* keep, Key& key) {
  const at::Tensor* ops[3];
  if (!ReadCall(args, true, key, ops)) {
    PyErr_SetString(PyExc_ValueError, "xgemm native fast path: this call is not one it serves");
    return nullptr;
  }
  if (!THPVariable_CheckExact(result)) {
    PyErr_SetString(PyExc_TypeError, "xgemm native fast path: result must be a torch.Tensor");
    return nullptr;
  }
  const at::Tensor& r = THPVariable_Unpack(result);
  if (!r.is_contiguous() || r.device() != ops[0]->device()) {
    PyErr_SetString(PyExc_ValueError, "xgemm native fast path: result must be contiguous, on a's device");
    return nullptr;
  }
  auto e = std::make_unique<Entry>();
  e->out_sizes.assign(r.sizes().begin(), r.sizes().end());
  e->out_dtype = r.scalar_type();
  e->out_align = (int64_t)((uintptr_t)r.data_ptr() & 15);
  Py_INCREF(keep);
  e->keep = keep;
  return e.release();
}

bool Insert(const Key& key, Entry* e) {
  if (g_entries.size() >= kMaxEntries && !g_entries.count(key)) {
    Py_DECREF(e->keep);
    delete e;
    PyErr_SetString(PyExc_OverflowError, "xgemm native fast path: table full");
    return false;
  }
  auto& slot = g_entries[key];
  if (slot) Py_DECREF(slot->keep);
  slot.reset(e);
  return true;
}

bool Roles(PyObject* seq, std::vector<int>& out) {
  PyObject* fast = PySequence_Fast(seq, "roles must be a sequence");
  if (!fast) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  for (Py_ssize_t i = 0; i < n; ++i) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v < kA || v > kOut) { Py_DECREF(fast); PyErr_SetString(PyExc_ValueError, "role out of range"); return false; }
    out.push_back((int)v);
  }
  Py_DECREF(fast);
  return true;
}

// store_tvm(op, forced, s0, s1, a, b, c, result, keep, fn_address, cells_address, n_cells, roles)
//   cells: the marshalled TVMFFIAny array of the first call (xgemm/tvm_abi.py Prepared), its
//   last cell the stream; roles[j]: the operand the j-th DLTensor argument is.
PyObject* StoreTvm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 13) { PyErr_SetString(PyExc_TypeError, "store_tvm takes 13 arguments"); return nullptr; }
  uint64_t fn = PyLong_AsUnsignedLongLong(args[9]), cells_addr = PyLong_AsUnsignedLongLong(args[10]);
  long n = PyLong_AsLong(args[11]);
  if (PyErr_Occurred()) return nullptr;
  if (!fn || !cells_addr || n < 1 || n > kMaxCells) {
    PyErr_SetString(PyExc_ValueError, "store_tvm: bad function, cells or cell count");
    return nullptr;
  }
  std::vector<int> roles;
  if (!Roles(args[12], roles)) return nullptr;
  const TVMFFIAny* cells = reinterpret_cast<const TVMFFIAny*>(cells_addr);
  TvmCall call;
  call.fn = reinterpret_cast<TVMFFISafeCallType>(fn);
  call.cells.assign(cells, cells + n);
  call.stream_cell = (int)n - 1;
  for (long i = 0; i < n; ++i) {
    if (cells[i].type_index != kTVMFFIDLTensorPtr) continue;
    size_t j = call.tensors.size();
    if (j >= roles.size() || j >= 4) { PyErr_SetString(PyExc_ValueError, "store_tvm: more tensors than roles"); return nullptr; }
    DLTensor t = *static_cast<const DLTensor*>(cells[i].v_ptr);
    if (t.ndim < 0 || t.ndim > kMaxDims) { PyErr_SetString(PyExc_ValueError, "store_tvm: tensor rank"); return nullptr; }
    std::unique_ptr<int64_t[]> dims(new int64_t[2 * kMaxDims]);
    std::memcpy(dims.get(), t.shape, t.ndim * 8);
    std::memcpy(dims.get() + kMaxDims, t.strides, t.ndim * 8);
    t.shape = dims.get();
    t.strides = dims.get() + kMaxDims;
    call.tensors.push_back(t);
    call.tensor_cell.push_back((int)i);
    call.tensor_role.push_back(roles[j]);
    call.dims.push_back(std::move(dims));
  }
  if (call.tensors.size() != roles.size()) { PyErr_SetString(PyExc_ValueError, "store_tvm: roles != tensors"); return nullptr; }
  Key key;
  Entry* e = NewEntry(args, args[7], args[8], key);
  if (!e) return nullptr;
  e->is_tvm = true;
  e->tvm = std::move(call);
  if (!Insert(key, e)) return nullptr;
  Py_RETURN_NONE;
}

// store_cu(op, forced, s0, s1, a, b, c, result, keep, func, config_address, ctas, params, slots)
//   config: the launcher's CUlaunchConfig (copied with its attributes), ctas: its gridDimX,
//   params: the parameter block (8-byte slots), slots: ((byte offset, role), ...) pointer slots.
PyObject* StoreCu(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 14) { PyErr_SetString(PyExc_TypeError, "store_cu takes 14 arguments"); return nullptr; }
  uint64_t func = PyLong_AsUnsignedLongLong(args[9]), config_addr = PyLong_AsUnsignedLongLong(args[10]);
  unsigned long ctas = PyLong_AsUnsignedLong(args[11]);
  if (PyErr_Occurred()) return nullptr;
  char* params;
  Py_ssize_t bytes;
  if (!func || !config_addr || !ctas || PyBytes_AsStringAndSize(args[12], &params, &bytes) < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "store_cu: bad function or config");
    return nullptr;
  }
  if (bytes % 8 || bytes > kMaxParamBytes) { PyErr_SetString(PyExc_ValueError, "store_cu: parameter block size"); return nullptr; }
  CuLaunch cu;
  cu.func = reinterpret_cast<CUfunction>(func);
  cu.config = *reinterpret_cast<const XgemmCUlaunchConfig*>(config_addr);
  cu.config.gridDimX = (unsigned)ctas;
  if (cu.config.numAttrs > 8) { PyErr_SetString(PyExc_ValueError, "store_cu: attributes"); return nullptr; }
  cu.attrs.assign(cu.config.attrs, cu.config.attrs + cu.config.numAttrs);
  cu.params.assign(params, params + bytes);
  PyObject* fast = PySequence_Fast(args[13], "slots must be a sequence");
  if (!fast) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    int offset = -1, role = -1;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "ii", &offset, &role) || offset < 0 ||
        offset + 8 > bytes || offset % 8 || role < kA || role > kOut) {
      Py_DECREF(fast);
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "store_cu: bad slot");
      return nullptr;
    }
    cu.slots.emplace_back(offset, role);
  }
  Py_DECREF(fast);
  Key key;
  Entry* e = NewEntry(args, args[7], args[8], key);
  if (!e) return nullptr;
  e->is_tvm = false;
  e->cu = std::move(cu);
  if (!Insert(key, e)) return nullptr;
  Py_RETURN_NONE;
}

// stream(index): the stream a hit on CUDA device `index` launches on (torch's current one);
// xgemm/torch_native.py checks it against torch.cuda.current_stream before using this module.
PyObject* StreamOf(PyObject*, PyObject* index) {
  long i = PyLong_AsLong(index);
  if (PyErr_Occurred()) return nullptr;
  HANDLE_TH_ERRORS
  return PyLong_FromUnsignedLongLong(CurrentStream(c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)i)));
  END_HANDLE_TH_ERRORS
}

PyObject* Clear(PyObject*, PyObject*) {
  for (auto& [k, e] : g_entries) Py_DECREF(e->keep);
  g_entries.clear();
  Py_RETURN_NONE;
}

PyObject* Stats(PyObject*, PyObject*) {
  return Py_BuildValue("{s:n,s:L}", "entries", (Py_ssize_t)g_entries.size(), "hits", (long long)g_hits);
}

// configure(cuda_error, tvm_error, driver_path, allow_cpu, test_stream): error factories, and
// for tests a stand-in driver library and CPU tensors standing for one CUDA device.
PyObject* Configure(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) { PyErr_SetString(PyExc_TypeError, "configure takes 5 arguments"); return nullptr; }
  const char* path = PyUnicode_AsUTF8(args[2]);
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[4]);
  if (!path || PyErr_Occurred()) return nullptr;
  Py_XINCREF(args[0]); Py_XDECREF(g_cuda_error); g_cuda_error = args[0];
  Py_XINCREF(args[1]); Py_XDECREF(g_tvm_error); g_tvm_error = args[1];
  if (g_driver_path != path) { g_driver_path = path; g_launch = nullptr; }
  g_allow_cpu = PyObject_IsTrue(args[3]);
  g_test_stream = stream;
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"hit", (PyCFunction)(void (*)(void))Hit, METH_FASTCALL, "hit(op, forced, s0, s1, a, b, c) -> Tensor | None"},
    {"store_tvm", (PyCFunction)(void (*)(void))StoreTvm, METH_FASTCALL, "register a TVM-FFI call"},
    {"store_cu", (PyCFunction)(void (*)(void))StoreCu, METH_FASTCALL, "register a cuLaunchKernelEx launch"},
    {"configure", (PyCFunction)(void (*)(void))Configure, METH_FASTCALL, "error factories; test stand-ins"},
    {"clear", Clear, METH_NOARGS, "drop every entry"},
    {"stream", StreamOf, METH_O, "stream(device index) -> the current torch stream a hit uses"},
    {"stats", Stats, METH_NOARGS, "{'entries': n, 'hits': n}"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "xgemm_torch_fastpath", nullptr, -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_xgemm_torch_fastpath() { return PyModule_Create(&kModule); }
