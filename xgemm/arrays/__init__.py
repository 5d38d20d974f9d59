"""The caller's arrays: DLPack views, framework detection (no imports), and operations in the
caller's own framework (compact, pad, import, allocate, stream).

Data flows one way: caller array -> view() -> ArrayView -> core.problem -> kernel -> result in
the owner framework.
"""
from xgemm.arrays.detect import (FRAMEWORKS, dtype_name, framework_of, is_jax_tracer, require_array, require_arrays,
                                 requested_dtype)
from xgemm.arrays.ops import (MIXING_RULES, compact, current_stream, empty, framework_dtype, import_into, namespace,
                              padded_copy)
from xgemm.arrays.views import ArrayView, alignment, operand, view, view_torch

__all__ = ["FRAMEWORKS", "MIXING_RULES", "ArrayView", "alignment", "compact", "current_stream", "dtype_name",
           "empty", "framework_dtype", "framework_of", "import_into", "is_jax_tracer", "namespace", "operand",
           "padded_copy", "require_array", "require_arrays", "requested_dtype",
           "view", "view_torch"]
