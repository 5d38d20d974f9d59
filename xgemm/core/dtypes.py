"""Dtype facts the kernel files share: element sizes and Triton's short names.

Names are as problem.Operand.dtype spells them. Kept out of problem.py on purpose: problem.py is
part of every CuTe object's cache fingerprint (compile.fingerprint), and these tables never change
what a kernel compiles to.
"""
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}
# Triton's short names, as the Gluon kernels' entry keys and signatures spell them
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
LONG_DTYPE = {v: k for k, v in SHORT_DTYPE.items()}
