"""The native ops, one row each (:class:`NativeOp`): the C function and its ctypes arguments, the ``torch.ops.ebm_cuda``
op with its implementation and fake, and the kernel a backend registers for it. Each op module declares its rows next
to its implementation (:func:`define`); :mod:`ebm_cuda.library` sets the C functions' argument types from the rows
(:func:`table`), and :mod:`ebm_cuda.backends` registers their kernels (:func:`kernels`). ``tests/test_native_table.py``
holds every row to the C declarations it names and its fake to its implementation.

An op defined here runs ``impl`` for CPU and CUDA tensors (``impl`` picks the build by the inputs' device). Defined
with the low-level ``torch.library.Library``, a call through :func:`call` costs about 8 µs more than the
implementation called directly, where ``torch.library.custom_op``'s wrapper costs about 17 µs
(``benchmarks/op_dispatch.py``); every call, eager or traced, goes through the op.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ebmcore.kernels.base import Kernel

__all__ = ["NativeOp", "define", "table", "kernels", "call", "OP_MODULES"]

BUILDS = ("host", "cuda")
"""The builds a C function can be exported by: ``host.cpp`` (``ebm_host_*``) and ``kernels.cu`` (``ebm_cuda_*``)."""

OP_MODULES = (
    "ebm_cuda.analytic_ops",
    "ebm_cuda.feedforward_ops",
    "ebm_cuda.contrastive_op",
    "ebm_cuda.conv_ops",
    "ebm_cuda.philox",
    "ebm_cuda.triton_chains",
    "ebm_cuda.triton_contrastive",
)
"""The modules that declare rows; :func:`table` imports them all."""


@dataclass(frozen=True)
class NativeOp:
    """One native op. ``name``: the op ``torch.ops.ebm_cuda.<name>`` (or, with no ``impl``, the C function's own name).
    ``symbol``: the C function ``ebm_<build>_<symbol>`` of each of ``builds`` (None: no C function, a Triton op);
    ``argtypes``: its ctypes arguments, less the last one of the builds in ``execution`` (the thread count on the
    host, the stream on CUDA). ``impl``, ``fake``: the op's implementation (its annotations give the schema;
    ``mutates_args``: the arguments it writes into) and its fake (same parameters); None for a C function no op wraps.
    ``kernel``: what the backend named ``backend`` registers for it (its devices, dtypes and refusal), if any."""

    name: str
    impl: Optional[Callable[..., Any]] = None
    fake: Optional[Callable[..., Any]] = None
    symbol: Optional[str] = None
    argtypes: tuple[Any, ...] = ()
    builds: tuple[str, ...] = BUILDS
    execution: tuple[str, ...] = BUILDS
    mutates_args: tuple[str, ...] = ()
    backend: Optional[str] = None
    kernel: Optional[Kernel] = None


_TABLE: dict[str, NativeOp] = {}
_LIBRARY = torch.library.Library("ebm_cuda", "DEF")
_OPS: dict[str, torch._ops.OpOverload] = {}


def define(row: NativeOp) -> Optional[torch._ops.OpOverload]:
    """Add ``row`` to the table and define its op (if it has an ``impl``): returns ``torch.ops.ebm_cuda.<name>``."""
    if row.name in _TABLE:
        raise RuntimeError(f"ebm_cuda: the native op {row.name} is defined twice")
    _TABLE[row.name] = row
    if row.impl is None:
        return None
    _LIBRARY.define(row.name + torch.library.infer_schema(row.impl, mutates_args=row.mutates_args))
    for key in ("CPU", "CUDA"):
        _LIBRARY.impl(row.name, row.impl, key)
    if row.fake is not None:
        torch.library.register_fake(f"ebm_cuda::{row.name}", row.fake, lib=_LIBRARY)
    _OPS[row.name] = getattr(torch.ops.ebm_cuda, row.name).default
    return _OPS[row.name]


def table() -> dict[str, NativeOp]:
    """Every row, by name (the modules of :data:`OP_MODULES` imported first)."""
    for module in OP_MODULES:
        importlib.import_module(module)
    return dict(_TABLE)


def kernels(backend: str) -> list[Kernel]:
    """The kernels the rows give the backend ``backend``."""
    return [row.kernel for row in table().values() if row.backend == backend and row.kernel is not None]


def call(name: str, *args: Any) -> Any:
    """Run ``torch.ops.ebm_cuda.<name>`` (eager or under ``torch.compile``, which sees its fake implementation), with
    grad mode off: the ops have no autograd formula, and a network's weights (parameters) among the inputs must not
    make the states they return require grad (the energy and gradient kernels run the torch reference instead where
    a graph is needed)."""
    with torch.no_grad():
        return _OPS[name](*args)
