/* A stand-in for an exported CuTe function (tests/test_tvm_abi.py): records what the TVM-FFI
   "safe call" received, so the ctypes marshalling of xgemm/tvm_abi.py can be checked on a CPU. */
#include <stdint.h>
#include <string.h>

typedef struct { int32_t type_index; uint32_t zero_padding; union { int64_t i; double f; void* p; } v; } Any;
typedef struct { int32_t device_type, device_id; } Dev;
typedef struct { uint8_t code, bits; uint16_t lanes; } DType;
typedef struct { void* data; Dev device; int32_t ndim; DType dtype; int64_t* shape; int64_t* strides;
                 uint64_t byte_offset; } Tensor;

/* per argument: type index, then int/float bits or the tensor's data, device, dtype, dims */
int64_t xgemm_echo[256];
int32_t xgemm_echo_calls = 0;

int __tvm_ffi_func(void* self, const Any* args, int32_t n, Any* result) {
  (void)self;
  int64_t* o = xgemm_echo;
  *o++ = n;
  for (int32_t i = 0; i < n; ++i) {
    *o++ = args[i].type_index;
    if (args[i].type_index == 7) {
      const Tensor* t = (const Tensor*)args[i].v.p;
      *o++ = (int64_t)(intptr_t)t->data; *o++ = t->device.device_type; *o++ = t->device.device_id;
      *o++ = t->dtype.code; *o++ = t->dtype.bits; *o++ = t->ndim;
      for (int32_t d = 0; d < t->ndim; ++d) *o++ = t->shape[d];
      for (int32_t d = 0; d < t->ndim; ++d) *o++ = t->strides[d];
    } else {
      int64_t bits; memcpy(&bits, &args[i].v, 8); *o++ = bits;
    }
  }
  xgemm_echo_calls += 1;
  result->type_index = 0;
  return 0;
}
