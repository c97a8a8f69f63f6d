"""Choosing a kernel for an op, per (device, dtype, compute capability), and explaining the choice.

Selection, strongest first:

1. ``backend=`` passed to the call -- strict: if it cannot run, raise with its reasons;
2. ``with ebmcore.use_backend("cuda", "torch"):``;
3. the environment variable ``EBM_BACKEND`` (``torch`` or ``cuda,torch``), read live;
4. ``backend = [...]`` in the configuration file;
5. automatic: the highest-priority kernel that can run.

A selection (1-4) is a list of backend names in order of preference and is
honoured strictly: only those backends are candidates, and if none can run,
:class:`BackendUnavailableError` lists why. To allow a fallback, name it:
``EBM_BACKEND=cuda,torch``. Choices are cached per
(op, device, dtype, selection); resolve once before a hot loop and keep
``kernel.fn``.
"""

from __future__ import annotations

import contextvars
import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import torch

from ebmcore import plugins
from ebmcore.config import get_config, parse_backend_list
from ebmcore.errors import BackendUnavailableError, PluginError, UnknownComponentError
from ebmcore.kernels.base import Kernel, KernelBackend

if TYPE_CHECKING:
    from ebmcore.kernels.fused import FusedOp

__all__ = [
    "Candidate",
    "Explanation",
    "use_backend",
    "resolve_kernel",
    "explain",
    "dispatch",
    "clear_cache",
    "selection",
    "fused_ops",
    "fused_op",
]

_selected: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("ebm_backend", default=None)


@dataclass(frozen=True)
class Candidate:
    """One backend's kernel for an op, and whether (and why not) it was chosen."""

    backend: str
    priority: int
    chosen: bool
    reason: str


@dataclass(frozen=True)
class Explanation:
    """Every candidate kernel for ``op`` on given inputs, in the order they were considered."""

    op: str
    device: torch.device
    dtype: torch.dtype
    capability: tuple[int, int] | None
    selection: tuple[str, ...] | None
    selection_source: str
    candidates: tuple[Candidate, ...]

    @property
    def chosen(self) -> Candidate | None:
        return next((c for c in self.candidates if c.chosen), None)

    def __str__(self) -> str:
        cap = "" if self.capability is None else f", compute capability {self.capability[0]}.{self.capability[1]}"
        dtype = str(self.dtype).removeprefix("torch.")
        head = f"op {self.op} on {self.device} ({dtype}{cap}); selection: {self.selection_source}"
        rows = [
            f"  {'CHOSEN' if c.chosen else 'no':6}  {c.backend:<14} priority {c.priority:>4}  {c.reason}" for c in self.candidates
        ]
        return "\n".join([head, *rows])


@contextmanager
def use_backend(*names: str) -> Iterator[None]:
    """Within the block, allow only these kernel backends, in this order of preference.

    ``with ebmcore.use_backend("torch"):`` forces the reference path;
    ``use_backend("cuda", "torch")`` prefers CUDA and falls back to torch.
    """
    selection = parse_backend_list(list(names), "ebmcore.use_backend()")
    token = _selected.set(selection)
    try:
        yield
    finally:
        _selected.reset(token)


def _selection(backend: str | tuple[str, ...] | list[str] | None) -> tuple[tuple[str, ...] | None, str]:
    if backend is not None:
        return parse_backend_list(backend, "backend= argument"), f"backend={backend!r} (strict)"
    ctx = _selected.get()
    if ctx is not None:
        return ctx, f"use_backend({', '.join(map(repr, ctx))})"
    env = os.environ.get("EBM_BACKEND", "").strip()
    if env:
        return parse_backend_list(env, "environment variable EBM_BACKEND"), f"EBM_BACKEND={env}"
    config = get_config()
    if config.backend:
        return config.backend, f"backend = {list(config.backend)} in {config.source}"
    return None, "automatic (highest priority that can run)"


def selection(backend: str | tuple[str, ...] | list[str] | None = None) -> tuple[str, ...] | None:
    """The backends the resolver would allow now, in order (None: any, by priority): ``backend`` (an energy's), else
    :func:`use_backend`'s, ``EBM_BACKEND`` or the configuration's. For callers that cache what they resolved."""
    return _selection(backend)[0]


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def _backends_for(op: str) -> tuple[list[KernelBackend], list[Candidate]]:
    """Backends that implement ``op``, and a row for each backend name left out by a clash."""
    table = plugins.session().table
    found = [e.component for e in table.entries("kernel") if op in e.component.kernels]
    clashes = [
        Candidate(
            name,
            0,
            False,
            "left out: registered by several plugins (" + ", ".join(e.plugin for e in entries) + "); see `ebm plugins`",
        )
        for kind, name, entries in table.conflicts()
        if kind == "kernel" and any(op in e.component.kernels for e in entries)
    ]
    if not found and not clashes:
        ops = sorted({o for e in table.entries("kernel") for o in e.component.kernels})
        raise UnknownComponentError(f"no kernel backend implements op {op!r}. Known ops: {', '.join(ops)}.")
    return found, clashes


def _explain(op: str, device: torch.device, dtype: torch.dtype, backend: Any) -> Explanation:
    selection, source = _selection(backend)
    capability = _capability(device)
    backends, clashes = _backends_for(op)
    by_name = {b.name: b for b in backends}
    candidates: list[Candidate] = []
    if selection is not None:
        session = plugins.session()
        for name in selection:
            if name not in by_name and name not in {c.backend for c in clashes}:
                session.table.get("kernel", name, session.failure_summary())  # unknown backend: raises with the install hint
                candidates.append(Candidate(name, 0, False, f"selected, but backend '{name}' has no kernel for {op}"))
        ordered = [by_name[n] for n in selection if n in by_name]
        ordered += sorted((b for b in backends if b.name not in selection), key=lambda b: b.name)
    else:
        ordered = sorted(backends, key=lambda b: (-b.kernels[op].priority, b.name))
    chosen: str | None = None
    for b in ordered:
        kernel = b.kernels[op]
        if selection is not None and b.name not in selection:
            reason = f"not in the backend selection {list(selection)}"
        else:
            reason = b.unavailable_reason() or kernel.mismatch(device, dtype, capability) or ""
            if reason:
                reason = f"cannot run: {reason}"
            elif chosen is None:
                chosen = b.name
                reason = "can run; first runnable in the selection" if selection is not None else "can run; highest priority"
            else:
                reason = f"can run; {chosen} comes first"
        candidates.append(Candidate(b.name, kernel.priority, b.name == chosen, reason))
    candidates += clashes
    return Explanation(op, device, dtype, capability, selection, source, tuple(candidates))


def _where(inputs: tuple[Any, ...], device: Any, dtype: Any) -> tuple[torch.device, torch.dtype]:
    tensor = next((t for t in inputs if isinstance(t, torch.Tensor)), None)
    if tensor is None and (device is None or dtype is None):
        raise TypeError("explain()/dispatch() needs a tensor input, or both device= and dtype=.")
    return torch.device(device) if device is not None else tensor.device, dtype or tensor.dtype  # type: ignore[union-attr]


def explain(op: str, *inputs: Any, device: Any = None, dtype: torch.dtype | None = None, backend: Any = None) -> Explanation:
    """Every candidate kernel for ``op`` on these inputs (or ``device``/``dtype``), chosen or not, and why."""
    dev, dt = _where(inputs, device, dtype)
    return _explain(op, dev, dt, backend)


def resolve_kernel(op: str, device: torch.device, dtype: torch.dtype, backend: Any = None) -> Kernel:
    """The kernel that runs ``op`` for inputs on ``device`` with ``dtype``; cached.

    Raises :class:`BackendUnavailableError` (listing each candidate's reason)
    if no allowed kernel can run.
    """
    selection, _ = _selection(backend)
    key = (op, device, dtype, selection)
    session = plugins.session()
    kernel = session.kernel_cache.get(key)
    if kernel is not None:
        return kernel
    why = _explain(op, device, dtype, backend)
    if why.chosen is None:
        fix = (
            "pass a backend that can run, widen the selection (e.g. EBM_BACKEND=cuda,torch), or move the inputs"
            if selection is not None
            else "move the inputs to a supported device or dtype"
        )
        raise BackendUnavailableError(f"no kernel can run this op.\n{why}\nFix: {fix}.")
    kernel = session.table.get("kernel", why.chosen.backend).component.kernels[op]
    _check_conformance(op, kernel)
    session.kernel_cache[key] = kernel
    return kernel


_OPS = ("fused ops",)  # where the session's kernel cache keeps the registered ops, cleared with it


def fused_ops() -> tuple[FusedOp, ...]:
    """The fused ops the installed plugins registered (``ebm_register_ops``), the core's among them."""
    cache = plugins.session().kernel_cache
    ops = cache.get(_OPS)
    if ops is None:
        ops = cache[_OPS] = tuple(entry.component for entry in plugins.session().table.entries("op"))
    return ops


def fused_op(family: str, program: type | None) -> FusedOp | None:
    """The registered op that runs ``family`` on programs of type ``program``, or None."""
    return next((op for op in fused_ops() if op.family == family and op.program is program), None)


def _check_conformance(op: str, kernel: Kernel) -> None:
    """A kernel for a registered fused op must take the op's parameters (its reference's signature): checked when it is
    first resolved; a mismatch is the backend's error, said as such."""
    from ebmcore.kernels.fused import op_of_kernel  # the ops' references read the energy programs, which resolve kernels

    definition = op_of_kernel(op, fused_ops())
    why = definition.conformance(kernel.fn) if definition is not None else None
    if why:
        raise PluginError(
            f"backend '{kernel.backend}': its kernel for op '{op}' ({getattr(kernel.fn, '__qualname__', kernel.fn)}) does "
            f"not take the op's parameters {definition.signature}: it {why}. Fix the backend, or select another "
            "(EBM_BACKEND)."
        )


def dispatch(op: str, *args: Any, backend: Any = None, **kwargs: Any) -> Any:
    """Run ``op`` with the kernel chosen for its first tensor argument's device and dtype."""
    dev, dt = _where(args, None, None)
    return resolve_kernel(op, dev, dt, backend).fn(*args, **kwargs)


def clear_cache() -> None:
    """Forget the cached choices (a new plugin session, after a reload, starts without any)."""
    plugins.session().kernel_cache.clear()
