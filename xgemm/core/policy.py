"""Choosing a kernel: walk the op's table (core/registry.py), first kernel that accepts wins.

A kernel is any object with (kernels/_common.py lists the whole protocol)
    name: str, ops: tuple of op names
    supports(problem) -> None | str      None accepts; a string is the reason it declines
    policy(problem) -> Policy            tile/stages/cluster/... for this problem
    run(problem, policy, operands, out, stream) -> None
Nothing is imported until a problem asks (import xgemm stays light). The embedded default
(kernels/reference.py) is last and accepts every problem, so a problem no GPU kernel takes
still gets a right answer.

A policy override forces one kernel by name: `with xgemm.policy.force("cute_mma_sm80"): ...`
or the environment variable XGEMM_KERNEL=cute_mma_sm80. A forced kernel that declines raises.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

from xgemm import errors
from xgemm.core import registry
from xgemm.core.problem import Policy

T = TypeVar("T")

# op -> [(kernel name, target)], most preferred first; reference is always last. A target is a
# registry module name, or "module:attribute" for a kernel registered at run time (register()).
_table: Dict[str, List[Tuple[str, str]]] = {op: [(n, n) for n in names] for op, names in registry.TABLE.items()}
_loaded: Dict[Tuple[str, str], Any] = {}
_forced: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("xgemm_forced_kernel", default=None)
_on_change: List[Callable[[], None]] = []


@dataclass
class Plan:
    """Everything explain() reports: the problem, the chosen kernel and policy, and why others declined."""
    op: str
    problem: Any
    kernel: Any
    policy: Policy
    declined: List[Tuple[str, str]] = field(default_factory=list)
    copies: List[str] = field(default_factory=list)
    epilogue: str = ""              # bias / activation / gating after the product, and where it runs

    @property
    def kernel_name(self) -> str:
        return self.kernel.name

    def padded_from(self, unpadded: "Plan", copies: List[str]) -> "Plan":
        """This plan of a padded problem, reported as the plan of `unpadded` (which every GPU kernel
        declined): their declines together, and the copies padding makes."""
        self.declined = list(unpadded.declined) + [(f"{d} (padded problem)", why) for d, why in self.declined]
        self.copies = list(copies)
        return self

    def __str__(self) -> str:
        lines = [f"{self.problem.summary()}",
                 f"  kernel: {self.kernel.name}  policy: {self.policy.summary()}"]
        for name, reason in self.declined:
            lines.append(f"  declined {name}: {reason}")
        lines.extend(f"  copy: {c}" for c in self.copies) if self.copies else lines.append("  copies: none (zero-copy)")
        if self.epilogue:
            lines.append(f"  epilogue: {self.epilogue}")
        return "\n".join(lines)


def kernel_names(op: str) -> List[str]:
    return [name for name, _ in _table[op]]


def on_change(callback: Callable[[], None]) -> None:
    """Call `callback` whenever the table changes (caches of chosen kernels drop their entries)."""
    _on_change.append(callback)


def _changed() -> None:
    _plans.clear()
    for callback in _on_change:
        callback()


def register(op: str, name: str, target: str, *, before: Optional[str] = None) -> None:
    """Add a kernel ("module:attribute") to op's table, ahead of `before` (default: ahead of reference)."""
    table = _table.setdefault(op, [])
    table[:] = [(n, t) for n, t in table if n != name]
    anchor = before or "reference"
    index = next((i for i, (n, _) in enumerate(table) if n == anchor), len(table))
    table.insert(index, (name, target))
    _loaded.pop((op, target), None)
    _changed()


@contextlib.contextmanager
def snapshot() -> Iterator[None]:
    """Restore the tables as they were when the block ends (tests that register kernels)."""
    saved = {op: list(t) for op, t in _table.items()}
    try:
        yield
    finally:
        _table.clear()
        _table.update(saved)
        _loaded.clear()
        _changed()


def load(op: str, target: str) -> Optional[Any]:
    """Import a kernel lazily; a kernel whose module is absent or fails to import is None (declines)."""
    key = (op, target)
    if key not in _loaded:
        try:
            if ":" in target:
                module_name, _, attr = target.partition(":")
                _loaded[key] = getattr(importlib.import_module(module_name), attr)
            else:
                _loaded[key] = registry.kernel(target, op)
        except (ImportError, AttributeError, LookupError) as exc:   # not in this install, or its compiler missing
            _loaded[key] = exc
    value = _loaded[key]
    return None if isinstance(value, Exception) else value


def reference(op: str) -> Any:
    """The op's embedded default: the last kernel of its table."""
    return load(op, _table[op][-1][1])


def _load_reason(op: str, target: str) -> str:
    value = _loaded.get((op, target))
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


def forced_only_reference(op: str, where: str) -> None:
    """Where only the reference can run a call (XLA's own op in a JAX lowering for a CPU): a forced
    kernel other than the reference raises, as choose() raises for one that declines."""
    forced = forced_kernel()
    if forced is None or forced == "reference":
        return
    if forced not in kernel_names(op):
        raise errors.KernelUnavailableError(
            f"{op}: forced kernel {forced!r} (XGEMM_KERNEL or policy.force) is not one of {kernel_names(op)}; "
            f"pick one of those or unset the override")
    raise errors.KernelUnavailableError(
        f"{op}: forced kernel {forced!r} cannot run on {where}, where only the reference (XLA's own op) runs; "
        f"lift the override (unset XGEMM_KERNEL) or run on a Hopper GPU")


_plans: Dict[tuple, tuple] = {}
_PLAN_CACHE_SIZE = 4096


def clear_plans() -> None:
    """Drop the cached plans: after a switch that supports() or policy() reads has changed
    (docs/development.md), the next call of each problem plans again."""
    _plans.clear()


# (op, kernel name, problem) -> why that kernel declines the problem from now on: its compiler
# died building the binary it needs (errors.KernelBuildError, attempt())
_unbuildable: Dict[tuple, str] = {}


def attempt(plan: Plan, use: Callable[[Plan], T]) -> Tuple[Plan, T]:
    """(the plan used, use(plan)): a launch or a JAX lowering of the chosen plan. Where its kernel
    cannot build the binary the problem needs (errors.KernelBuildError), that kernel declines the
    problem for the rest of the process (explain() says why) and the next plan of the table is
    used. The error reaches the caller where nothing else may run the problem: a forced kernel, or
    a fused epilogue that only the reference would be left for (the caller composes it then)."""
    while True:
        try:
            return plan, use(plan)
        except errors.KernelBuildError as exc:
            if forced_kernel() is not None or plan.kernel.name == "reference":
                raise
            _unbuildable[(plan.op, plan.kernel.name, plan.problem)] = f"its binary could not be built here: {exc}"
            _plans.pop((plan.op, plan.problem, None), None)
            nxt = choose(plan.op, plan.problem)
            if nxt.kernel.name == "reference" and getattr(plan.problem, "fused", False):
                raise
            nxt.copies = list(plan.copies)
            plan = nxt


def built_or_none(call: Callable[[], T]) -> Optional[T]:
    """call() (a launch or a lowering through attempt()), or None where attempt() let an
    errors.KernelBuildError through with no kernel forced: a fused epilogue or an FP8 product that
    only the reference is left for, which the caller composes (or gives the embedded default)."""
    try:
        return call()
    except errors.KernelBuildError:
        if forced_kernel() is not None:
            raise
        return None


def choose(op: str, problem: Any) -> Plan:
    """The cached choice for this exact problem, or a fresh walk of the table."""
    # register() and snapshot() clear _plans
    key = (op, problem, forced_kernel())
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
    table = _table[op]
    if forced is not None and forced not in {n for n, _ in table}:
        raise errors.KernelUnavailableError(
            f"{op}: forced kernel {forced!r} (XGEMM_KERNEL or policy.force) is not one of "
            f"{kernel_names(op)}; pick one of those or unset the override")
    declined: List[Tuple[str, str]] = []
    for name, target in table:
        if forced is not None and name != forced:
            continue
        kernel = load(op, target)
        if kernel is None:
            reason = _load_reason(op, target)
        elif (op, name, problem) in _unbuildable:
            reason = _unbuildable[(op, name, problem)]
        elif getattr(problem, "fused", False) and not getattr(kernel, "fuses_epilogue", False) \
                and name != "reference":
            # the reference stays the last resort: a plan that names it means "compose instead"
            reason = "fuses no bias / activation epilogue"
        else:
            reason = kernel.supports(problem)
        if reason is None:
            return Plan(op=op, problem=problem, kernel=kernel, policy=kernel.policy(problem), declined=declined)
        if forced is not None:
            raise errors.KernelUnavailableError(
                f"{op}: forced kernel {forced!r} declines {problem.summary()}: {reason}; "
                f"lift the override (unset XGEMM_KERNEL) or change the problem")
        declined.append((name, reason))
    raise AssertionError(f"{op}: the reference kernel must accept every problem; declined: {declined}")
