"""Operand roles in the recipes a bound launch hands the native torch fast path: which caller
operand fills each tensor argument or pointer slot (ffi/torch_fastpath.cc numbers them the same)."""
A, B, C, OUT = 0, 1, 2, 3
