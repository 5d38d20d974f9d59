"""The dispatch table: for each op, kernels in order of preference; the first that accepts wins.

A kernel is any object with
    name: str
    supports(problem) -> None | str      None accepts; a string is the reason it declines
    policy(problem) -> Policy            tile/stages/cluster/... for this problem
    run(problem, policy, operands, out, stream) -> None
and optionally
    bind(problem, policy, operands, out) -> go | None   run() resolved for one signature, for
                                         fastpath.py's repeat calls (go takes torch tensors + stream)
and is registered here by "module:attribute" so that nothing is imported until a problem
asks (import xgemm stays light). The embedded default (kernels/reference.py) is last and
accepts every problem, so a problem no GPU kernel takes still gets a right answer.

A policy override forces one kernel by name: `with xgemm.policy.force("cute_mma_sm80"): ...`
or the environment variable XGEMM_KERNEL=cute_mma_sm80. A forced kernel that declines raises.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import errors
from .problem import Policy

# op -> [(kernel name, "module:attribute")], most preferred first; reference is always last.
_TABLE: Dict[str, List[Tuple[str, str]]] = {
    "gemm": [
        # skinny M (<= 64) with K >= 1024 only (its supports() declines the rest): split-K over a
        # cluster, where every cute_gemm_sm90 tile leaves SMs idle (see the kernel's notes)
        ("gluon_splitk_sm90", "xgemm.kernels.gluon_splitk_sm90:KERNEL"),
        ("cute_gemm_sm90", "xgemm.kernels.cute_gemm_sm90:KERNEL"),
        # measured on the H200 behind cute_gemm_sm90 at every shape class it accepts (same dtypes,
        # no epilogue, no batch): reached when the CuTe kernel declines or by force()
        ("gluon_matmul_sm90", "xgemm.kernels.gluon_matmul_sm90:KERNEL"),
        ("cute_mma_sm80", "xgemm.kernels.cute_mma_sm80:KERNEL"),
        ("cute_sgemm", "xgemm.kernels.cute_sgemm:KERNEL"),
        ("reference", "xgemm.kernels.reference:GEMM"),
    ],
    "softmax": [
        ("gluon_softmax", "xgemm.kernels.gluon_softmax:KERNEL"),
        ("reference", "xgemm.kernels.reference:SOFTMAX"),
    ],
}
_loaded: Dict[str, Any] = {}
_forced: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("xgemm_forced_kernel", default=None)


@dataclass
class Plan:
    """Everything explain() reports: the problem, the chosen kernel and policy, and why others declined."""
    op: str
    problem: Any
    kernel: Any
    policy: Policy
    declined: List[Tuple[str, str]] = field(default_factory=list)
    copies: List[str] = field(default_factory=list)

    @property
    def kernel_name(self) -> str:
        return self.kernel.name

    def __str__(self) -> str:
        lines = [f"{self.problem.summary()}",
                 f"  kernel: {self.kernel.name}  policy: {self.policy.summary()}"]
        for name, reason in self.declined:
            lines.append(f"  declined {name}: {reason}")
        lines.extend(f"  copy: {c}" for c in self.copies) if self.copies else lines.append("  copies: none (zero-copy)")
        return "\n".join(lines)


def kernel_names(op: str) -> List[str]:
    return [name for name, _ in _TABLE[op]]


def register(op: str, name: str, target: str, *, before: Optional[str] = None) -> None:
    """Add a kernel ("module:attribute") to op's table, ahead of `before` (default: ahead of reference)."""
    table = _TABLE.setdefault(op, [])
    table[:] = [(n, t) for n, t in table if n != name]
    anchor = before or "reference"
    index = next((i for i, (n, _) in enumerate(table) if n == anchor), len(table))
    table.insert(index, (name, target))
    _loaded.pop(target, None)
    _plans.clear()
    from . import fastpath        # plans kept for repeat calls may name the old table's kernels
    fastpath.clear()


def load(target: str) -> Optional[Any]:
    """Import a kernel lazily; a kernel whose module is absent or fails to import is None (declines)."""
    if target not in _loaded:
        module_name, _, attr = target.partition(":")
        try:
            _loaded[target] = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:   # not in this install, or its compiler missing
            _loaded[target] = exc
    value = _loaded[target]
    return None if isinstance(value, Exception) else value


def _load_reason(target: str) -> str:
    value = _loaded.get(target)
    return f"not importable here ({value})" if isinstance(value, Exception) else "not importable here"


@contextlib.contextmanager
def force(name: Optional[str]):
    """Force one kernel by name for calls inside the block (None lifts the override)."""
    token = _forced.set(name)
    try:
        yield
    finally:
        _forced.reset(token)


# os.environ decodes on every lookup (~1 us, on the hot path of every call); read its bytes store
_ENV = getattr(os.environ, "_data", None) if os.name == "posix" else None


def forced_kernel() -> Optional[str]:
    """The kernel forced by policy.force() or, failing that, XGEMM_KERNEL (empty means none)."""
    forced = _forced.get()
    if forced:
        return forced
    if _ENV is None:
        return os.environ.get("XGEMM_KERNEL") or None
    env = _ENV.get(b"XGEMM_KERNEL")
    return os.fsdecode(env) if env else None


_plans: Dict[tuple, tuple] = {}
_PLAN_CACHE_SIZE = 4096


def choose(op: str, problem: Any) -> Plan:
    """The cached choice for this exact problem, or a fresh walk of the table."""
    key = (op, problem, forced_kernel())      # register() and table restores clear _plans
    hit = _plans.get(key)
    if hit is None:
        plan = _choose(op, problem)
        if len(_plans) >= _PLAN_CACHE_SIZE:
            _plans.clear()
        _plans[key] = hit = (plan.kernel, plan.policy, tuple(plan.declined))
    kernel, policy, declined = hit
    return Plan(op=op, problem=problem, kernel=kernel, policy=policy, declined=list(declined))


def _choose(op: str, problem: Any) -> Plan:
    """Walk op's table; the first kernel whose supports() returns None wins."""
    forced = forced_kernel()
    table = _TABLE[op]
    if forced is not None and forced not in {n for n, _ in table}:
        raise errors.KernelUnavailableError(
            f"{op}: forced kernel {forced!r} (XGEMM_KERNEL or policy.force) is not one of "
            f"{kernel_names(op)}; pick one of those or unset the override")
    declined: List[Tuple[str, str]] = []
    for name, target in table:
        if forced is not None and name != forced:
            continue
        kernel = load(target)
        reason = _load_reason(target) if kernel is None else kernel.supports(problem)
        if reason is None:
            return Plan(op=op, problem=problem, kernel=kernel, policy=kernel.policy(problem), declined=declined)
        if forced is not None:
            raise errors.KernelUnavailableError(
                f"{op}: forced kernel {forced!r} declines {problem.summary()}: {reason}; "
                f"lift the override (unset XGEMM_KERNEL) or change the problem")
        declined.append((name, reason))
    raise AssertionError(f"{op}: the reference kernel must accept every problem; declined: {declined}")
